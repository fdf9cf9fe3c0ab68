//! The public listener's TLS: the server config (ALPN `h2`, `http/1.1`),
//! the certificate re-read when its files change (new handshakes get the new
//! pair, open connections keep theirs), and the handshake, run in the
//! connection's own task and bounded by the header read timeout so a silent
//! client holds neither the accept loop nor a slot for long.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::listener::HEADER_READ_TIMEOUT;
use crate::proxy::stack::ConnectionFacts;
use crate::shutdown::Shutdown;
use crate::telemetry;
use crate::tls::{certified_key, ClientAuth, PeersConfig, TlsConfig, TlsError};

/// How often the certificate files are looked at.
const RELOAD_POLL: Duration = Duration::from_secs(1);

const CERT_KEYS: (&str, &str) = ("tls.cert_file", "tls.key_file");

/// The listener's TLS state, shared by every connection.
pub(crate) struct ListenerTls {
    acceptor: TlsAcceptor,
    auth: ClientAuth,
}

impl ListenerTls {
    /// Reads the certificate, key and CA files (refusing a bad or
    /// mismatched pair) and starts watching the pair for changes. ALPN
    /// offers `h2` only when the listener serves HTTP/2.
    pub(crate) fn start(
        tls: &TlsConfig,
        peers: &PeersConfig,
        http2: bool,
    ) -> Result<Self, TlsError> {
        let files = CertFiles {
            cert: tls.cert_file.clone(),
            key: tls.key_file.clone(),
        };
        let stamp = files.stamp();
        let first = certified_key(CERT_KEYS, &files.cert, &files.key)?;
        let current = Arc::new(CurrentCert(ArcSwap::from_pointee(first)));
        let auth = ClientAuth::new(tls, peers)?;
        let builder = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Setup)?;
        let builder = match &auth.handshake {
            Some(verifier) => builder.with_client_cert_verifier(verifier.clone()),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(current.clone());
        config.alpn_protocols = if http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        tokio::spawn(watch(files, stamp, current));
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            auth,
        })
    }

    /// Completes the handshake within the header read timeout; `None` (logged
    /// at debug and counted) when it fails, times out, or a stop begins.
    pub(crate) async fn handshake(
        &self,
        stream: TcpStream,
        client: SocketAddr,
        stop: &mut Shutdown,
    ) -> Option<(TlsStream<TcpStream>, ConnectionFacts)> {
        let accepted = tokio::select! {
            r = tokio::time::timeout(HEADER_READ_TIMEOUT, self.acceptor.accept(stream)) => r,
            _ = stop.recv() => return None,
        };
        let error = match accepted {
            Ok(Ok(stream)) => {
                let chain = stream.get_ref().1.peer_certificates();
                let facts = ConnectionFacts {
                    client,
                    tls: true,
                    verified_peer: self.auth.is_peer(chain),
                };
                return Some((stream, facts));
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no handshake within {HEADER_READ_TIMEOUT:?}"),
        };
        metrics::counter!(telemetry::TLS_HANDSHAKE_FAILURES).increment(1);
        tracing::debug!(%client, %error, "TLS handshake failed");
        None
    }
}

/// The pair new handshakes get; swapped whole on a successful reload.
#[derive(Debug)]
struct CurrentCert(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
}

/// Modification time and size of one file (`None` when unreadable).
type FileStamp = Option<(SystemTime, u64)>;

impl CertFiles {
    fn stamp(&self) -> (FileStamp, FileStamp) {
        let one = |p: &PathBuf| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        };
        (one(&self.cert), one(&self.key))
    }
}

/// Polls the pair once a second; on a change, loads it and swaps it in. A
/// bad or half-written pair is refused with one WARN and the old one kept;
/// it is tried again on the next change (a key written after its
/// certificate is a second change).
async fn watch(files: CertFiles, mut seen: (FileStamp, FileStamp), current: Arc<CurrentCert>) {
    let files = Arc::new(files);
    let mut every = tokio::time::interval(RELOAD_POLL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let stamp = files.stamp();
        if stamp == seen {
            continue;
        }
        let f = files.clone();
        let Ok(loaded) =
            tokio::task::spawn_blocking(move || certified_key(CERT_KEYS, &f.cert, &f.key)).await
        else {
            continue;
        };
        seen = stamp;
        match loaded {
            Ok(pair) => {
                current.0.store(Arc::new(pair));
                metrics::counter!(telemetry::TLS_RELOADS, "outcome" => "ok").increment(1);
                tracing::info!(cert_file = %files.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => {
                metrics::counter!(telemetry::TLS_RELOADS, "outcome" => "refused").increment(1);
                tracing::warn!(error = %e.report(), "new TLS certificate refused; keeping the previous one");
            }
        }
    }
}
