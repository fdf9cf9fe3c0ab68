//! An axum service that holds leases itself, with both holder layers mounted
//! before routing, on the embedded SQLite store.
//!
//! Run two or three copies on different ports, then call any of them:
//!
//! ```text
//! cargo run --example axum_app -- 3001 &
//! cargo run --example axum_app -- 3002 &
//! curl -X POST localhost:3002/reports/run         # runs on the `reports` holder
//! curl localhost:3001/accounts/42/balance         # runs on the holder of 42's partition
//! curl localhost:3001/                            # not gated: runs where it lands
//! ```

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Extension, Path};
use axum::routing::{get, post};
use axum::Router;
use rolegate::lease::HeldLease;
use rolegate::store::{LeaseStore, SqliteStore};
use rolegate::{CoordinatorBuilder, LeaseTimings};
use rolegate::{KeyExtractor, LayerOptions, PartitionHolderLayer, RoleHolderLayer};
use tower::ServiceBuilder;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("info").init();
    let port: u16 = std::env::args()
        .nth(1)
        .map(|p| p.parse())
        .transpose()?
        .unwrap_or(3001);
    let db =
        std::env::var("ROLEGATE_EXAMPLE_DB").unwrap_or_else(|_| "sqlite://axum-example.db".into());

    let store = SqliteStore::connect(&db, "rolegate_role_leases").await?;
    store.migrate().await?;
    let store: Arc<dyn LeaseStore> = Arc::new(store);
    let coordinator = CoordinatorBuilder::new(store.clone())
        .instance_name("axum-example")
        .advertise(format!("http://127.0.0.1:{port}"))
        .role("reports", LeaseTimings::default())
        .partition("accounts", 8, LeaseTimings::default())
        .start()?;
    coordinator
        .ready(std::time::Duration::from_secs(10))
        .await?;

    // The app's own routes; they never think about leases, except to read the token.
    let routes = Router::new()
        .route(
            "/",
            get(move || async move { format!("not gated; served on port {port}\n") }),
        )
        .route("/reports/run", post(run_report))
        .route("/accounts/{id}/balance", get(balance))
        .layer(Extension(ServedOn(port)));

    // Gate before routing: the layers see every request, and act on their prefixes.
    let options = LayerOptions::new()?;
    let gated = ServiceBuilder::new()
        .layer(
            RoleHolderLayer::new(&coordinator, "reports", options.clone())?.prefixes(["/reports"]),
        )
        .layer(
            PartitionHolderLayer::new(
                &coordinator,
                "accounts",
                KeyExtractor::PathSegment(2),
                options,
            )?
            .prefixes(["/accounts"]),
        )
        .service(routes);
    let app = Router::new().fallback_service(gated);

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    tracing::info!(
        port,
        instance = coordinator.instance_id(),
        "axum example listening"
    );
    let stop = Arc::new(tokio::sync::Notify::new());
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown({
        let stop = stop.clone();
        async move { stop.notified().await }
    });
    let server = tokio::spawn(server.into_future());
    let _ = tokio::signal::ctrl_c().await;
    // The order that works: stop accepting, and at the same time let the
    // coordinator drain local work (up to its drain bound, 10 s by default),
    // end what is left (a stream is cut, so its connection can close), and
    // release every held role so another copy takes over at once. Waiting
    // for the server first would wait for streams that never end.
    stop.notify_one();
    coordinator.shutdown().await;
    server.await??;
    // SQLite: checkpoint and close, so no -wal/-shm file is left behind.
    store.close().await;
    Ok(())
}

/// The port of the copy that ran the request: a forwarded request names the
/// holder's port, not the one you called.
#[derive(Clone, Copy)]
struct ServedOn(u16);

async fn run_report(
    Extension(ServedOn(port)): Extension<ServedOn>,
    Extension(lease): Extension<HeldLease>,
) -> String {
    // Pass the token to anything that can fence on it (a DB column, an API).
    format!(
        "report started on port {port} under {} (token {})\n",
        lease.role, lease.token
    )
}

async fn balance(
    Path(id): Path<String>,
    Extension(ServedOn(port)): Extension<ServedOn>,
    Extension(lease): Extension<HeldLease>,
) -> String {
    format!(
        "balance of account {id}, served on port {port} by the holder of {} (token {})\n",
        lease.role, lease.token
    )
}
