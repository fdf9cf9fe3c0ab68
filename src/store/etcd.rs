//! etcd store: the path beyond one database. Each instance has one etcd lease
//! (TTL ≥ its longest role duration), kept alive by the coordinator's tick;
//! every role key it holds is attached to that lease, so expiry is judged by
//! etcd's server-side TTL. A role key is created by a transaction that
//! compares its absence; the fencing token is the key's create revision
//! (cluster-wide, strictly increasing). Renewal is the lease keep-alive plus a
//! check that the key still has the caller's token; release deletes the key
//! if it still has that token. A watch on the key prefix wakes contenders and
//! refreshes snapshots at once.
//!
//! Per tick and instance: one keep-alive, one range read, and (only when
//! taking roles) one transaction per role sent concurrently — O(1) round trips.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LeaseKeepAliveStream, LeaseKeeper,
    PutOptions, Txn, TxnOp, WatchOptions,
};
use futures_util::future::{join_all, BoxFuture};
use futures_util::{stream, FutureExt};
use tokio::sync::Mutex;

use super::error::{with_sources, BoxError};
use super::{
    check_table_name, feed, ChangeFeed, Claim, Grant, InstanceInfo, LeaseRecord, LeaseStore,
    Member, RoleName, StoreError,
};

/// etcd's default `--max-txn-ops`.
const MAX_TXN_OPS: usize = 128;

/// The store error for a failed `op` against the endpoints `at` (the one
/// error mapping of this backend); `op` "connect" is a failure to connect.
fn error(at: &str, op: &str, e: etcd_client::Error) -> StoreError {
    let context = match op {
        "connect" => format!("cannot connect to etcd at {at}"),
        op => format!("etcd at {at}: {op} failed"),
    };
    StoreError::unavailable(context, cause(e))
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

struct InstanceLease {
    id: i64,
    ttl: Duration,
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Holder {
    holder: String,
    address: String,
}

/// A role key as read from etcd.
struct RoleKey {
    holder: Holder,
    token: u64,
    lease: i64,
    mod_revision: i64,
}

/// Leases in etcd v3, under the key namespace `ns`.
pub struct EtcdStore {
    client: Client,
    /// The endpoints, for messages.
    at: String,
    ns: String,
    leases: Mutex<HashMap<String, InstanceLease>>,
}

impl EtcdStore {
    /// `endpoints`: comma-separated `http://host:port` list. Connects lazily.
    pub async fn connect(
        endpoints: &str,
        namespace: &str,
        user: Option<(&str, &str)>,
    ) -> Result<Self, StoreError> {
        check_table_name(namespace)?;
        let eps: Vec<String> = endpoints
            .split(',')
            .map(|e| e.trim().trim_start_matches("etcd://").to_string())
            .filter(|e| !e.is_empty())
            .collect();
        if eps.is_empty() {
            return Err(StoreError::config("store.url", "no etcd endpoints"));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(3))
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
        if let Some((u, p)) = user {
            options = options.with_user(u, p);
        }
        let at = eps.join(",");
        let client = Client::connect(eps, Some(options))
            .await
            .map_err(|e| error(&at, "connect", e))?;
        Ok(Self {
            client,
            at,
            ns: namespace.to_string(),
            leases: Mutex::new(HashMap::new()),
        })
    }

    /// [`error`] for this store's endpoints.
    fn error(&self, op: &'static str) -> impl FnOnce(etcd_client::Error) -> StoreError + '_ {
        move |e| error(&self.at, op, e)
    }

    /// The value of a role key held by `instance` (release compares it byte
    /// for byte, so it is always built here).
    fn holder_value(&self, instance: &InstanceInfo) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec(&Holder {
            holder: instance.id.clone(),
            address: instance.address.clone(),
        })
        .map_err(|e| {
            StoreError::unavailable(format!("etcd at {}: encoding the holder", self.at), e)
        })
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

    /// Keeps the instance's lease alive (granting one if needed); returns its
    /// id and TTL. The keep-alive leaves after the caller's `t_sent`.
    async fn keep_alive(
        &self,
        instance: &str,
        need: Duration,
    ) -> Result<(i64, Duration), StoreError> {
        let mut leases = self.leases.lock().await;
        if let Some(l) = leases.get_mut(instance) {
            let alive = async {
                l.keeper
                    .keep_alive()
                    .await
                    .map_err(self.error("keep-alive"))?;
                match l.stream.message().await.map_err(self.error("keep-alive"))? {
                    Some(resp) if resp.ttl() > 0 => Ok(true),
                    Some(_) => Ok(false),
                    None => Err(StoreError::unavailable(
                        format!("etcd at {}: keep-alive failed", self.at),
                        "lease keep-alive stream closed",
                    )),
                }
            }
            .await;
            match alive {
                Ok(true) => return Ok((l.id, l.ttl)),
                Ok(false) => {
                    // Expired: every key attached to it is gone already.
                    leases.remove(instance);
                }
                Err(e) => {
                    leases.remove(instance);
                    return Err(e);
                }
            }
        }
        let secs = need.as_millis().div_ceil(1000).max(1) as i64;
        let mut c = self.client.clone();
        let granted = c
            .lease_grant(secs, None)
            .await
            .map_err(self.error("keep-alive"))?;
        let (keeper, stream) = c
            .lease_keep_alive(granted.id())
            .await
            .map_err(self.error("keep-alive"))?;
        let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
        leases.insert(
            instance.to_string(),
            InstanceLease {
                id: granted.id(),
                ttl,
                keeper,
                stream,
            },
        );
        Ok((granted.id(), ttl))
    }

    async fn read_roles(&self) -> Result<BTreeMap<String, RoleKey>, StoreError> {
        let mut c = self.client.clone();
        let prefix = self.lease_prefix();
        let resp = c
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(self.error("read"))?;
        let mut out = BTreeMap::new();
        for kv in resp.kvs() {
            let Ok(key) = kv.key_str() else { continue };
            let Some(role) = key.strip_prefix(&prefix) else {
                continue;
            };
            let Ok(holder) = serde_json::from_slice::<Holder>(kv.value()) else {
                continue;
            };
            out.insert(
                role.to_string(),
                RoleKey {
                    holder,
                    token: kv.create_revision() as u64,
                    lease: kv.lease(),
                    mod_revision: kv.mod_revision(),
                },
            );
        }
        Ok(out)
    }

    /// Creates the role key if absent; the token is the creating revision.
    async fn acquire(
        &self,
        role: &str,
        value: &[u8],
        lease: i64,
    ) -> Result<Option<u64>, StoreError> {
        let key = self.lease_key(role);
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value.to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let resp = self
            .client
            .clone()
            .txn(txn)
            .await
            .map_err(self.error("acquire"))?;
        Ok(resp
            .succeeded()
            .then(|| resp.header().map(|h| h.revision() as u64))
            .flatten())
    }

    /// Starts a new term for `role`: deletes the caller's own stale key first
    /// when `stale` names its mod revision, then creates the key.
    async fn take(
        &self,
        role: String,
        stale: Option<i64>,
        value: &[u8],
        lease: i64,
    ) -> Result<Option<(String, u64)>, StoreError> {
        if let Some(revision) = stale {
            let cmp = Compare::mod_revision(self.lease_key(&role), CompareOp::Equal, revision);
            if !self.delete_if(&role, cmp).await? {
                return Ok(None);
            }
        }
        Ok(self.acquire(&role, value, lease).await?.map(|t| (role, t)))
    }

    async fn delete_if(&self, role: &str, cmp: Compare) -> Result<bool, StoreError> {
        let txn = Txn::new()
            .when([cmp])
            .and_then([TxnOp::delete(self.lease_key(role), None)]);
        let resp = self
            .client
            .clone()
            .txn(txn)
            .await
            .map_err(self.error("delete"))?;
        Ok(resp.succeeded())
    }
}

impl LeaseStore for EtcdStore {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        async move {
            // Nothing to create; check the cluster answers.
            self.client
                .clone()
                .status()
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
                self.client
                    .clone()
                    .txn(Txn::new().and_then(ops))
                    .await
                    .map_err(self.error("register"))?;
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
            if claims.is_empty() {
                return Ok(Vec::new());
            }
            let need = claims.iter().map(|c| c.duration).max().unwrap_or_default();
            let (lease, ttl) = self.keep_alive(&instance.id, need).await?;
            let current = self.read_roles().await?;
            let value = self.holder_value(instance)?;
            let mut grants = Vec::new();
            let mut attempts = Vec::new();
            for c in claims {
                // The lease TTL must cover the role's duration, or the store term
                // would end before the caller's trust window.
                if c.duration > ttl {
                    tracing::warn!(role = %c.role, "role duration exceeds the instance's etcd lease TTL; not claimed");
                    continue;
                }
                let stale = match current.get(c.role.as_str()) {
                    Some(k) if k.holder.holder == instance.id && k.lease == lease && Some(k.token) == c.held_token => {
                        // Renewed by the keep-alive above.
                        grants.push(Grant {
                            role: c.role.to_string(),
                            token: k.token,
                        });
                        continue;
                    }
                    // Ours but not the term the caller holds: start a new term.
                    Some(k) if k.holder.holder == instance.id => Some(k.mod_revision),
                    Some(_) => continue,
                    None => None,
                };
                attempts.push(self.take(c.role.to_string(), stale, &value, lease));
            }
            for result in join_all(attempts).await {
                if let Some((role, token)) = result? {
                    grants.push(Grant { role, token });
                }
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
            let value = self.holder_value(instance)?;
            let value = &value;
            let attempts = held.iter().map(|(role, token)| async move {
                let key = self.lease_key(role);
                let txn = Txn::new()
                    .when([
                        Compare::create_revision(key.clone(), CompareOp::Equal, *token as i64),
                        Compare::value(key.clone(), CompareOp::Equal, value.clone()),
                    ])
                    .and_then([TxnOp::delete(key, None)]);
                let resp = self
                    .client
                    .clone()
                    .txn(txn)
                    .await
                    .map_err(self.error("release"))?;
                Ok::<_, StoreError>(resp.succeeded().then(|| role.to_string()))
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
        async move {
            let current = self.read_roles().await?;
            let names: Vec<String> = if roles.is_empty() {
                let prefix = self.known_prefix();
                let resp = self
                    .client
                    .clone()
                    .get(
                        prefix.clone(),
                        Some(GetOptions::new().with_prefix().with_keys_only()),
                    )
                    .await
                    .map_err(self.error("snapshot"))?;
                let mut names: Vec<String> = resp
                    .kvs()
                    .iter()
                    .filter_map(|kv| kv.key_str().ok()?.strip_prefix(&prefix).map(str::to_owned))
                    .collect();
                names.extend(current.keys().cloned());
                names.sort();
                names.dedup();
                names
            } else {
                roles.iter().map(|r| r.to_string()).collect()
            };
            // Time left per holder lease, one call per distinct lease, concurrently.
            let mut lease_ids: Vec<i64> = current.values().map(|k| k.lease).collect();
            lease_ids.sort_unstable();
            lease_ids.dedup();
            let ttls = join_all(lease_ids.iter().map(|&id| {
                let mut c = self.client.clone();
                async move {
                    (
                        id,
                        c.lease_time_to_live(id, None)
                            .await
                            .map(|r| r.ttl())
                            .unwrap_or(0),
                    )
                }
            }))
            .await;
            let ttl: HashMap<i64, i64> = ttls.into_iter().collect();
            Ok(names
                .iter()
                .map(|role| match current.get(role) {
                    Some(k) => LeaseRecord {
                        role: role.clone(),
                        holder: Some(k.holder.holder.clone()),
                        holder_address: Some(k.holder.address.clone()),
                        token: k.token,
                        remaining: Duration::from_secs(
                            ttl.get(&k.lease).copied().unwrap_or(0).max(0) as u64,
                        ),
                    },
                    None => LeaseRecord {
                        role: role.clone(),
                        holder: None,
                        holder_address: None,
                        token: 0,
                        remaining: Duration::ZERO,
                    },
                })
                .collect())
        }
        .boxed()
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>> {
        async move {
            let mut c = self.client.clone();
            let (watcher, stream) = c
                .watch(self.lease_prefix(), Some(WatchOptions::new().with_prefix()))
                .await
                .map_err(self.error("watch"))?;
            // The watcher lives as long as the stream; the watch ending (or
            // failing) ends the feed.
            let notices = stream::unfold((watcher, stream), |(watcher, mut stream)| async move {
                match stream.message().await {
                    Ok(Some(_)) => Some(((), (watcher, stream))),
                    _ => None,
                }
            });
            Ok(feed::spawn(notices))
        }
        .boxed()
    }

    fn presence<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Vec<Member>, StoreError>> {
        self.presence_call(me, candidate, ttl).boxed()
    }

    fn leave<'a>(&'a self, me: &'a InstanceInfo) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            let mut c = self.client.clone();
            c.delete(self.member_key(&me.id), None)
                .await
                .map_err(self.error("leave"))?;
            Ok(())
        }
        .boxed()
    }
}

impl EtcdStore {
    fn member_key(&self, id: &str) -> String {
        format!("{}/members/{id}", self.ns)
    }

    /// Presence is a key on the instance's own etcd lease, so it expires with
    /// it; written and read back in one transaction.
    async fn presence_call(
        &self,
        me: &InstanceInfo,
        candidate: bool,
        ttl: Duration,
    ) -> Result<Vec<Member>, StoreError> {
        let (lease, _) = self.keep_alive(&me.id, ttl).await?;
        let value = format!("{} {}", u8::from(candidate), me.address);
        let prefix = format!("{}/members/", self.ns);
        let txn = Txn::new().and_then([
            TxnOp::put(
                self.member_key(&me.id),
                value,
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::get(prefix.clone(), Some(GetOptions::new().with_prefix())),
        ]);
        let mut c = self.client.clone();
        let resp = c.txn(txn).await.map_err(self.error("presence"))?;
        let mut members = Vec::new();
        for op in resp.op_responses() {
            let etcd_client::TxnOpResponse::Get(get) = op else {
                continue;
            };
            for kv in get.kvs() {
                let (Ok(key), Ok(value)) = (kv.key_str(), kv.value_str()) else {
                    continue;
                };
                let Some((flag, address)) = value.split_once(' ') else {
                    continue;
                };
                members.push(Member {
                    id: key.trim_start_matches(prefix.as_str()).to_string(),
                    address: address.to_string(),
                    candidate: flag == "1",
                });
            }
        }
        Ok(members)
    }
}
