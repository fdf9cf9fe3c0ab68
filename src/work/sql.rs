//! The work-row statements, built once per table from validated identifiers
//! and the app's own predicate fragments. Each condition is written once here.

use super::WorkTable;

/// Which SQL the statements are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `$n` parameters; times are `timestamptz` from `clock_timestamp()`.
    Postgres,
    /// `?n` parameters; times are integer Unix milliseconds from the SQLite clock.
    Sqlite,
}

impl Dialect {
    fn p(self, n: u8) -> String {
        match self {
            Dialect::Postgres => format!("${n}"),
            Dialect::Sqlite => format!("?{n}"),
        }
    }

    /// The database clock.
    fn now(self) -> &'static str {
        match self {
            Dialect::Postgres => "clock_timestamp()",
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        }
    }

    /// One time for the whole statement: a claim that ranks a key's rows
    /// and counts its running ones must judge every lease at the same
    /// instant, or a lease ending between two readings is seen neither
    /// running nor claimable. (SQLite's `'now'` is already one per step.)
    fn statement_now(self) -> &'static str {
        match self {
            Dialect::Postgres => "statement_timestamp()",
            Dialect::Sqlite => self.now(),
        }
    }

    /// Now plus the lease bound as parameter `n` (seconds on PostgreSQL,
    /// milliseconds on SQLite).
    fn now_plus(self, n: u8) -> String {
        match self {
            Dialect::Postgres => format!("clock_timestamp() + make_interval(secs => ${n})"),
            Dialect::Sqlite => format!("{} + ?{n}", self.now()),
        }
    }

    /// A Unix-milliseconds parameter as a stored time.
    fn time_param(self, n: u8) -> String {
        match self {
            Dialect::Postgres => format!("to_timestamp(${n}::float8 / 1000.0)"),
            Dialect::Sqlite => format!("?{n}"),
        }
    }

    /// `column IN (the partition numbers bound as parameter n)`.
    fn in_list(self, column: &str, n: u8) -> String {
        match self {
            Dialect::Postgres => format!("{column} = ANY(${n})"),
            Dialect::Sqlite => format!("{column} IN (SELECT value FROM json_each(?{n}))"),
        }
    }
}

/// Every statement of one work table.
#[derive(Debug, Clone)]
pub struct Statements {
    /// Parameters: batch, lock id, lease.
    pub claim: String,
    /// Parameters: batch, lock id, lease, partition numbers.
    pub claim_partitions: String,
    /// Parameters: id, lock id. Returns one row, whether the completed row
    /// is still eligible, when the lock id was on it.
    pub complete: String,
    /// Parameters: ids (an array on PostgreSQL, a JSON array on SQLite), lock
    /// id. Returns the ids it completed, each with whether it is still eligible.
    pub complete_many: String,
    /// Parameters: id, lock id, retry time (Unix ms). `None` without `on_fail`.
    pub fail: Option<String>,
    /// Parameters: id, lock id, retry delay in milliseconds from the
    /// database's now. `None` without `on_fail`.
    pub fail_after: Option<String>,
    /// Parameters: id, lock id.
    pub release: String,
    /// Parameters: id, lock id, lease in milliseconds.
    pub renew: String,
    /// Parameters: id, lock id. Returns whether the dead row is still
    /// eligible, when the lock id was on it. `None` without `on_dead`.
    pub dead: Option<String>,
    dialect: Dialect,
    table: String,
    id: String,
    lock: String,
    claimable: String,
}

impl Statements {
    pub(crate) fn new(t: &WorkTable, d: Dialect) -> Self {
        let (table, id, lock, until) = (&t.table, &t.id, &t.lock_id, &t.locked_until);
        // A row is claimable when the app says it is work and no live lock is on it.
        let claimable = format!(
            "({}) AND ({lock} IS NULL OR {until} < {})",
            t.eligible,
            d.now()
        );
        let mut order: Vec<String> = t.order_by.clone();
        order.push(id.clone());
        let order = order.join(", ");
        let mut set = format!("{lock} = {}, {until} = {}", d.p(2), d.now_plus(3));
        if let Some(attempts) = &t.attempts {
            set.push_str(&format!(", {attempts} = {attempts} + 1"));
        }
        if let Some(extra) = &t.on_claim {
            set.push_str(", ");
            set.push_str(extra);
        }
        let key = t.concurrency_key.as_ref().map(|(column, limit)| {
            let at = d.statement_now();
            KeyLimit {
                column,
                limit: *limit,
                claimable: format!("({}) AND ({lock} IS NULL OR {until} < {at})", t.eligible),
                running: format!(
                    "(SELECT count(*) FROM {table} rolegate_running \
                     WHERE rolegate_running.{column} = {{row}}.{column} \
                     AND rolegate_running.{lock} IS NOT NULL AND rolegate_running.{until} >= {at})"
                ),
            }
        });
        let claim_with = |extra: &str| {
            let claim = Claim {
                d,
                table,
                id,
                set: &set,
                claimable: &claimable,
                extra,
                order: &order,
            };
            claim.statement(key.as_ref())
        };
        let partition_filter = t
            .partition_column
            .as_ref()
            .map(|c| format!(" AND {}", d.in_list(c, 4)))
            .unwrap_or_default();
        let mine = format!("{id} = {} AND {lock} = {}", d.p(1), d.p(2));
        let unlock = format!("{lock} = NULL, {until} = NULL");
        let many = format!("{} AND {lock} = {}", d.in_list(id, 1), d.p(2));
        // Each completed row says whether it is still eligible: an
        // `on_complete` that leaves it so would have it run again.
        let (complete, complete_many) = if t.delete_on_complete {
            (
                format!("DELETE FROM {table} WHERE {mine} RETURNING 0 = 1"),
                format!("DELETE FROM {table} WHERE {many} RETURNING CAST({id} AS BIGINT), 0 = 1"),
            )
        } else {
            let extra = t
                .on_complete
                .as_ref()
                .map(|s| format!(", {s}"))
                .unwrap_or_default();
            let still = &t.eligible;
            (
                format!("UPDATE {table} SET {unlock}{extra} WHERE {mine} RETURNING ({still})"),
                format!(
                    "UPDATE {table} SET {unlock}{extra} WHERE {many} RETURNING CAST({id} AS BIGINT), ({still})"
                ),
            )
        };
        // Now plus parameter 3 in milliseconds, by the database clock.
        let now_plus_ms = match d {
            Dialect::Postgres => {
                "clock_timestamp() + make_interval(secs => $3::float8 / 1000.0)".to_string()
            }
            Dialect::Sqlite => format!("{} + ?3", d.now()),
        };
        let fail_to = |retry: &str| {
            t.retry_column.as_ref().map(|col| {
                let extra = t
                    .on_fail
                    .as_ref()
                    .map(|s| format!(", {s}"))
                    .unwrap_or_default();
                format!("UPDATE {table} SET {unlock}, {col} = {retry}{extra} WHERE {mine}")
            })
        };
        let fail = fail_to(&d.time_param(3));
        let fail_after = fail_to(&now_plus_ms);
        Statements {
            claim: claim_with(""),
            claim_partitions: claim_with(&partition_filter),
            complete,
            complete_many,
            fail,
            fail_after,
            release: format!("UPDATE {table} SET {unlock} WHERE {mine}"),
            renew: format!("UPDATE {table} SET {until} = {now_plus_ms} WHERE {mine}"),
            dead: t.on_dead.as_ref().map(|set| {
                format!(
                    "UPDATE {table} SET {unlock}, {set} WHERE {mine} RETURNING ({})",
                    t.eligible
                )
            }),
            dialect: d,
            table: table.clone(),
            id: id.clone(),
            lock: lock.clone(),
            claimable,
        }
    }

    /// The claimable rows' count and, with `age`, the oldest one's age in
    /// seconds by the database clock.
    pub(crate) fn depth(&self, age: Option<&str>) -> String {
        let (table, claimable) = (&self.table, &self.claimable);
        let age = match (age, self.dialect) {
            (None, _) => "CAST(NULL AS DOUBLE PRECISION)".to_string(),
            (Some(c), Dialect::Postgres) => {
                format!(
                    "CAST(EXTRACT(EPOCH FROM clock_timestamp() - min({c})) AS DOUBLE PRECISION)"
                )
            }
            (Some(c), Dialect::Sqlite) => {
                format!("({} - min({c})) / 1000.0", self.dialect.now())
            }
        };
        format!("SELECT count(*), {age} FROM {table} WHERE {claimable}")
    }

    /// Parameters: age in ms, limit. Deletes finished, unlocked rows older
    /// than the age by `column`.
    pub(crate) fn prune(&self, finished: &str, column: &str) -> String {
        let (table, id, lock, d) = (&self.table, &self.id, &self.lock, self.dialect);
        let older = match d {
            Dialect::Postgres => {
                format!("{column} < clock_timestamp() - make_interval(secs => $1::float8 / 1000.0)")
            }
            Dialect::Sqlite => format!("{column} < {} - ?1", d.now()),
        };
        format!(
            "DELETE FROM {table} WHERE {id} IN (SELECT {id} FROM {table} WHERE ({finished}) AND {lock} IS NULL AND {older} LIMIT {})",
            d.p(2)
        )
    }
}

/// A per-key limit: at most `limit` rows with one value of `column` under a
/// live lease. `claimable` and `running` judge leases at the statement's
/// one time; `running` counts the key's running rows for the row `{row}`.
struct KeyLimit<'a> {
    column: &'a str,
    limit: u32,
    claimable: String,
    running: String,
}

/// The parts of one claim statement.
struct Claim<'a> {
    d: Dialect,
    table: &'a str,
    id: &'a str,
    set: &'a str,
    claimable: &'a str,
    extra: &'a str,
    order: &'a str,
}

impl Claim<'_> {
    /// The claim: pick up to `$1` claimable rows in order, then take them
    /// with one conditional `UPDATE` that restates the predicate. PostgreSQL
    /// locks the picked rows in the subquery and skips rows another
    /// statement holds: an `UPDATE` that locked rows one by one in plan order
    /// could deadlock against a concurrent claim or `complete_all` (SQLSTATE
    /// 40P01). Row locks last until the transaction ends, and the claim runs
    /// as a transaction of its own, so they last this one statement;
    /// `ARRAY(...)` runs the subquery once. SQLite has one writer at a time.
    ///
    /// With a per-key limit, a row may be picked only while it is among the
    /// first `limit - running` claimable rows of its key in queue order
    /// (`running`: the key's rows under a live lease, as the statement's
    /// snapshot sees them, every lease judged at the statement's one time),
    /// ranked over the whole table whatever partition filter the claim has,
    /// and the stamp restates the limit. Two claims
    /// that race therefore aim at the same first rows of a key, and the row
    /// locks let only one take each; a claim whose snapshot is older than a
    /// rival's commit finds those rows taken when its stamp re-checks them
    /// (PostgreSQL re-evaluates the stamp's predicate on a row changed since
    /// the statement began) and takes nothing of the key. This needs queue
    /// order to agree with eligibility (docs/work-rows.md, *Per-key limits*).
    /// A row whose key is NULL has no limit.
    fn statement(&self, key: Option<&KeyLimit<'_>>) -> String {
        let Claim {
            d,
            table,
            id,
            set,
            claimable,
            extra,
            order,
        } = *self;
        let batch = d.p(1);
        let pick = match key {
            None => {
                format!("SELECT {id} FROM {table} WHERE {claimable}{extra} ORDER BY {order} LIMIT {batch}")
            }
            Some(k) => {
                // Ranked over every claimable row of the key, whatever
                // `extra` (a partition filter) leaves to this claim: a key
                // whose rows span partitions is still limited, and in order.
                let (column, limit, ranked_from) = (k.column, k.limit, &k.claimable);
                let running = k.running.replace("{row}", "rolegate_ranked");
                format!(
                    "SELECT {id} FROM {table} WHERE {id} IN (SELECT rolegate_ranked.{id} FROM \
                     (SELECT {id}, {column}, row_number() OVER (PARTITION BY {column} ORDER BY {order}) AS rolegate_rank \
                     FROM {table} WHERE {ranked_from}) rolegate_ranked \
                     WHERE rolegate_ranked.{column} IS NULL OR (rolegate_ranked.rolegate_rank <= {limit} \
                     AND rolegate_ranked.rolegate_rank <= {limit} - {running})) \
                     AND {claimable}{extra} ORDER BY {order} LIMIT {batch}"
                )
            }
        };
        let picked = match d {
            Dialect::Postgres => format!("{id} = ANY(ARRAY({pick} FOR UPDATE SKIP LOCKED))"),
            Dialect::Sqlite => format!("{id} IN ({pick})"),
        };
        let limited = key
            .map(|k| {
                let running = k.running.replace("{row}", table);
                format!(
                    " AND ({table}.{column} IS NULL OR {running} < {limit})",
                    column = k.column,
                    limit = k.limit
                )
            })
            .unwrap_or_default();
        format!(
            "UPDATE {table} SET {set} WHERE {picked} AND {claimable}{extra}{limited} RETURNING *"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_restate_the_predicate_and_match_the_lock() {
        let t = WorkTable::new("outbox")
            .unwrap()
            .eligible("status = 'pending'")
            .order_by(&["run_at"])
            .unwrap()
            .on_claim("attempts = attempts + 1")
            .on_complete("status = 'done'")
            .on_fail("run_at", None)
            .unwrap();
        let s = Statements::new(&t, Dialect::Postgres);
        assert_eq!(
            s.claim.matches("(status = 'pending')").count(),
            2,
            "{}",
            s.claim
        );
        assert!(
            s.claim.contains("ORDER BY run_at, id LIMIT $1"),
            "{}",
            s.claim
        );
        assert!(s.claim.contains("attempts = attempts + 1"));
        assert!(s.claim.ends_with("RETURNING *"));
        assert!(
            s.claim.contains("LIMIT $1 FOR UPDATE SKIP LOCKED))"),
            "{}",
            s.claim
        );
        assert!(
            s.complete
                .ends_with("WHERE id = $1 AND lock_id = $2 RETURNING (status = 'pending')"),
            "{}",
            s.complete
        );
        assert!(s
            .fail
            .as_deref()
            .unwrap()
            .contains("run_at = to_timestamp($3::float8 / 1000.0)"));
        // fail_after reads the database clock, never an app-supplied time.
        assert!(
            s.fail_after.as_deref().unwrap().contains(
                "run_at = clock_timestamp() + make_interval(secs => $3::float8 / 1000.0)"
            ),
            "{:?}",
            s.fail_after
        );
        let q = Statements::new(&t, Dialect::Sqlite);
        assert!(
            q.fail_after.as_deref().unwrap().contains(
                "run_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + ?3"
            ),
            "{:?}",
            q.fail_after
        );
        assert!(q.claim.contains("LIMIT ?1") && q.complete.contains("lock_id = ?2"));
        assert!(!q.claim.contains("FOR UPDATE"), "{}", q.claim);
    }

    #[test]
    fn a_key_limit_ranks_the_pick_and_restates_the_limit_in_the_stamp() {
        let t = WorkTable::new("outbox")
            .unwrap()
            .eligible("status = 'pending'")
            .order_by(&["run_at"])
            .unwrap()
            .partition_column("partition_no")
            .unwrap()
            .concurrency_key("customer", 2)
            .unwrap();
        for d in [Dialect::Postgres, Dialect::Sqlite] {
            let s = Statements::new(&t, d);
            let at = d.statement_now();
            for claim in [&s.claim, &s.claim_partitions] {
                // Ranked over every claimable row of the key at one time.
                assert!(
                    claim.contains(&format!(
                        "row_number() OVER (PARTITION BY customer ORDER BY run_at, id) AS rolegate_rank \
                         FROM outbox WHERE (status = 'pending') AND (lock_id IS NULL OR locked_until < {at})) rolegate_ranked"
                    )),
                    "{claim}"
                );
                assert!(
                    claim.contains("rolegate_ranked.customer IS NULL OR (rolegate_ranked.rolegate_rank <= 2 AND rolegate_ranked.rolegate_rank <= 2 - (SELECT count(*) FROM outbox rolegate_running WHERE rolegate_running.customer = rolegate_ranked.customer"),
                    "{claim}"
                );
                assert!(
                    claim.contains(&format!(
                        "AND (outbox.customer IS NULL OR (SELECT count(*) FROM outbox rolegate_running \
                         WHERE rolegate_running.customer = outbox.customer AND rolegate_running.lock_id IS NOT NULL \
                         AND rolegate_running.locked_until >= {at}) < 2) RETURNING *"
                    )),
                    "{claim}"
                );
            }
            // The partition filter narrows the pick, never the ranking.
            let (ranking, pick) = s.claim_partitions.split_once(") rolegate_ranked").unwrap();
            assert!(!ranking.contains("partition_no"), "{ranking}");
            assert!(pick.contains("partition_no"), "{pick}");
        }
        assert!(WorkTable::new("outbox")
            .unwrap()
            .concurrency_key("c", 0)
            .is_err());
        assert!(WorkTable::new("outbox")
            .unwrap()
            .fifo_key("c; drop")
            .is_err());
        assert!(WorkTable::new("outbox").unwrap().fifo_key("s.c").is_err());
    }
}
