//! The access log (`telemetry.access_log`): one line per request, written
//! when its response has streamed to the end (or the client left), in JSON
//! or the common log format. A writer thread owns the output; a request
//! only hands it a line through a bounded queue, and a line that finds the
//! queue full is dropped and counted, so a stuck stdout never holds a
//! request. Off, it costs nothing: the gateway keeps no log and wraps no
//! body.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::body::Body;
use http::Request;

use crate::config::{AccessLogConfig, AccessLogFormat, AccessLogTo};

/// Lines waiting for the writer at most; more are dropped.
const QUEUE: usize = 16 * 1024;

/// Lines dropped because the writer fell behind.
pub(crate) const DROPPED: &str = "rolegate_access_log_dropped_total";

/// Where request lines go.
#[derive(Clone)]
pub(crate) struct AccessLog {
    format: AccessLogFormat,
    lines: SyncSender<String>,
}

impl AccessLog {
    /// Starts the writer thread for `config`.
    pub(crate) fn start(config: &AccessLogConfig) -> std::io::Result<Self> {
        metrics::describe_counter!(
            DROPPED,
            "access log lines dropped because the writer fell behind"
        );
        let (lines, queue) = sync_channel(QUEUE);
        let to = config.to;
        std::thread::Builder::new()
            .name("rolegate-access-log".into())
            .spawn(move || write_lines(&queue, to))?;
        Ok(Self {
            format: config.format,
            lines,
        })
    }

    /// What is known of `req` before it is answered.
    pub(crate) fn begin(
        &self,
        req: &Request<Body>,
        client: SocketAddr,
        route: Option<Arc<str>>,
    ) -> Entry {
        Entry {
            log: self.clone(),
            at: SystemTime::now(),
            started: Instant::now(),
            method: req.method().clone(),
            target: req
                .uri()
                .path_and_query()
                .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string()),
            version: req.version(),
            route,
            trace_id: trace_id(req.headers()),
            client,
            decision: "",
            status: 0,
            bytes: 0,
        }
    }

    fn emit(&self, line: String) {
        match self.lines.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                metrics::counter!(DROPPED).increment(1);
            }
        }
    }
}

/// Drains the queue into `to`, flushing whenever it runs empty. A write
/// that fails (a closed stdout) loses the line, never the process.
fn write_lines(queue: &Receiver<String>, to: AccessLogTo) {
    let mut out: Box<dyn Write> = match to {
        AccessLogTo::Stdout => Box::new(std::io::BufWriter::new(std::io::stdout())),
        AccessLogTo::Stderr => Box::new(std::io::BufWriter::new(std::io::stderr())),
    };
    while let Ok(line) = queue.recv() {
        let _ = out.write_all(line.as_bytes());
        while let Ok(line) = queue.try_recv() {
            let _ = out.write_all(line.as_bytes());
        }
        let _ = out.flush();
    }
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`).
fn trace_id(headers: &http::HeaderMap) -> Option<String> {
    let v = headers.get("traceparent")?.to_str().ok()?;
    let mut parts = v.trim().split('-');
    let (_, id) = (parts.next()?, parts.next()?);
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && id.bytes().any(|b| b != b'0'))
        .then(|| id.to_ascii_lowercase())
}

/// One request on its way to a line.
pub(crate) struct Entry {
    log: AccessLog,
    at: SystemTime,
    started: Instant,
    method: http::Method,
    target: String,
    version: http::Version,
    route: Option<Arc<str>>,
    trace_id: Option<String>,
    client: SocketAddr,
    decision: &'static str,
    status: u16,
    bytes: u64,
}

impl Entry {
    /// Logs `resp` once its body has streamed (at once if it has none).
    pub(crate) fn finish(
        mut self,
        decision: &'static str,
        resp: http::Response<Body>,
    ) -> http::Response<Body> {
        self.decision = decision;
        self.status = resp.status().as_u16();
        super::watched::watch(resp, self)
    }

    fn line(&self) -> String {
        let ms = self.started.elapsed().as_secs_f64() * 1000.0;
        match self.log.format {
            AccessLogFormat::Json => {
                let mut line = serde_json::json!({
                    "time": humantime::format_rfc3339_millis(self.at).to_string(),
                    "method": self.method.as_str(),
                    "path": self.target,
                    "route": self.route.as_deref(),
                    "decision": self.decision,
                    "status": self.status,
                    "duration_ms": (ms * 1000.0).round() / 1000.0,
                    "bytes": self.bytes,
                    "trace_id": self.trace_id,
                    "client": self.client.to_string(),
                })
                .to_string();
                line.push('\n');
                line
            }
            AccessLogFormat::Common => {
                // `[06/Dec/2026:03:40:00 +0000]` from `Sun, 06 Dec 2026 03:40:00 GMT`.
                let date = httpdate::fmt_http_date(self.at);
                let w: Vec<&str> = date.split(' ').collect();
                let when = match w.as_slice() {
                    [_, d, m, y, t, _] => format!("{d}/{m}/{y}:{t} +0000"),
                    _ => date.clone(),
                };
                format!(
                    "{ip} - - [{when}] \"{method} {target} {version:?}\" {status} {bytes} \"{route}\" {decision} {ms:.3} {trace}\n",
                    ip = self.client.ip(),
                    method = self.method,
                    target = clf_escape(&self.target),
                    version = self.version,
                    status = self.status,
                    bytes = self.bytes,
                    route = clf_escape(self.route.as_deref().unwrap_or("-")),
                    decision = self.decision,
                    trace = self.trace_id.as_deref().unwrap_or("-"),
                )
            }
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let line = self.line();
        self.log.emit(line);
    }
}

/// Quotes and control bytes of a request target, escaped as nginx does.
fn clf_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

impl super::watched::Watcher for Entry {
    fn data(&mut self, n: usize) {
        self.bytes += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_gives_its_trace_id_and_nothing_else_does() {
        let mut h = http::HeaderMap::new();
        assert_eq!(trace_id(&h), None);
        h.insert(
            "traceparent",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        assert_eq!(
            trace_id(&h).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        h.insert("traceparent", "00-xyz-00f067aa0ba902b7-01".parse().unwrap());
        assert_eq!(trace_id(&h), None);
    }

    #[test]
    fn targets_are_escaped_in_the_common_format() {
        assert_eq!(clf_escape("/a\"b\\c\u{1}"), "/a\\\"b\\\\c\\x01");
    }
}
