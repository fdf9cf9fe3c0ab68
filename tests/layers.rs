//! The tower layers in real axum servers on real sockets: two app copies
//! share a store; gated requests run at the holder with a `HeldLease`
//! extension, or are forwarded one hop, or answered 400/503.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Extension;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use rolegate::lease::HeldLease;
use rolegate::store::{LeaseStore, MemoryStore};
use rolegate::{Coordinator, CoordinatorBuilder, LeaseTimings};
use rolegate::{KeyExtractor, LayerError, LayerOptions, PartitionHolderLayer, RoleHolderLayer};
use support::cluster;
use tower::ServiceBuilder;

const T: LeaseTimings = LeaseTimings {
    duration: Duration::from_millis(900),
    renew_interval: Duration::from_millis(200),
    safety_margin: Duration::from_millis(200),
};

async fn app(store: Arc<dyn LeaseStore>, name: &str) -> (Coordinator, u16) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let coordinator = CoordinatorBuilder::new(store)
        .instance_name(name)
        .advertise(format!("http://127.0.0.1:{port}"))
        .role("reports", T)
        .partition("accounts", 4, T)
        .start()
        .unwrap();
    // One handler for every route: who ran it, under which lease (if any),
    // whether any X-Rolegate-* header reached the app, and whether a
    // client's forged forwarding field did.
    let who = name.to_string();
    let handler = move |lease: Option<Extension<HeldLease>>, headers: http::HeaderMap| {
        let who = who.clone();
        async move {
            let lease = lease
                .map(|Extension(l)| format!(" {} {}", l.role, l.token))
                .unwrap_or_default();
            let leaked = headers.keys().any(|k| {
                k.as_str().replace('_', "-").starts_with("x-rolegate-")
                    || k.as_str() == "upgrade"
                    || k.as_str() == "http2-settings"
            });
            let forged = ["x-forwarded-host", "x-forwarded-for", "x-real-ip"]
                .iter()
                .any(|k| {
                    headers.get(*k).is_some_and(|v| {
                        v.as_bytes().starts_with(b"203.0.113.66") || v == "evil.example"
                    })
                });
            format!(
                "{who}{lease}{}{}",
                if leaked { " leaked" } else { "" },
                if forged { " forged" } else { "" }
            )
        }
    };
    // Answers 101 to anyone, completing no handshake (an endpoint whose
    // status the client picks).
    let forged_101 = || async {
        (
            StatusCode::SWITCHING_PROTOCOLS,
            [("upgrade", "websocket"), ("connection", "upgrade")],
        )
    };
    let routes = Router::new()
        .route("/status/101", get(forged_101))
        .route("/reports/status/101", get(forged_101))
        .route("/reports/run", get(handler.clone()))
        .route("/accounts/{id}", get(handler.clone()))
        .route("/other", get(handler.clone()))
        .fallback(handler);
    let options = LayerOptions::new().unwrap();
    let gated = ServiceBuilder::new()
        .layer(
            RoleHolderLayer::new(&coordinator, "reports", options.clone())
                .unwrap()
                .prefixes(["/reports"]),
        )
        .layer(
            // The explicit opt-in: an unknown role gates nothing.
            RoleHolderLayer::if_registered(&coordinator, "not-registered", options.clone())
                .prefixes(["/other"]),
        )
        .layer(
            PartitionHolderLayer::new(
                &coordinator,
                "accounts",
                KeyExtractor::PathSegment(2),
                options,
            )
            .unwrap()
            .prefixes(["/accounts"]),
        )
        .service(routes);
    let app = Router::new().fallback_service(gated);
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    (coordinator, port)
}

/// App `a` (holding every role) and app `b` (knowing `a` holds `reports`).
async fn two_apps() -> ((Coordinator, u16), (Coordinator, u16)) {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let (a, pa) = app(store.clone(), "a").await;
    support::wait_for("a holds reports", Duration::from_secs(3), || {
        a.role("reports").unwrap().is_held()
    })
    .await;
    let (b, pb) = app(store, "b").await;
    support::wait_for("b knows the holder", Duration::from_secs(3), || {
        b.role("reports").unwrap().current_holder().is_some()
    })
    .await;
    ((a, pa), (b, pb))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_run_work_at_the_holder_and_forward_from_elsewhere() {
    let ((a, pa), (b, pb)) = two_apps().await;
    let token = a.role("reports").unwrap().guard().unwrap().token;
    for port in [pa, pb] {
        let (status, _, body) = cluster::get(&format!("http://127.0.0.1:{port}/reports/run"))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body,
            format!("a reports {token}"),
            "runs at the holder with its HeldLease"
        );
    }
    // Partition: the key is path segment 2.
    for port in [pa, pb] {
        let (status, _, body) = cluster::get(&format!("http://127.0.0.1:{port}/accounts/42"))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK);
        let idx = rolegate::lease::partition_index(None, "42", 4);
        assert!(
            body.starts_with(format!("a accounts:partition-{idx} ").as_bytes()),
            "{body:?}"
        );
    }
    // Client-sent X-Rolegate-* never reach the app, gated path or not.
    for path in ["/reports/run", "/other"] {
        let req = Request::get(format!("http://127.0.0.1:{pa}{path}"))
            .header("x-rolegate-role", "forged")
            .header("x-rolegate-token", "999")
            .body(Body::empty())
            .unwrap();
        let (_, _, body) = cluster::request(req).await.unwrap();
        assert!(
            !String::from_utf8_lossy(&body).contains("leaked"),
            "{path}: {body:?}"
        );
    }
    // A client's forwarding fields: kept for the app a layer wraps (its
    // own server decides whom to trust), never carried to a peer on an
    // untrusted client's word.
    for (port, kept) in [(pa, true), (pb, false)] {
        let req = Request::get(format!("http://127.0.0.1:{port}/reports/run"))
            .header("x-forwarded-for", "203.0.113.66")
            .header("x-forwarded-host", "evil.example")
            .header("x-real-ip", "203.0.113.66")
            .body(Body::empty())
            .unwrap();
        let (status, _, body) = cluster::request(req).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        let body = String::from_utf8_lossy(&body);
        assert!(body.starts_with("a reports "), "{body}");
        assert_eq!(body.ends_with(" forged"), kept, "via port {port}: {body}");
    }
    // `if_registered` for an unregistered role installs nothing.
    let (status, _, body) = cluster::get(&format!("http://127.0.0.1:{pb}/other"))
        .await
        .unwrap();
    assert_eq!((status, body.as_ref()), (StatusCode::OK, b"b".as_ref()));
    // Already forwarded once, at a non-holder: 503, not executed.
    let req = Request::get(format!("http://127.0.0.1:{pb}/reports/run"))
        .header("x-rolegate-hop", "someone")
        .body(Body::empty())
        .unwrap();
    let (status, headers, _) = cluster::request(req).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.contains_key("retry-after"));

    // Graceful stop of the holder: b serves next.
    a.shutdown().await;
    support::wait_for("b holds reports", Duration::from_secs(1), || {
        b.role("reports").unwrap().is_held()
    })
    .await;
    let (_, _, body) = cluster::get(&format!("http://127.0.0.1:{pb}/reports/run"))
        .await
        .unwrap();
    assert!(body.starts_with(b"b reports "), "{body:?}");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_gate_every_encoding_of_a_prefix_and_key_like_the_gateway() {
    let ((a, _pa), (b, pb)) = two_apps().await;
    let token = a.role("reports").unwrap().guard().unwrap().token;
    // axum's router would not match these itself; the layer gates them, so
    // they run at the holder (its fallback handler), never on b.
    for path in [
        "/%72eports/run",
        "/REPORTS/run",
        "//reports/run",
        "/x/../reports/run",
        "/reports%2Frun",
        "/reports;v=1/run",
    ] {
        let (status, _, body) = cluster::get(&format!("http://127.0.0.1:{pb}{path}"))
            .await
            .unwrap();
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(body, format!("a reports {token}"), "{path}");
    }
    let (status, _, _) = cluster::get(&format!("http://127.0.0.1:{pb}/reports%00/run"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // One key in two encodings is one partition, or, where the escaped
    // spelling read as sent lands in another, refused like the gateway does.
    let idx = rolegate::lease::partition_index(None, "order-42", 4);
    let raw = rolegate::lease::partition_index(None, "ord%65r-42", 4);
    for path in ["/accounts/order-42", "/accounts/ord%65r-42"] {
        let (status, _, body) = cluster::get(&format!("http://127.0.0.1:{pb}{path}"))
            .await
            .unwrap();
        if path.contains('%') && raw != idx {
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
            assert!(String::from_utf8_lossy(&body).contains("ambiguous-key"));
            continue;
        }
        assert!(
            body.starts_with(format!("a accounts:partition-{idx} ").as_bytes()),
            "{path}: {body:?}"
        );
    }
    // Look-alikes and h2c never reach the app, gated or not.
    for path in ["/reports/run", "/other"] {
        let req = Request::get(format!("http://127.0.0.1:{pb}{path}"))
            .header("x_rolegate_role", "forged")
            .header("X_Rolegate_Token", "999")
            .header("connection", "Upgrade, HTTP2-Settings")
            .header("upgrade", "h2c")
            .header("http2-settings", "AAMAAABkAAQCAAAAAAIAAAAA")
            .body(Body::empty())
            .unwrap();
        let (status, _, body) = cluster::request(req).await.unwrap();
        assert_ne!(status, StatusCode::SWITCHING_PROTOCOLS);
        assert!(
            !String::from_utf8_lossy(&body).contains("leaked"),
            "{path}: {body:?}"
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_layer_without_a_key_answers_400() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let c = CoordinatorBuilder::new(store)
        .advertise("http://127.0.0.1:1")
        .partition("p", 2, T)
        .start()
        .unwrap();
    let routes = Router::new().fallback(|| async { "inner" });
    let gated = ServiceBuilder::new()
        .layer(
            PartitionHolderLayer::new(
                &c,
                "p",
                KeyExtractor::header("x-key").unwrap(),
                LayerOptions::new().unwrap(),
            )
            .unwrap()
            .scope("S"),
        )
        .service(routes);
    let app = Router::new().fallback_service(gated);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (status, headers, body) = cluster::get(&format!("http://127.0.0.1:{port}/anything"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(headers["content-type"], "application/problem+json");
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["partition"], "p");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apps_101_without_the_handshake_asked_for_is_answered_502() {
    let ((a, pa), (b, pb)) = two_apps().await;
    let ask = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
    // Ungated and gated (run at the holder, or forwarded there from b).
    for (port, path, upgrade) in [
        (pa, "/status/101", ask),
        (pa, "/status/101", ""),
        (pa, "/reports/status/101", ask),
        (pb, "/reports/status/101", ask),
    ] {
        let raw = format!("GET {path} HTTP/1.1\r\nHost: t\r\n{upgrade}\r\nGET /reports/run HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let resp = cluster::raw_exchange(port, raw.as_bytes()).await;
        assert_eq!(cluster::status_of(&resp), 502, "{port} {path}: {resp}");
        assert!(resp.contains("upstream-bad-upgrade"), "{resp}");
        assert!(!resp.contains("HTTP/1.1 101"), "{resp}");
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_for_an_unknown_role_or_partition_is_an_error_naming_the_registered_ones() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let c = CoordinatorBuilder::new(store)
        .advertise("http://127.0.0.1:1")
        .role("cron", T)
        .role("reports", T)
        .partition("accounts", 4, T)
        .start()
        .unwrap();
    let options = LayerOptions::new().unwrap();
    // A typo fails closed: no layer at all, and the message says what is there.
    let err = RoleHolderLayer::new(&c, "crno", options.clone())
        .err()
        .expect("an unknown role is an error");
    assert_eq!(
        err,
        LayerError::UnknownRole {
            role: "crno".into(),
            registered: vec!["cron".into(), "reports".into()],
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("`crno`") && text.contains("`cron`, `reports`"),
        "{text}"
    );
    let err =
        PartitionHolderLayer::new(&c, "acounts", KeyExtractor::PathSegment(2), options.clone())
            .err()
            .expect("an unknown partition is an error");
    assert_eq!(
        err,
        LayerError::UnknownPartition {
            partition: "acounts".into(),
            registered: vec!["accounts".into()],
        }
    );
    assert!(err.to_string().contains("`accounts`"), "{err}");
    // Registered names build, partition roles included.
    assert!(RoleHolderLayer::new(&c, "reports", options.clone()).is_ok());
    assert!(RoleHolderLayer::new(&c, "accounts:partition-3", options.clone()).is_ok());
    assert!(
        PartitionHolderLayer::new(&c, "accounts", KeyExtractor::PathSegment(2), options).is_ok()
    );
    c.shutdown().await;
}

/// A layer is ready when the app it wraps is: an app's backpressure reaches
/// the connection before a request is admitted under the lease, so waiting
/// for the app never counts as the role's work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_is_ready_only_when_its_app_is() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll, Waker};
    use tower::{Layer, Service};

    #[derive(Clone)]
    struct Gated(Arc<AtomicBool>);
    impl Service<Request<Body>> for Gated {
        type Response = http::Response<Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<http::Response<Body>, std::convert::Infallible>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            if self.0.load(Ordering::SeqCst) {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }
        fn call(&mut self, _: Request<Body>) -> Self::Future {
            std::future::ready(Ok(http::Response::new(Body::empty())))
        }
    }

    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new());
    let c = CoordinatorBuilder::new(store)
        .instance_name("ready")
        .advertise("http://127.0.0.1:1")
        .role("reports", T)
        .start()
        .unwrap();
    let open = Arc::new(AtomicBool::new(false));
    let layer = RoleHolderLayer::new(&c, "reports", LayerOptions::new().unwrap())
        .unwrap()
        .prefixes(["/reports"]);
    let mut svc = layer.layer(Gated(open.clone()));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_pending(), "ready before its app");
    open.store(true, Ordering::SeqCst);
    assert!(svc.poll_ready(&mut cx).is_ready(), "not ready with its app");
    c.shutdown_now().await;
}
