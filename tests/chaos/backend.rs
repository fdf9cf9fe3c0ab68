//! The store a chaos run uses, chosen by ROLEGATE_CHAOS_STORE: `postgres`
//! (the default, and the short run of `scripts/test`) or `etcd-cluster`
//! (`scripts/chaos --store etcd-cluster`): its servers, its lease timings,
//! the `store:` section of each gateway's config, and the faults that hit
//! the store itself.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use super::harness::FaultKind;
use crate::support::etcd::EtcdCluster;
use crate::support::PrivatePostgres;

/// Which store the gateways use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// One private PostgreSQL, each gateway behind its own fault proxy.
    Postgres,
    /// A 3-member etcd cluster; every gateway lists all three endpoints.
    EtcdCluster,
}

/// Lease timings of every gateway, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    pub duration_ms: u64,
    pub renew_ms: u64,
    pub margin_ms: u64,
}

impl Store {
    /// From ROLEGATE_CHAOS_STORE (default `postgres`).
    pub fn from_env() -> Store {
        match std::env::var("ROLEGATE_CHAOS_STORE").as_deref() {
            Ok("etcd-cluster") => Store::EtcdCluster,
            Ok("postgres") | Ok("") | Err(_) => Store::Postgres,
            Ok(other) => {
                panic!("ROLEGATE_CHAOS_STORE={other}: expected `postgres` or `etcd-cluster`")
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Store::Postgres => "PostgreSQL",
            Store::EtcdCluster => "a 3-member etcd cluster",
        }
    }

    pub fn timings(self) -> Timings {
        match self {
            Store::Postgres => Timings {
                duration_ms: 1_000,
                renew_ms: 250,
                margin_ms: 300,
            },
            // Sized against etcd's default election timeout (1 s): the trust
            // window less one renew interval outlasts an election
            // (docs/stores.md).
            Store::EtcdCluster => Timings {
                duration_ms: 6_000,
                renew_ms: 1_000,
                margin_ms: 1_000,
            },
        }
    }

    /// The fault kinds of a run on this store.
    pub fn faults(self) -> &'static [FaultKind] {
        match self {
            Store::Postgres => &FaultKind::POSTGRES,
            Store::EtcdCluster => &FaultKind::ETCD_CLUSTER,
        }
    }

    /// How long the cluster settles between two faults (ms).
    pub fn settle_ms(self) -> std::ops::Range<u64> {
        match self {
            Store::Postgres => 800..1_800,
            Store::EtcdCluster => 3_000..5_000,
        }
    }

    /// Role transitions a short run must see to mean something (etcd's
    /// timings are five times longer, so are its takeovers).
    pub fn min_transitions(self) -> usize {
        match self {
            Store::Postgres => 200,
            Store::EtcdCluster => 40,
        }
    }
}

/// The running store servers. Stopped when dropped.
pub enum Servers {
    Postgres(Arc<PrivatePostgres>),
    Etcd(tokio::sync::Mutex<EtcdCluster>),
}

impl Servers {
    pub async fn start(store: Store) -> Servers {
        match store {
            Store::Postgres => Servers::Postgres(Arc::new(PrivatePostgres::start())),
            Store::EtcdCluster => {
                Servers::Etcd(tokio::sync::Mutex::new(EtcdCluster::start(3).await))
            }
        }
    }

    /// PostgreSQL's port (the gateways' fault proxies forward to it).
    pub fn pg_port(&self) -> Option<u16> {
        match self {
            Servers::Postgres(pg) => Some(pg.port),
            Servers::Etcd(_) => None,
        }
    }

    pub fn pg(&self) -> Option<&Arc<PrivatePostgres>> {
        match self {
            Servers::Postgres(pg) => Some(pg),
            Servers::Etcd(_) => None,
        }
    }

    /// The `store:` section of gateway `n`'s config: PostgreSQL through the
    /// gateway's proxy port, or every etcd endpoint, the list starting at a
    /// different member for each gateway.
    pub async fn store_yaml(&self, n: usize, table: &str, proxy_port: Option<u16>) -> String {
        match self {
            Servers::Postgres(_) => format!(
                "store:\n  kind: postgres\n  url: postgres://postgres@127.0.0.1:{}/postgres\n  table: {table}\n",
                proxy_port.unwrap_or_default()
            ),
            Servers::Etcd(c) => {
                let c = c.lock().await;
                let first = n % c.members.len();
                format!(
                    "store:\n  kind: etcd\n  url: {}\n  table: {table}\n",
                    c.endpoints_from(first)
                )
            }
        }
    }
}

/// Kills (`kill -9`, then a restart on the same data) or freezes (SIGSTOP,
/// then SIGCONT) one etcd member for 3-8 s, the leader every other time,
/// then waits until the cluster takes writes. A majority stays up
/// throughout. A frozen leader resumes within 2-3 s: one frozen past the
/// lease TTL revokes live leases as it resumes on etcd before 3.4.31 and
/// 3.5.13 (docs/stores.md), a server fault outside what the checker holds
/// rolegate to.
pub async fn member_fault(
    cluster: &tokio::sync::Mutex<EtcdCluster>,
    kind: FaultKind,
    rng: &mut StdRng,
) {
    let mut c = cluster.lock().await;
    let n = c.members.len();
    let leader = c.leader().await.unwrap_or(0);
    let victim = if rng.gen_bool(0.5) {
        leader
    } else {
        (leader + rng.gen_range(1..n)) % n
    };
    let hold = if kind == FaultKind::MemberPause && victim == leader {
        Duration::from_millis(rng.gen_range(2_000..3_000))
    } else {
        Duration::from_millis(rng.gen_range(3_000..8_000))
    };
    match kind {
        FaultKind::MemberKill => c.kill(victim),
        _ => c.pause(victim),
    }
    tokio::time::sleep(hold).await;
    match kind {
        FaultKind::MemberKill => c.restart(victim),
        _ => c.resume(victim),
    }
    c.wait_writable(Duration::from_secs(30)).await;
}
