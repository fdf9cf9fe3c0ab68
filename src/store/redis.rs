//! Redis store: one Redis primary is the source of truth. Each role is a
//! hash `{ns}:lease:{role}` (holder, address, token) with a server-side `PX`
//! TTL, so expiry is judged by Redis's clock; a persistent counter
//! `{ns}:token:{role}` is `INCR`ed for every new term. Claim, release and
//! snapshot are each one atomic Lua script over the whole batch; a term
//! change publishes on `{ns}:changes`.
//!
//! Asynchronous replication can lose a lease (or a token increment) on
//! failover to a replica: see `docs/stores.md`.

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{mpsc, Mutex};

use super::{
    millis, ChangeFeed, Claim, Grant, InstanceInfo, LeaseRecord, LeaseStore, RoleName, StoreError,
};

const CLAIM: &str = r#"
-- KEYS: lease1, token1, lease2, token2, ...   ARGV: id, address, channel, held1, ms1, held2, ms2, ...
local id, addr, channel = ARGV[1], ARGV[2], ARGV[3]
local out, changed = {}, false
for i = 1, #KEYS / 2 do
  local lk, tk = KEYS[2 * i - 1], KEYS[2 * i]
  local held, ms = ARGV[2 + 2 * i], tonumber(ARGV[3 + 2 * i])
  local cur = redis.call('HMGET', lk, 'holder', 'token')
  local holder, token = cur[1], cur[2]
  if holder == id and held ~= '' and token == held then
    redis.call('PEXPIRE', lk, ms)
    out[#out + 1] = i
    out[#out + 1] = tonumber(token)
  elseif not holder or holder == id then
    local t = redis.call('INCR', tk)
    redis.call('DEL', lk)
    redis.call('HSET', lk, 'holder', id, 'address', addr, 'token', t)
    redis.call('PEXPIRE', lk, ms)
    out[#out + 1] = i
    out[#out + 1] = t
    changed = true
  end
end
if changed then redis.call('PUBLISH', channel, 'term') end
return out
"#;

const RELEASE: &str = r#"
-- KEYS: lease1, lease2, ...   ARGV: id, channel, token1, token2, ...
local id, channel = ARGV[1], ARGV[2]
local out = {}
for i = 1, #KEYS do
  local cur = redis.call('HMGET', KEYS[i], 'holder', 'token')
  if cur[1] == id and cur[2] == ARGV[2 + i] then
    redis.call('DEL', KEYS[i])
    out[#out + 1] = i
  end
end
if #out > 0 then redis.call('PUBLISH', channel, 'release') end
return out
"#;

const SNAPSHOT: &str = r#"
-- KEYS: lease1, token1, ...   returns per role: holder, address, token, pttl
local out = {}
for i = 1, #KEYS / 2 do
  local lk, tk = KEYS[2 * i - 1], KEYS[2 * i]
  local cur = redis.call('HMGET', lk, 'holder', 'address', 'token')
  local pttl = redis.call('PTTL', lk)
  if cur[1] then
    out[#out + 1] = cur[1]
    out[#out + 1] = cur[2] or ''
    out[#out + 1] = cur[3] or '0'
    out[#out + 1] = pttl
  else
    out[#out + 1] = ''
    out[#out + 1] = ''
    out[#out + 1] = redis.call('GET', tk) or '0'
    out[#out + 1] = 0
  end
end
return out
"#;

pub struct RedisStore {
    client: redis::Client,
    conn: Mutex<Option<ConnectionManager>>,
    ns: String,
    claim: redis::Script,
    release: redis::Script,
    snapshot: redis::Script,
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl RedisStore {
    /// `url`: `redis://[:password@]host:port[/db]`. Connects lazily.
    pub async fn connect(url: &str, namespace: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|e| {
            StoreError::Config(format!(
                "store.url: {}",
                crate::redact::redact_text(&e.to_string())
            ))
        })?;
        Ok(Self {
            client,
            conn: Mutex::new(None),
            ns: namespace.to_string(),
            claim: redis::Script::new(CLAIM),
            release: redis::Script::new(RELEASE),
            snapshot: redis::Script::new(SNAPSHOT),
        })
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
            .map_err(unavailable)?;
        *slot = Some(c.clone());
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
                .map_err(unavailable)?;
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
                .map_err(unavailable)?;
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
            pipe.query_async::<()>(&mut c).await.map_err(unavailable)?;
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
                .arg(self.channel());
            for cl in claims {
                inv.key(self.lease_key(&cl.role))
                    .key(self.token_key(&cl.role));
                inv.arg(cl.held_token.map(|t| t.to_string()).unwrap_or_default())
                    .arg(millis(cl.duration));
            }
            let out: Vec<i64> = inv.invoke_async(&mut c).await.map_err(unavailable)?;
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
            inv.arg(&instance.id).arg(self.channel());
            for (role, token) in held {
                inv.key(self.lease_key(role)).arg(token.to_string());
            }
            let out: Vec<i64> = inv.invoke_async(&mut c).await.map_err(unavailable)?;
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
            let out: Vec<redis::Value> = inv.invoke_async(&mut c).await.map_err(unavailable)?;
            let text = |v: &redis::Value| -> String {
                match v {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    redis::Value::SimpleString(s) => s.clone(),
                    redis::Value::Int(i) => i.to_string(),
                    _ => String::new(),
                }
            };
            let num = |v: &redis::Value| -> i64 {
                match v {
                    redis::Value::Int(i) => *i,
                    other => text(other).parse().unwrap_or(0),
                }
            };
            Ok(roles
                .iter()
                .zip(out.chunks(4))
                .map(|(role, f)| {
                    let holder = text(&f[0]);
                    let pttl = num(&f[3]);
                    LeaseRecord {
                        role: role.clone(),
                        holder: (!holder.is_empty()).then_some(holder),
                        holder_address: Some(text(&f[1])).filter(|a| !a.is_empty()),
                        token: num(&f[2]).max(0) as u64,
                        remaining: Duration::from_millis(pttl.max(0) as u64),
                    }
                })
                .collect())
        }
        .boxed()
    }

    fn subscribe(&self) -> BoxFuture<'_, Result<ChangeFeed, StoreError>> {
        async move {
            let mut pubsub = self.client.get_async_pubsub().await.map_err(unavailable)?;
            pubsub
                .subscribe(self.channel())
                .await
                .map_err(unavailable)?;
            let (tx, feed) = mpsc::channel(1);
            tokio::spawn(async move {
                let mut messages = pubsub.into_on_message();
                loop {
                    tokio::select! {
                        _ = tx.closed() => return,
                        msg = messages.next() => match msg {
                            Some(_) => { let _ = tx.try_send(()); }
                            // Connection lost: the feed ends; the coordinator polls and
                            // subscribes anew.
                            None => return,
                        }
                    }
                }
            });
            Ok(feed)
        }
        .boxed()
    }
}
