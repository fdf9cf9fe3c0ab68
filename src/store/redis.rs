//! Redis store: one Redis primary is the source of truth. Each role is a
//! hash `{ns}:lease:{role}` (holder, address, token) with a server-side `PX`
//! TTL, so expiry is judged by Redis's clock; a counter `{ns}:token:{role}`
//! holds the last token, and a new term's token is the greater of the
//! counter + 1 and Redis's time in microseconds, so tokens never go back
//! even when a restart without persistence loses the counter. Claim,
//! release and snapshot are each one atomic Lua script over the whole batch;
//! a term change publishes on the channel `{ns}:changes`. The scripts are in
//! `redis/*.lua`.
//!
//! Reads of changes come from a change log the same scripts keep: every
//! new term or release takes the next number of the counter `{ns}:seq` and
//! scores its role with it in the sorted set `{ns}:changes` (a key, apart
//! from the channel of that name), and every grant scores its role in
//! `{ns}:expiry` by the term's end on Redis's clock. A read of changes
//! first turns the terms that ran out into changes, then answers the roles
//! scored above its cursor and those ending within the horizon; a renewal
//! changes nothing there. The cursor is `{ns}:epoch` (begun from Redis's
//! time when missing, so a restart that lost the log starts another
//! history) and the counter. The log keeps the last change of at most
//! 10 000 roles and records the greatest number it dropped in
//! `{ns}:floor`; a cursor of another epoch, beyond the counter or below
//! the floor gets a full read, taken in the same script as its cursor.
//!
//! Presence keeps its own change log the same way. Each instance's record
//! is a field of the hash `{ns}:members:info`, and the sorted set
//! `{ns}:members:set` scores it by its end on Redis's clock. The presence
//! script (`redis/presence.lua`) scores an instance in
//! `{ns}:members:changes` with the next number of `{ns}:members:seq` when
//! it joins, comes back after its record ended, or writes another address,
//! candidacy or route fingerprint (a renewal changes nothing there), and
//! turns every record it finds ended into a departure before dropping it;
//! a leave is a departure too. The cursor is `{ns}:members:epoch` and that
//! counter; the log keeps the last change of at most 10 000 members with
//! `{ns}:members:floor`, and a cursor of another epoch, beyond the counter
//! or below the floor gets a full read, all in the script that writes the
//! record.
//!
//! Asynchronous replication can lose a lease on failover to a replica, and a
//! restart without persistence loses every lease: both are logged once at
//! start ([`durability`]); see `docs/stores.md`.

mod durability;

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ClientTlsConfig, RedisError, TlsCertificates};
use tokio::sync::Mutex;

use super::{
    check_table_name, check_tls_rules, feed, millis, ChangeFeed, Changes, Claim, Cursor, Grant,
    InstanceInfo, LeaseRecord, LeaseStore, Member, MemberChanges, PartitionRecord, RoleName,
    StoreError, StoreKind, StoreTls,
};

/// A script's reply value as text (empty when it is none).
fn text(v: &redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

/// A script's reply value as a number (0 when it is none).
fn num(v: &redis::Value) -> i64 {
    match v {
        redis::Value::Int(i) => *i,
        other => text(other).parse().unwrap_or(0),
    }
}

/// A script's reply value as a list (empty when it is none).
fn list(v: &redis::Value) -> &[redis::Value] {
    match v {
        redis::Value::Array(items) => items,
        _ => &[],
    }
}

/// The record of `role` from the four fields the scripts answer per role:
/// holder, address, token, pttl.
fn lease_record(role: String, f: &[redis::Value]) -> LeaseRecord {
    let holder = text(&f[0]);
    LeaseRecord {
        role,
        holder: (!holder.is_empty()).then_some(holder),
        holder_address: Some(text(&f[1])).filter(|a| !a.is_empty()),
        token: num(&f[2]).max(0) as u64,
        remaining: Duration::from_millis(num(&f[3]).max(0) as u64),
    }
}

/// Leases in one Redis primary, under the key namespace `ns`.
pub struct RedisStore {
    client: redis::Client,
    /// `host:port` (or socket path) for messages: never credentials.
    at: String,
    conn: Mutex<Option<ConnectionManager>>,
    ns: String,
    claim: redis::Script,
    release: redis::Script,
    snapshot: redis::Script,
    changes: redis::Script,
    presence: redis::Script,
    leave: redis::Script,
    partitions: redis::Script,
}

impl RedisStore {
    /// `url`: `redis://[:password@]host:port[/db]`, or `rediss://` for TLS
    /// verified against the web PKI roots. Connects lazily. Refuses a bad
    /// namespace or URL.
    pub async fn connect(url: &str, namespace: &str) -> Result<Self, StoreError> {
        Self::connect_with_tls(url, namespace, None).await
    }

    /// Like [`Self::connect`], with `store.tls` for a `rediss://` URL: the
    /// server is verified against its CA file, and its client certificate
    /// is shown. The files are read and checked here (restart to rotate).
    pub async fn connect_with_tls(
        url: &str,
        namespace: &str,
        tls: Option<&StoreTls>,
    ) -> Result<Self, StoreError> {
        check_table_name(namespace)?;
        check_tls_rules(StoreKind::Redis, url, tls)
            .map_err(|e| StoreError::config(e.field(), e))?;
        let bad_url = |e| StoreError::config("store.url", e);
        let client = match tls {
            None => redis::Client::open(url).map_err(bad_url)?,
            Some(tls) => {
                let material = tls.load()?;
                let certificates = TlsCertificates {
                    client_tls: material.identity.map(|(client_cert, client_key)| {
                        ClientTlsConfig {
                            client_cert,
                            client_key,
                        }
                    }),
                    root_cert: material.ca,
                };
                redis::Client::build_with_tls(url, certificates).map_err(bad_url)?
            }
        };
        Ok(Self {
            at: client.get_connection_info().addr.to_string(),
            client,
            conn: Mutex::new(None),
            ns: namespace.to_string(),
            claim: redis::Script::new(include_str!("redis/claim.lua")),
            release: redis::Script::new(include_str!("redis/release.lua")),
            snapshot: redis::Script::new(include_str!("redis/snapshot.lua")),
            changes: redis::Script::new(include_str!("redis/changes.lua")),
            presence: redis::Script::new(include_str!("redis/presence.lua")),
            leave: redis::Script::new(include_str!("redis/leave.lua")),
            partitions: redis::Script::new(include_str!("redis/partitions.lua")),
        })
    }

    /// Maps the failure of `op` (the one error helper of this backend);
    /// `op` "connect" is a failure to connect.
    fn error(&self, op: &'static str) -> impl FnOnce(RedisError) -> StoreError + '_ {
        move |e| {
            let context = match op {
                "connect" => format!("cannot connect to Redis at {}", self.at),
                op => format!("Redis at {}: {op} failed", self.at),
            };
            StoreError::unavailable(context, e)
        }
    }

    /// Runs the partition script (`redis/partitions.lua`) with `args`.
    async fn partitions_call(&self, args: &[&str]) -> Result<Vec<PartitionRecord>, StoreError> {
        let mut c = self.conn().await?;
        let mut call = self.partitions.key(format!("{}:partitions", self.ns));
        for a in args {
            call.arg(*a);
        }
        let out: Vec<String> = call
            .invoke_async(&mut c)
            .await
            .map_err(self.error("partitions"))?;
        Ok(out
            .chunks(4)
            .filter(|r| r.len() == 4)
            .map(|r| PartitionRecord {
                name: r[0].clone(),
                epoch: r[1].parse().unwrap_or(0),
                settling: Duration::from_millis(r[2].parse().unwrap_or(0)),
                definition: r[3].clone(),
            })
            .collect())
    }

    async fn conn(&self) -> Result<ConnectionManager, StoreError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_secs(1))
            .set_response_timeout(Duration::from_secs(2))
            .set_number_of_retries(1);
        let c = self
            .client
            .get_connection_manager_with_config(config)
            .await
            .map_err(self.error("connect"))?;
        *slot = Some(c.clone());
        // The first connection of this store (the manager reconnects on its
        // own after that), so the settings are asked once, off the call's path.
        tokio::spawn(durability::check(c.clone(), self.at.clone()));
        Ok(c)
    }

    fn lease_key(&self, role: &str) -> String {
        format!("{}:lease:{role}", self.ns)
    }

    fn token_key(&self, role: &str) -> String {
        format!("{}:token:{role}", self.ns)
    }

    fn channel(&self) -> String {
        format!("{}:changes", self.ns)
    }

    /// A key of the change log: `{ns}:{which}` (`seq`, `changes`, `expiry`,
    /// `epoch`, `floor`).
    fn log_key(&self, which: &str) -> String {
        format!("{}:{which}", self.ns)
    }

    /// Appends the change-log keys the claim and release scripts write.
    fn log_keys(&self, inv: &mut redis::ScriptInvocation<'_>) {
        for which in ["seq", "changes", "expiry", "epoch"] {
            inv.key(self.log_key(which));
        }
    }

    /// A full read of `roles` with the cursor taken in the same script.
    async fn full_read(&self, roles: &[String]) -> Result<Changes, StoreError> {
        self.changes_call(roles, None, Duration::ZERO)
            .await?
            .ok_or_else(|| {
                let e = format!("Redis at {}: a full read of changes was refused", self.at);
                StoreError::decode(e, "unexpected reply")
            })
    }

    /// Runs `redis/changes.lua`: from `since`, or a full read of `roles`
    /// when `since` is `None`. `None` answers a cursor the log cannot
    /// answer from.
    async fn changes_call(
        &self,
        roles: &[String],
        since: Option<Cursor>,
        horizon: Duration,
    ) -> Result<Option<Changes>, StoreError> {
        let mut c = self.conn().await?;
        let mut inv = self.changes.prepare_invoke();
        for which in ["seq", "changes", "expiry", "epoch", "floor"] {
            inv.key(self.log_key(which));
        }
        let (epoch, position) = match since {
            Some(s) => (s.epoch.to_string(), s.position.to_string()),
            None => (String::new(), String::new()),
        };
        inv.arg(self.lease_key(""))
            .arg(self.token_key(""))
            .arg(epoch)
            .arg(position)
            .arg(millis(horizon));
        for r in roles {
            inv.arg(r);
        }
        let out: Vec<redis::Value> = inv
            .invoke_async(&mut c)
            .await
            .map_err(self.error("changes"))?;
        let (Some(kind), Some(epoch), Some(position)) = (out.first(), out.get(1), out.get(2))
        else {
            let e = format!("Redis at {}: changes returned no cursor", self.at);
            return Err(StoreError::decode(e, "short reply"));
        };
        let full = match text(kind).as_str() {
            "full" => true,
            "changes" => false,
            _ => return Ok(None),
        };
        let records = out[3..]
            .chunks(5)
            .filter(|f| f.len() == 5)
            .map(|f| lease_record(text(&f[0]), &f[1..]))
            .collect();
        Ok(Some(Changes {
            full,
            records,
            cursor: Cursor {
                epoch: text(epoch).parse().unwrap_or(0),
                position: num(position).max(0) as u64,
            },
        }))
    }

    /// Every role that has a token counter (for `status` without a role list).
    async fn known_roles(&self) -> Result<Vec<String>, StoreError> {
        let mut c = self.conn().await?;
        let prefix = format!("{}:token:", self.ns);
        let mut roles = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}*"))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut c)
                .await
                .map_err(self.error("snapshot"))?;
            roles.extend(
                keys.into_iter()
                    .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned)),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
        roles.sort();
        Ok(roles)
    }
}

impl RedisStore {
    /// `{ns}:members:{which}`: the end-scored set (`set`), the record hash
    /// (`info`), and their change log (`seq`, `changes`, `epoch`, `floor`).
    fn members_key(&self, which: &str) -> String {
        format!("{}:members:{which}", self.ns)
    }

    /// Runs `redis/presence.lua`: writes `me`'s record and reads the
    /// members changed since `since`, or every live member when `since` is
    /// `None` or the log cannot answer from it.
    async fn presence_call(
        &self,
        me: &InstanceInfo,
        candidate: bool,
        routes: &str,
        ttl: Duration,
        since: Option<Cursor>,
    ) -> Result<MemberChanges, StoreError> {
        let mut c = self.conn().await?;
        let mut inv = self.presence.prepare_invoke();
        for which in ["set", "info", "seq", "changes", "epoch", "floor"] {
            inv.key(self.members_key(which));
        }
        let (epoch, position) = match since {
            Some(s) => (s.epoch.to_string(), s.position.to_string()),
            None => (String::new(), String::new()),
        };
        inv.arg(&me.id)
            .arg(&me.address)
            .arg(if candidate { "1" } else { "0" })
            .arg(millis(ttl))
            .arg(routes)
            .arg(epoch)
            .arg(position);
        let out: Vec<redis::Value> = inv
            .invoke_async(&mut c)
            .await
            .map_err(self.error("presence"))?;
        let [kind, epoch, position, members, gone, ..] = out.as_slice() else {
            let e = format!("Redis at {}: presence returned no cursor", self.at);
            return Err(StoreError::decode(e, "short reply"));
        };
        Ok(MemberChanges {
            full: text(kind) == "full",
            members: list(members)
                .chunks(2)
                .filter_map(|pair| super::parse_member(&text(&pair[0]), &text(pair.get(1)?)))
                .collect(),
            gone: list(gone).iter().map(text).collect(),
            cursor: Cursor {
                epoch: text(epoch).parse().unwrap_or(0),
                position: num(position).max(0) as u64,
            },
        })
    }
}

impl LeaseStore for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        // Nothing to create; check the server answers.
        async move {
            let mut c = self.conn().await?;
            let _: String = redis::cmd("PING")
                .query_async(&mut c)
                .await
                .map_err(self.error("ping"))?;
            Ok(())
        }
        .boxed()
    }

    fn register<'a>(&'a self, roles: &'a [RoleName]) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            // Token counters appear on first INCR; make them visible to `status`.
            let mut c = self.conn().await?;
            let mut pipe = redis::pipe();
            for r in roles {
                pipe.cmd("SETNX").arg(self.token_key(r)).arg(0).ignore();
            }
            pipe.query_async::<()>(&mut c)
                .await
                .map_err(self.error("register"))?;
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
            let mut c = self.conn().await?;
            let mut inv = self.claim.prepare_invoke();
            inv.arg(&instance.id)
                .arg(&instance.address)
                .arg(self.channel())
                .arg(self.lease_key(""));
            for cl in claims {
                inv.key(self.lease_key(&cl.role))
                    .key(self.token_key(&cl.role));
                inv.arg(cl.held_token.map(|t| t.to_string()).unwrap_or_default())
                    .arg(millis(cl.duration))
                    .arg(if cl.one_shot { "1" } else { "0" });
            }
            self.log_keys(&mut inv);
            let out: Vec<i64> = inv
                .invoke_async(&mut c)
                .await
                .map_err(self.error("claim"))?;
            Ok(out
                .chunks(2)
                .filter_map(|p| {
                    let idx = usize::try_from(p[0]).ok()?.checked_sub(1)?;
                    Some(Grant {
                        role: claims.get(idx)?.role.to_string(),
                        token: p.get(1).copied().unwrap_or(0) as u64,
                    })
                })
                .collect())
        }
        .boxed()
    }

    fn release<'a>(
        &'a self,
        instance: &'a InstanceInfo,
        held: &'a [(RoleName, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        async move {
            let mut c = self.conn().await?;
            let mut inv = self.release.prepare_invoke();
            inv.arg(&instance.id)
                .arg(self.channel())
                .arg(self.lease_key(""));
            for (role, token) in held {
                inv.key(self.lease_key(role)).arg(token.to_string());
            }
            self.log_keys(&mut inv);
            let out: Vec<i64> = inv
                .invoke_async(&mut c)
                .await
                .map_err(self.error("release"))?;
            Ok(out
                .into_iter()
                .filter_map(|i| {
                    held.get(usize::try_from(i).ok()?.checked_sub(1)?)
                        .map(|(r, _)| r.to_string())
                })
                .collect())
        }
        .boxed()
    }

    fn snapshot<'a>(
        &'a self,
        roles: &'a [RoleName],
    ) -> BoxFuture<'a, Result<Vec<LeaseRecord>, StoreError>> {
        async move {
            let roles: Vec<String> = if roles.is_empty() {
                self.known_roles().await?
            } else {
                roles.iter().map(|r| r.to_string()).collect()
            };
            if roles.is_empty() {
                return Ok(Vec::new());
            }
            let mut c = self.conn().await?;
            let mut inv = self.snapshot.prepare_invoke();
            for r in &roles {
                inv.key(self.lease_key(r)).key(self.token_key(r));
            }
            let out: Vec<redis::Value> = inv
                .invoke_async(&mut c)
                .await
                .map_err(self.error("snapshot"))?;
            Ok(roles
                .iter()
                .zip(out.chunks(4))
                .filter(|(_, f)| f.len() == 4)
                .map(|(role, f)| lease_record(role.clone(), f))
                .collect())
        }
        .boxed()
    }

    fn changes<'a>(
        &'a self,
        roles: &'a [RoleName],
        since: Option<Cursor>,
        horizon: Duration,
    ) -> BoxFuture<'a, Result<Changes, StoreError>> {
        async move {
            if let Some(since) = since {
                if let Some(read) = self.changes_call(&[], Some(since), horizon).await? {
                    return Ok(read);
                }
            }
            if !roles.is_empty() {
                let roles: Vec<String> = roles.iter().map(|r| r.to_string()).collect();
                return self.full_read(&roles).await;
            }
            // Every role: the cursor is taken before the roles are listed,
            // so a role that appears in between is read next time.
            let mut read = self.full_read(&[]).await?;
            let all = self.known_roles().await?;
            if !all.is_empty() {
                let cursor = read.cursor;
                read = self.full_read(&all).await?;
                read.cursor = cursor;
            }
            Ok(read)
        }
        .boxed()
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>> {
        async move {
            let mut pubsub = self
                .client
                .get_async_pubsub()
                .await
                .map_err(self.error("connect"))?;
            pubsub
                .subscribe(self.channel())
                .await
                .map_err(self.error("subscribe"))?;
            // The stream ends with the connection.
            Ok(feed::spawn(pubsub.into_on_message().map(|_| ())))
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
        async move {
            let read = self.presence_call(me, candidate, routes, ttl, None).await?;
            Ok(read.members)
        }
        .boxed()
    }

    /// The script turns every ended record into a departure before it
    /// reads, so a record is gone once it has ended, never before: the
    /// horizon asks nothing more here.
    fn presence_changes<'a>(
        &'a self,
        me: &'a InstanceInfo,
        candidate: bool,
        routes: &'a str,
        ttl: Duration,
        since: Option<Cursor>,
        _horizon: Duration,
    ) -> BoxFuture<'a, Result<MemberChanges, StoreError>> {
        async move { self.presence_call(me, candidate, routes, ttl, since).await }.boxed()
    }

    fn partitions(&self) -> BoxFuture<'_, Result<Vec<PartitionRecord>, StoreError>> {
        async move { self.partitions_call(&["read", "", "", "0", "0", ""]).await }.boxed()
    }

    fn define_partition<'a>(
        &'a self,
        name: &'a str,
        definition: &'a str,
    ) -> BoxFuture<'a, Result<PartitionRecord, StoreError>> {
        async move {
            let args = ["define", name, definition, "0", "0", ""];
            let mut records = self.partitions_call(&args).await?;
            records.pop().ok_or_else(|| {
                let e = format!("Redis at {}: define_partition returned no record", self.at);
                StoreError::decode(e, "empty reply")
            })
        }
        .boxed()
    }

    fn redefine_partition<'a>(
        &'a self,
        name: &'a str,
        from_epoch: u64,
        definition: &'a str,
        settle: Duration,
    ) -> BoxFuture<'a, Result<Option<PartitionRecord>, StoreError>> {
        async move {
            let (epoch, settle) = (from_epoch.to_string(), millis(settle).to_string());
            let channel = self.channel();
            let args = ["redefine", name, definition, &epoch, &settle, &channel];
            Ok(self.partitions_call(&args).await?.pop())
        }
        .boxed()
    }

    fn leave<'a>(&'a self, me: &'a InstanceInfo) -> BoxFuture<'a, Result<(), StoreError>> {
        async move {
            let mut c = self.conn().await?;
            let _: i64 = self
                .leave
                .key(self.members_key("set"))
                .key(self.members_key("info"))
                .key(self.members_key("seq"))
                .key(self.members_key("changes"))
                .key(self.members_key("epoch"))
                .arg(&me.id)
                .arg(self.channel())
                .invoke_async(&mut c)
                .await
                .map_err(self.error("leave"))?;
            Ok(())
        }
        .boxed()
    }
}
