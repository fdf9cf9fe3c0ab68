//! What a Redis keeps across a restart, and whether a failover can lose
//! writes: asked once per store, after its first connection, and logged at
//! WARN when leases would be lost or a replica could take over without them.

use redis::aio::ConnectionManager;

/// Whether the server writes its data to disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Persistence {
    /// An append-only file, RDB snapshots, or both.
    On,
    /// Neither: a restart starts from an empty data set.
    Off,
    /// `CONFIG` was refused and `INFO persistence` says the append-only
    /// file is off; whether RDB snapshots are set cannot be read there.
    NoAppendOnlyFileSnapshotsUnknown,
}

/// Judges `CONFIG GET appendonly` and `CONFIG GET save` answers (the
/// values, `yes`/`no` and a list of save points, empty when off).
pub(super) fn persistence_from_config(appendonly: &str, save: &str) -> Persistence {
    if appendonly.trim().eq_ignore_ascii_case("yes") || !save.trim().is_empty() {
        Persistence::On
    } else {
        Persistence::Off
    }
}

/// Judges an `INFO persistence` answer, for a server that refuses `CONFIG`.
pub(super) fn persistence_from_info(info: &str) -> Option<Persistence> {
    match info_field(info, "aof_enabled")? {
        "1" => Some(Persistence::On),
        _ => Some(Persistence::NoAppendOnlyFileSnapshotsUnknown),
    }
}

/// The number of replicas in an `INFO replication` answer.
pub(super) fn replicas_from_info(info: &str) -> Option<u64> {
    info_field(info, "connected_slaves")?.parse().ok()
}

/// One `field:value` line of an `INFO` answer.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
}

/// `CONFIG GET name`: the value, or `None` when the command is refused
/// (renamed or disabled, as managed services do, or not permitted).
async fn config_get(conn: &mut ConnectionManager, name: &str) -> Option<String> {
    let pairs: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await
        .ok()?;
    pairs.get(1).cloned()
}

async fn info(conn: &mut ConnectionManager, section: &str) -> Option<String> {
    redis::cmd("INFO").arg(section).query_async(conn).await.ok()
}

/// Asks the server and logs what a restart or a failover would cost.
pub(super) async fn check(mut conn: ConnectionManager, at: String) {
    let config = match (
        config_get(&mut conn, "appendonly").await,
        config_get(&mut conn, "save").await,
    ) {
        (Some(aof), Some(save)) => Some(persistence_from_config(&aof, &save)),
        _ => None,
    };
    let persistence = match config {
        Some(p) => Some(p),
        None => info(&mut conn, "persistence")
            .await
            .as_deref()
            .and_then(persistence_from_info),
    };
    match persistence {
        Some(Persistence::On) => {}
        Some(Persistence::Off) => tracing::warn!(
            redis = %at,
            "Redis keeps no data across a restart (appendonly no, save \"\"): every lease is lost \
             when it restarts, and each role goes without a holder until a gateway claims it again; \
             fencing tokens stay monotonic (they follow the server clock). Set appendonly yes to keep leases"
        ),
        Some(Persistence::NoAppendOnlyFileSnapshotsUnknown) => tracing::warn!(
            redis = %at,
            "Redis keeps no data across a restart unless RDB snapshots are set (appendonly is off; \
             CONFIG is refused, so save could not be read): every lease may be lost when it restarts; \
             fencing tokens stay monotonic (they follow the server clock). Set appendonly yes to keep leases"
        ),
        None => tracing::info!(
            redis = %at,
            "could not read Redis's persistence settings (CONFIG and INFO refused)"
        ),
    }
    let replicas = info(&mut conn, "replication")
        .await
        .as_deref()
        .and_then(replicas_from_info);
    if let Some(n) = replicas.filter(|&n| n > 0) {
        tracing::warn!(
            redis = %at,
            replicas = n,
            "Redis has replicas attached: replication is asynchronous, so a failover to a replica can \
             lose the latest grants and releases, and two instances may then hold a role at once until \
             the older term expires (see docs/stores.md)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_with_neither_file_nor_snapshots_is_off() {
        assert_eq!(persistence_from_config("no", ""), Persistence::Off);
        assert_eq!(persistence_from_config("yes", ""), Persistence::On);
        assert_eq!(
            persistence_from_config("no", "3600 1 300 100 60 10000"),
            Persistence::On
        );
    }

    #[test]
    fn info_persistence_knows_only_the_append_only_file() {
        let info = "# Persistence\r\nloading:0\r\naof_enabled:0\r\naof_rewrite_in_progress:0\r\n";
        assert_eq!(
            persistence_from_info(info),
            Some(Persistence::NoAppendOnlyFileSnapshotsUnknown)
        );
        assert_eq!(
            persistence_from_info("aof_enabled:1\r\n"),
            Some(Persistence::On)
        );
        assert_eq!(persistence_from_info("loading:0\r\n"), None);
    }

    #[test]
    fn replicas_are_counted_from_info_replication() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=10.0.0.2\r\n";
        assert_eq!(replicas_from_info(info), Some(2));
        assert_eq!(replicas_from_info("role:master\r\n"), None);
    }
}
