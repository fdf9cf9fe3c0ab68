//! openloop: a fixed-rate (open-loop) HTTP/1.1 keep-alive load generator.
//!
//! Request `i` is *due* at `t0 + i / rate`, whatever happened to earlier
//! requests; a pool of `--connections` keep-alive connections (one thread
//! each, one request in flight per connection) takes the due requests in
//! order. Latency is measured from the due time to the last body byte, so a
//! stall in the server shows up in the percentiles instead of silently
//! lowering the offered rate (no coordinated omission, as in wrk2).
//!
//! Std only, so it builds in seconds. Output: one JSON object on stdout.
//!
//! ```text
//! openloop --url http://127.0.0.1:8080/r/1k --rate 2000 --duration 5 \
//!          [--warmup 1] [--connections 64] [--header 'K: V']...
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Config {
    addr: SocketAddr,
    request: Vec<u8>,
    rate: f64,
    duration: Duration,
    warmup: Duration,
    connections: usize,
}

#[derive(Default)]
struct Stats {
    latency_ns: Vec<u64>,
    service_ns: Vec<u64>,
    late_ns: Vec<u64>,
    ok: u64,
    non2xx: u64,
    errors: u64,
    bytes: u64,
}

fn usage() -> ! {
    eprintln!(
        "usage: openloop --url http://HOST:PORT/PATH --rate N --duration SECS \
         [--warmup SECS] [--connections N] [--header 'K: V']..."
    );
    std::process::exit(2);
}

fn parse_args() -> Config {
    let mut url = None;
    let mut rate = None;
    let mut duration = 5.0f64;
    let mut warmup = 1.0f64;
    let mut connections = 64usize;
    let mut headers = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--url" => url = Some(val()),
            "--rate" => rate = Some(val().parse::<f64>().unwrap_or_else(|_| usage())),
            "--duration" => duration = val().parse().unwrap_or_else(|_| usage()),
            "--warmup" => warmup = val().parse().unwrap_or_else(|_| usage()),
            "--connections" => connections = val().parse().unwrap_or_else(|_| usage()),
            "--header" => headers.push(val()),
            _ => usage(),
        }
    }
    let url = url.unwrap_or_else(|| usage());
    let rate = rate.unwrap_or_else(|| usage());
    let rest = url.strip_prefix("http://").unwrap_or_else(|| usage());
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = hostport
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| usage());
    let mut request =
        format!("GET {path} HTTP/1.1\r\nHost: {hostport}\r\nUser-Agent: openloop\r\n");
    for h in headers {
        request.push_str(&h);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    if rate <= 0.0 || duration <= 0.0 || connections == 0 {
        usage();
    }
    Config {
        addr,
        request: request.into_bytes(),
        rate,
        duration: Duration::from_secs_f64(duration),
        warmup: Duration::from_secs_f64(warmup),
        connections,
    }
}

/// One keep-alive connection with a read buffer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    len: usize,
}

impl Conn {
    fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        Ok(Conn {
            stream,
            buf: vec![0; 256 * 1024],
            len: 0,
        })
    }

    fn fill(&mut self) -> std::io::Result<()> {
        if self.len == self.buf.len() {
            let n = self.buf.len();
            self.buf.resize(n * 2, 0);
        }
        let n = self.stream.read(&mut self.buf[self.len..])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        self.len += n;
        Ok(())
    }

    fn consume(&mut self, n: usize) {
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
    }

    /// Reads one CRLF-terminated line from the buffer (refilling as needed).
    fn line(&mut self) -> std::io::Result<String> {
        loop {
            if let Some(p) = find(&self.buf[..self.len], b"\r\n") {
                let s = String::from_utf8_lossy(&self.buf[..p]).into_owned();
                self.consume(p + 2);
                return Ok(s);
            }
            self.fill()?;
        }
    }

    fn skip(&mut self, mut n: usize) -> std::io::Result<()> {
        while n > 0 {
            if self.len == 0 {
                self.fill()?;
            }
            let take = n.min(self.len);
            self.consume(take);
            n -= take;
        }
        Ok(())
    }

    /// Sends the request and reads the whole response. Returns (status,
    /// body bytes, keep-alive).
    fn exchange(&mut self, request: &[u8]) -> std::io::Result<(u16, u64, bool)> {
        self.stream.write_all(request)?;
        let status_line = self.line()?;
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad status line"))?;
        let mut content_length = None;
        let mut chunked = false;
        let mut keep_alive = true;
        loop {
            let h = self.line()?;
            if h.is_empty() {
                break;
            }
            let Some((k, v)) = h.split_once(':') else {
                continue;
            };
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-length") {
                content_length = v.parse::<u64>().ok();
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                chunked = v.to_ascii_lowercase().contains("chunked");
            } else if k.eq_ignore_ascii_case("connection") {
                keep_alive = !v.eq_ignore_ascii_case("close");
            }
        }
        let mut body = 0u64;
        if chunked {
            loop {
                let size_line = self.line()?;
                let size = u64::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                    .map_err(|_| bad("bad chunk size"))?;
                if size == 0 {
                    // Trailers, then the empty line.
                    while !self.line()?.is_empty() {}
                    break;
                }
                self.skip(size as usize)?;
                self.line()?;
                body += size;
            }
        } else if let Some(n) = content_length {
            self.skip(n as usize)?;
            body = n;
        } else if status != 204 && status != 304 {
            return Err(bad("response without length"));
        }
        Ok((status, body, keep_alive))
    }
}

fn bad(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

extern "C" {
    fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
}

/// Lowers this thread's timer slack (default 50 µs) to 1 µs so sleeps end
/// close to the due time. Best effort; Linux only.
fn tight_timer_slack() {
    const PR_SET_TIMERSLACK: i32 = 29;
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack.
    unsafe {
        prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0);
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64 / 1000.0
}

fn main() {
    let cfg = Arc::new(parse_args());
    let next = Arc::new(AtomicU64::new(0));
    // Connect everything first, then start the clock.
    let mut conns = Vec::new();
    for _ in 0..cfg.connections {
        conns.push(Conn::open(cfg.addr).ok());
    }
    let t0 = Instant::now() + Duration::from_millis(50);
    let measure_from = t0 + cfg.warmup;
    let end = measure_from + cfg.duration;
    // Requests still unsent this long after `end` are abandoned (the rate is
    // beyond what the server sustains); they are reported as `unsent`.
    let hard_stop = end + Duration::from_secs(2);
    let mut handles = Vec::new();
    for conn in conns {
        let cfg = cfg.clone();
        let next = next.clone();
        handles.push(std::thread::spawn(move || {
            tight_timer_slack();
            let mut conn = conn;
            let mut st = Stats::default();
            let per = 1e9 / cfg.rate;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let due = t0 + Duration::from_nanos((i as f64 * per) as u64);
                if due >= end {
                    break;
                }
                let now = Instant::now();
                if now > hard_stop {
                    break;
                }
                if due > now {
                    std::thread::sleep(due - now);
                }
                let sent = Instant::now();
                if conn.is_none() {
                    conn = Conn::open(cfg.addr).ok();
                }
                let result = match conn.as_mut() {
                    Some(c) => c.exchange(&cfg.request),
                    None => Err(bad("connect failed")),
                };
                let done = Instant::now();
                match result {
                    Ok((status, body, keep)) => {
                        if due >= measure_from {
                            st.latency_ns.push((done - due).as_nanos() as u64);
                            st.service_ns.push((done - sent).as_nanos() as u64);
                            st.late_ns.push((sent.max(due) - due).as_nanos() as u64);
                            if (200..300).contains(&status) {
                                st.ok += 1;
                            } else {
                                st.non2xx += 1;
                            }
                            st.bytes += body;
                        }
                        if !keep {
                            conn = None;
                        }
                    }
                    Err(_) => {
                        if due >= measure_from {
                            st.errors += 1;
                        }
                        conn = None;
                    }
                }
            }
            st
        }));
    }
    let mut all = Stats::default();
    for h in handles {
        let st = h.join().unwrap_or_default();
        all.latency_ns.extend(st.latency_ns);
        all.service_ns.extend(st.service_ns);
        all.late_ns.extend(st.late_ns);
        all.ok += st.ok;
        all.non2xx += st.non2xx;
        all.errors += st.errors;
        all.bytes += st.bytes;
    }
    // Requests due inside the measured window, by the same formula the
    // workers use.
    let per = 1e9 / cfg.rate;
    let (from_ns, end_ns) = ((measure_from - t0).as_nanos() as u64, (end - t0).as_nanos() as u64);
    let mut scheduled = 0u64;
    let mut i = 0u64;
    loop {
        let due = (i as f64 * per) as u64;
        if due >= end_ns {
            break;
        }
        if due >= from_ns {
            scheduled += 1;
        }
        i += 1;
    }
    let done = all.ok + all.non2xx + all.errors;
    all.latency_ns.sort_unstable();
    all.service_ns.sort_unstable();
    all.late_ns.sort_unstable();
    let l = &all.latency_ns;
    println!(
        "{{\"rate\":{},\"duration_s\":{},\"connections\":{},\"scheduled\":{},\"completed\":{},\"unsent\":{},\
\"ok\":{},\"non2xx\":{},\"errors\":{},\"bytes\":{},\
\"p50_us\":{:.1},\"p90_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1},\"max_us\":{:.1},\
\"service_p50_us\":{:.1},\"service_p99_us\":{:.1},\"send_late_p50_us\":{:.1},\"send_late_p99_us\":{:.1}}}",
        cfg.rate,
        cfg.duration.as_secs_f64(),
        cfg.connections,
        scheduled,
        done,
        scheduled.saturating_sub(done),
        all.ok,
        all.non2xx,
        all.errors,
        all.bytes,
        percentile(l, 50.0),
        percentile(l, 90.0),
        percentile(l, 99.0),
        percentile(l, 99.9),
        l.last().map(|&v| v as f64 / 1000.0).unwrap_or(f64::NAN),
        percentile(&all.service_ns, 50.0),
        percentile(&all.service_ns, 99.0),
        percentile(&all.late_ns, 50.0),
        percentile(&all.late_ns, 99.0),
    );
}
