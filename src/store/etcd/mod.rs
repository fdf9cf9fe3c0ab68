//! etcd store: the path beyond one database. Each instance has one etcd lease
//! (TTL ≥ its longest role duration), kept alive by the coordinator's tick;
//! every role key it holds is attached to that lease, so expiry is judged by
//! etcd's server-side TTL. A term begins with a transaction that puts the
//! role key compared on its absence (or, for the caller's own key, on its
//! mod revision: one write, never a delete followed by a create); the
//! fencing token is that put's revision, the key's mod revision
//! (cluster-wide, strictly increasing; nothing else writes the key while the
//! term lasts). Renewal is the lease keep-alive plus a check that the key
//! still has the caller's token and lease; release deletes the key if it
//! still has both. A watch on the key prefix wakes contenders and refreshes
//! snapshots at once.
//!
//! Every call goes through [`members::Members`]: one connection per
//! endpoint, each with its own health, short per-attempt deadlines, and
//! the next member on failure. The keep-alive stream is reopened on the
//! same lease when it breaks ([`keepalive`]); a new lease is granted only
//! once the cluster says the old one is gone.
//!
//! A role key's value names the holder and its lease's TTL, so a reader
//! judges the holder from the time it saw the key and that TTL, without a
//! lease lookup, and never from a whole-second TTL read ([`keys`]). A watch
//! starts just after the revision of the last read, so a change between the
//! read and the watch still wakes the coordinator.
//!
//! Per tick and instance: one keep-alive, one range read, and (only when
//! taking roles) one transaction per role sent concurrently — O(1) round trips.
//!
//! A one-shot claim puts its key on an etcd lease of its own that is never
//! kept alive ([`once`]), so the term ends at its TTL.

mod changes;
mod keepalive;
mod keys;
mod members;
mod once;
mod partitions;
mod presence;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Compare, CompareOp, ConnectOptions, Identity, TlsOptions, Txn, TxnOp, WatchOptions,
};
use futures_util::future::{join_all, BoxFuture};
use futures_util::{stream, FutureExt, StreamExt};
use tokio::sync::{broadcast, Mutex};

use super::error::{with_sources, BoxError};
use super::tls::etcd_uses_https;
use super::{
    check_table_name, check_tls_rules, feed, ChangeFeed, Changes, Claim, Cursor, Grant,
    InstanceInfo, LeaseRecord, LeaseStore, Member, MemberChanges, PartitionRecord, RoleName,
    StoreError, StoreKind, StoreTls, TlsRuleError,
};
use keepalive::{InstanceLease, Renewal};
use members::{CallError, Members, Patience};

/// etcd's default `--max-txn-ops`.
const MAX_TXN_OPS: usize = 128;
/// How long building a member's connection may take (TCP connect, and the
/// authentication call when a user is set).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2 keep-alive pings on a connection idle this long. etcd refuses
/// pings more often than every 5 s (`--grpc-keepalive-min-time`) on a
/// quiet connection, so fast detection comes from the per-call deadlines
/// instead; the pings only close a long-silent stream to a dead member.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// The store error for a failed `op` against the endpoints `at` (the one
/// error mapping of this backend); `op` "connect" is a failure to connect.
fn error(at: &str, op: &str, e: CallError) -> StoreError {
    let context = match op {
        "connect" => format!("cannot connect to etcd at {at}"),
        op => format!("etcd at {at}: {op} failed"),
    };
    match e {
        CallError::Etcd(e) => StoreError::unavailable(context, cause(e)),
        CallError::TimedOut(after) => StoreError::timeout(context, after),
    }
}

/// The cause inside an etcd client error (whose own `source()` is empty):
/// the transport error with its chain, or the gRPC status's code, message
/// and causes (its own `Display` adds details and metadata).
fn cause(e: etcd_client::Error) -> BoxError {
    match e {
        etcd_client::Error::TransportError(e) => Box::new(e),
        etcd_client::Error::IoError(e) => Box::new(e),
        etcd_client::Error::GRpcStatus(s) => {
            let head = format!("{}: {}", s.code(), s.message());
            with_sources(head, std::error::Error::source(&s)).into()
        }
        e => Box::new(e),
    }
}

/// The TLS settings of every member's connection: `tls`'s CA (else the
/// web PKI roots) and client certificate.
fn tls_options(tls: Option<&StoreTls>) -> Result<TlsOptions, StoreError> {
    let material = tls.map(StoreTls::load).transpose()?.unwrap_or_default();
    let mut options = TlsOptions::new();
    options = match material.ca {
        Some(pem) => options.ca_certificate(Certificate::from_pem(pem)),
        None => options.with_webpki_roots(),
    };
    if let Some((cert, key)) = material.identity {
        options = options.identity(Identity::from_pem(cert, key));
    }
    Ok(options)
}

/// An instance's lease slot: empty until the first claim, or after the
/// cluster said the lease is gone and no new one was granted yet.
type LeaseSlot = Arc<Mutex<Option<InstanceLease>>>;

/// Leases in etcd v3, under the key namespace `ns`.
pub struct EtcdStore {
    members: Arc<Members>,
    /// The endpoints, for messages.
    at: String,
    ns: String,
    leases: std::sync::Mutex<HashMap<String, LeaseSlot>>,
    /// The revision of the last range read of the role keys: a new watch
    /// starts just after it, so no change between that read and the watch
    /// goes unnoticed (0: none yet, or compacted away).
    read_revision: Arc<AtomicI64>,
    /// The etcd lease of each one-shot term, by instance and token, so a
    /// release can name it ([`once`]).
    one_shot: std::sync::Mutex<HashMap<(String, u64), once::OneShotTerm>>,
    /// The changes to role keys since the last full read ([`changes`]).
    log: changes::SharedLog,
    /// Told each time the change log takes in changes (the feed's wake-up).
    logged: broadcast::Sender<()>,
    /// Per instance, what its reads of presence changes know ([`presence`]).
    presence_views: std::sync::Mutex<HashMap<String, presence::PresenceView>>,
}

impl EtcdStore {
    /// `endpoints`: comma-separated `http://host:port` list, one connection
    /// per endpoint. Fails when no endpoint can be used (a bad URL; with
    /// `user`, no member authenticated); members that are down are tried
    /// again on later calls.
    pub async fn connect(
        endpoints: &str,
        namespace: &str,
        user: Option<(&str, &str)>,
    ) -> Result<Self, StoreError> {
        Self::connect_with_tls(endpoints, namespace, user, None).await
    }

    /// Like [`Self::connect`], for `https://` endpoints (all of them, or
    /// none), verified against `tls`'s CA file (else the web PKI roots) and
    /// shown its client certificate. The files are read and checked here
    /// (restart to rotate).
    pub async fn connect_with_tls(
        endpoints: &str,
        namespace: &str,
        user: Option<(&str, &str)>,
        tls: Option<&StoreTls>,
    ) -> Result<Self, StoreError> {
        check_table_name(namespace)?;
        let bad = |e: TlsRuleError| StoreError::config(e.field(), e);
        check_tls_rules(StoreKind::Etcd, endpoints, tls).map_err(bad)?;
        let https = etcd_uses_https(endpoints).map_err(bad)?;
        let eps: Vec<String> = endpoints
            .split(',')
            .map(|e| e.trim().trim_start_matches("etcd://").to_string())
            .filter(|e| !e.is_empty())
            .collect();
        if eps.is_empty() {
            return Err(StoreError::config("store.url", "no etcd endpoints"));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(PING_INTERVAL, PING_TIMEOUT);
        if let Some((u, p)) = user {
            options = options.with_user(u, p);
        }
        if https {
            options = options.with_tls(tls_options(tls)?);
        }
        let at = eps.join(",");
        let members = Arc::new(Members::new(eps, options));
        members
            .connect(CONNECT_TIMEOUT)
            .await
            .map_err(|e| error(&at, "connect", e))?;
        members.spawn_prober();
        Ok(Self {
            members,
            at,
            ns: namespace.to_string(),
            leases: std::sync::Mutex::new(HashMap::new()),
            read_revision: Arc::new(AtomicI64::new(0)),
            one_shot: std::sync::Mutex::new(HashMap::new()),
            log: changes::SharedLog::default(),
            logged: broadcast::channel(16).0,
            presence_views: std::sync::Mutex::new(HashMap::new()),
        })
    }

    /// [`error`] for this store's endpoints.
    fn error(&self, op: &'static str) -> impl FnOnce(CallError) -> StoreError + '_ {
        move |e| error(&self.at, op, e)
    }

    /// Runs `txn` as a write (retried on another member as `members`
    /// allows); `op` names it in the error.
    pub(super) async fn write_txn(
        &self,
        txn: Txn,
        op: &'static str,
    ) -> Result<etcd_client::TxnResponse, StoreError> {
        self.members
            .write(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(self.error(op))
    }

    fn lease_prefix(&self) -> String {
        format!("{}/lease/", self.ns)
    }

    fn lease_key(&self, role: &str) -> String {
        format!("{}/lease/{role}", self.ns)
    }

    fn known_prefix(&self) -> String {
        format!("{}/known/", self.ns)
    }

    /// The lease slot of `instance`.
    fn slot(&self, instance: &str) -> LeaseSlot {
        let mut leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        leases.entry(instance.to_string()).or_default().clone()
    }

    /// Keeps the instance's lease alive, reopening its keep-alive stream on
    /// the same lease as needed; grants a new lease only when there is none,
    /// the cluster says the old one is gone, or a role now claimed needs a
    /// longer TTL (its held keys then move to the new lease, as new terms,
    /// once). Returns its id, its TTL and the Raft term the keep-alive (or
    /// the grant) was answered in. The keep-alive leaves after the caller's
    /// `t_sent`.
    async fn keep_alive(
        &self,
        instance: &str,
        need: Duration,
    ) -> Result<(i64, Duration, u64), StoreError> {
        let slot = self.slot(instance);
        let mut slot = slot.lock().await;
        if slot.as_ref().is_some_and(|l| l.ttl < need) {
            tracing::info!(
                need = ?need,
                "a role needs a longer etcd lease; granting one (held roles move to it as new terms)"
            );
            *slot = None;
        }
        if let Some(lease) = slot.as_mut() {
            match lease
                .renew(&self.members)
                .await
                .map_err(self.error("keep-alive"))?
            {
                Renewal::Alive { term } => return Ok((lease.id, lease.ttl, term)),
                Renewal::Gone => {
                    // Expired and revoked: every key attached to it is gone already.
                    tracing::warn!(
                        lease = lease.id,
                        "the instance's etcd lease expired; granting a new one"
                    );
                    *slot = None;
                }
            }
        }
        let secs = need.as_millis().div_ceil(1000).max(1) as i64;
        let granted = self
            .members
            .write(|mut c| async move { c.lease_grant(secs, None).await })
            .await
            .map_err(self.error("keep-alive"))?;
        let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
        let term = granted.header().map_or(0, |h| h.raft_term());
        *slot = Some(InstanceLease::new(granted.id(), ttl));
        Ok((granted.id(), ttl, term))
    }

    /// Keeps the instance lease alive and acquires or renews each role on it.
    async fn claim_renewable(
        &self,
        instance: &InstanceInfo,
        claims: &[&Claim],
    ) -> Result<Vec<Grant>, StoreError> {
        let durations = claims.iter().map(|c| c.duration);
        let (Some(shortest), Some(need)) = (durations.clone().min(), durations.max()) else {
            return Ok(Vec::new());
        };
        self.members.tune(shortest);
        let (lease, ttl, renewed_in) = self.keep_alive(&instance.id, need).await?;
        // Only the keys claimed: a claim's cost grows with what this
        // instance holds and takes, not with every role there is.
        let names: Vec<&str> = claims.iter().map(|c| c.role.as_str()).collect();
        let (current, read_in) = self.read_some(&names).await?;
        if renewed_in != 0 && read_in != 0 && renewed_in != read_in {
            // A leader frozen past an election answers keep-alives in
            // its old term for a moment after it resumes, renewing
            // nothing the cluster keeps. The linearizable read after it
            // names the current term: trust the renewal only when they
            // match (the leader of that term held a quorum throughout).
            return Err(StoreError::unavailable(
                format!("etcd at {}: keep-alive failed", self.at),
                format!("answered in Raft term {renewed_in}, but the cluster is in term {read_in}; renewing again"),
            ));
        }
        let value = self.holder_value(instance, ttl)?;
        let mut grants = Vec::new();
        let mut attempts = Vec::new();
        for c in claims {
            // The lease TTL must cover the role's duration, or the store term
            // would end before the caller's trust window.
            if c.duration > ttl {
                tracing::warn!(role = %c.role, "role duration exceeds the instance's etcd lease TTL; not claimed");
                continue;
            }
            let seen = match current.get(c.role.as_str()) {
                Some(k)
                    if k.holder.holder == instance.id
                        && k.lease == lease
                        && Some(k.token) == c.held_token =>
                {
                    // Renewed by the keep-alive above.
                    grants.push(Grant {
                        role: c.role.to_string(),
                        token: k.token,
                    });
                    continue;
                }
                // Ours but not the term the caller holds: a new term, put
                // over the key in one write, so the role is never free.
                Some(k) if k.holder.holder == instance.id => Some(k.token),
                Some(_) => continue,
                None => None,
            };
            attempts.push((c.role.to_string(), seen));
        }
        // Terms begin in batches, one transaction each with a nested one
        // per role (its own compare), the batches sent concurrently. etcd
        // lets a nested transaction have only the operations its parent
        // leaves of `--max-txn-ops`: half each.
        let batches = attempts.chunks(MAX_TXN_OPS / 2);
        let begun = batches.map(|batch| self.begin_terms(batch, &value, lease));
        for result in join_all(begun).await {
            grants.extend(result?);
        }
        Ok(grants)
    }
}

impl EtcdStore {
    /// Every role key of `roles` (all known roles when empty), in one
    /// range read; the read's revision is kept in `read_revision`.
    async fn snapshot_at(&self, roles: &[RoleName]) -> Result<Vec<LeaseRecord>, StoreError> {
        let (current, _) = self.read_roles().await?;
        let names: Vec<String> = if roles.is_empty() {
            let mut names = self.known_roles().await?;
            names.extend(current.keys().cloned());
            names.sort();
            names.dedup();
            names
        } else {
            roles.iter().map(|r| r.to_string()).collect()
        };
        let legacy = self.legacy_ttls(&current).await?;
        Ok(names
            .iter()
            .map(|role| {
                let key = current.get(role);
                let ttl = key.and_then(|k| legacy.get(&k.lease).copied());
                Self::record(role, key, ttl)
            })
            .collect())
    }
}

impl LeaseStore for EtcdStore {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            // Nothing to create; check the cluster answers.
            self.members
                .call_at(Patience::Setup, |mut c| async move { c.status().await })
                .await
                .map_err(self.error("status"))?;
            Ok(())
        }
        .boxed()
    }

    fn register<'a>(&'a self, roles: &'a [RoleName]) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            // Marker keys so `status` can list roles nobody holds.
            for chunk in roles.chunks(MAX_TXN_OPS) {
                let ops: Vec<TxnOp> = chunk
                    .iter()
                    .map(|r| TxnOp::put(format!("{}{r}", self.known_prefix()), Vec::new(), None))
                    .collect();
                let txn = Txn::new().and_then(ops);
                self.write_txn(txn, "register").await?;
            }
            Ok(())
        }
        .boxed()
    }

    fn claim<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        claims: &'a [Claim],
    ) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        async move {
            // One-shot terms never touch the instance lease (their own end
            // at their TTL), nor its keep-alive timings.
            let (once, renewable): (Vec<&Claim>, Vec<&Claim>) =
                claims.iter().partition(|c| c.one_shot);
            let mut grants = self.claim_renewable(instance, &renewable).await?;
            if !once.is_empty() {
                grants.extend(self.claim_once(instance, &once).await?);
            }
            Ok(grants)
        }
        .boxed()
    }

    fn release<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        held: &'a [(RoleName, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        async move {
            // Keys of this instance are attached to its lease, or for a
            // one-shot term to that term's own; with neither it holds none.
            let lease = self.slot(&instance.id).lock().await.as_ref().map(|l| l.id);
            let attempts = held.iter().filter_map(|(role, token)| {
                let one_shot = self.one_shot_lease(&instance.id, *token);
                let lease = one_shot.or(lease)?;
                Some(async move {
                    let key = self.lease_key(role);
                    let txn = Txn::new()
                        .when([
                            Compare::mod_revision(key.clone(), CompareOp::Equal, *token as i64),
                            Compare::lease(key.clone(), CompareOp::Equal, lease),
                        ])
                        .and_then([TxnOp::delete(key, None)]);
                    let resp = self.write_txn(txn, "release").await?;
                    if resp.succeeded() && one_shot.is_some() {
                        self.forget_one_shot(&instance.id, *token);
                    }
                    Ok::<_, StoreError>(resp.succeeded().then(|| role.to_string()))
                })
            });
            let mut released = Vec::new();
            for r in join_all(attempts).await {
                if let Some(role) = r? {
                    released.push(role);
                }
            }
            Ok(released)
        }
        .boxed()
    }

    fn snapshot<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Vec<LeaseRecord>, StoreError>> {
        self.snapshot_at(roles).boxed()
    }

    fn changes<'a>(
        &'a self,
        roles: &'a [RoleName],
        since: Option<Cursor>,
        _horizon: Duration,
    ) -> BoxFuture<'a, Result<Changes, StoreError>> {
        self.changes_call(roles, since).boxed()
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>> {
        async move {
            let prefix = self.lease_prefix();
            let mut options = WatchOptions::new().with_prefix();
            let after = self.read_revision.load(Ordering::Relaxed);
            if after > 0 {
                options = options.with_start_revision(after + 1);
            }
            let (member, (watcher, stream)) = self
                .members
                .call_at(Patience::Read, |mut c| {
                    let (prefix, options) = (prefix.clone(), options.clone());
                    async move { c.watch(prefix, Some(options)).await }
                })
                .await
                .map_err(self.error("watch"))?;
            // The watcher lives as long as the stream. The watch ending or
            // failing, or its member failing any call, ends the feed (the
            // coordinator subscribes again, on a healthy member). A watch
            // the cluster cancels (its start revision was compacted) ends it
            // too, and the next one starts from the present.
            let mut failures = self.members.failures(member);
            failures.mark_unchanged();
            let read_revision = self.read_revision.clone();
            let state = (watcher, stream, failures);
            let notices = stream::unfold(state, move |(watcher, mut stream, mut failures)| {
                let read_revision = read_revision.clone();
                async move {
                    tokio::select! {
                        m = stream.message() => match m {
                            Ok(Some(resp)) if resp.canceled() => {
                                read_revision.store(0, Ordering::Relaxed);
                                None
                            }
                            Ok(Some(_)) => Some(((), (watcher, stream, failures))),
                            _ => None,
                        },
                        _ = failures.changed() => None,
                    }
                }
            });
            // The change log's watch wakes the coordinator too, once it
            // has a change: a read of changes woken by the watch above
            // may come before the log has it, and would then miss it until
            // the next tick. The feed still ends with the watch above.
            let logged = stream::unfold(self.logged.subscribe(), |mut rx| async move {
                match rx.recv().await {
                    Ok(()) | Err(broadcast::error::RecvError::Lagged(_)) => Some((Some(()), rx)),
                    Err(broadcast::error::RecvError::Closed) => None,
                }
            });
            let watched = notices.map(Some).chain(stream::once(async { None }));
            let merged = stream::select(watched, logged)
                .take_while(|n| std::future::ready(n.is_some()))
                .map(|_| ());
            Ok(feed::spawn(merged))
        }
        .boxed()
    }

    fn presence<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Member>, StoreError>> {
        self.presence_call(me, candidate, routes, ttl).boxed()
    }

    fn presence_changes<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
        since: Option<Cursor>,
        _horizon: Duration,
    ) -> BoxFuture<'a, Result<MemberChanges, StoreError>> {
        self.presence_changes_call(me, candidate, routes, ttl, since)
            .boxed()
    }

    fn partitions(&self) -> BoxFuture<'_, Result<Vec<PartitionRecord>, StoreError>> {
        self.read_partitions().boxed()
    }

    fn define_partition<'a>(
        &'a self,
        name: &'a str,
        definition: &'a str,
    ) -> BoxFuture<'a, Result<PartitionRecord, StoreError>> {
        self.define_call(name, definition).boxed()
    }

    fn redefine_partition<'a>(
        &'a self,
        name: &'a str,
        from_epoch: u64,
        definition: &'a str,
        settle: Duration,
    ) -> BoxFuture<'a, Result<Option<PartitionRecord>, StoreError>> {
        self.redefine_call(name, from_epoch, definition, settle)
            .boxed()
    }

    fn leave<'a>(&'a self, me: &'a InstanceInfo) -> BoxFuture<'a, Result<(), StoreError>> {
        self.leave_call(me).boxed()
    }
}
