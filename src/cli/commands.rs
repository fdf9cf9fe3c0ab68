//! One function per subcommand that reads a config.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use super::{fail, load_config, EXIT_CONFIG, EXIT_RUNTIME};
use crate::store::LeaseRecord;

/// `rolegate run`: runs until SIGTERM/SIGINT, then drains and releases.
pub(super) async fn run(path: &Path, events: Option<&Path>, workers: Option<usize>) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if config.upstream.is_none() {
        tell!(
            "error: {}: upstream.url is required to run the gateway",
            path.display()
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let events = match events.map(crate::events::EventLog::create).transpose() {
        Ok(e) => e.map(Arc::new),
        Err(e) => {
            tell!("error: cannot open the event log: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let workers = workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    // What check-config refuses, `run` refuses the same way (exit 2), so a
    // service manager stops restarting a config that cannot work.
    if let Some(code) = refuse_files(path, &config) {
        return code;
    }
    match crate::gateway::run(config, events, workers).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_config() => {
            tell!("error: {}: {}", path.display(), super::report(&e));
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => fail(&e),
    }
}

/// The files a start would read (the store's TLS files and SQLite
/// directory, the listener's and peers' certificates), checked as opening
/// them would; `Some(exit 2)` after printing why, when one is unusable.
fn refuse_files(path: &Path, config: &crate::config::Config) -> Option<ExitCode> {
    if let Err(e) = crate::store::check_files(&config.store) {
        tell!("error: {}: {}", path.display(), super::report(&e));
        return Some(ExitCode::from(EXIT_CONFIG));
    }
    if let Err(e) = crate::tls::check_files(config.tls.as_ref(), &config.peers) {
        tell!("error: {}: {}", path.display(), e.report());
        return Some(ExitCode::from(EXIT_CONFIG));
    }
    None
}

/// `rolegate check-config --connect`: the `store` section only, then the
/// store itself.
pub(super) async fn check_store(path: &Path) -> ExitCode {
    let store_config = match crate::config::Config::load_store(path) {
        Ok(c) => c,
        Err(e) => {
            tell!("error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(e) = crate::store::check_files(&store_config) {
        tell!("error: {}: {}", path.display(), super::report(&e));
        return ExitCode::from(EXIT_CONFIG);
    }
    let store = match crate::store::connect(&store_config).await {
        Ok(s) => s,
        Err(e) if e.is_config() => {
            tell!("error: {}: {}", path.display(), super::report(&e));
            return ExitCode::from(EXIT_CONFIG);
        }
        Err(e) => return fail(&e),
    };
    // The first call opens the connection; the second is one round trip.
    if let Err(e) = store.check_access().await {
        if e.is_schema() && store_config.migrate {
            say!(
                "{}: the schema is not applied yet; the first gateway applies it (store.migrate: true)",
                path.display()
            );
        } else {
            return fail(&e);
        }
    }
    let started = std::time::Instant::now();
    let checked = store.snapshot(&[]).await;
    let round_trip = started.elapsed();
    match checked {
        Ok(records) => {
            say!(
                "{}: store ok ({} store, table {}, {} records, schema applied, read and write granted); round trip {:.1} ms",
                path.display(),
                store.kind(),
                store_config.table,
                records.len(),
                round_trip.as_secs_f64() * 1000.0
            );
            ExitCode::SUCCESS
        }
        Err(e) if e.is_schema() && store_config.migrate => {
            say!(
                "{}: store reachable ({} store); round trip not measured before the schema exists",
                path.display(),
                store.kind()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

pub(super) fn check_config(path: &Path, print: bool) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(code) = refuse_files(path, &config) {
        return code;
    }
    if print {
        say_raw!("{}", config.to_yaml());
    } else {
        let roles: u64 = config.roles.len() as u64
            + config
                .partitions
                .iter()
                .map(|p| u64::from(p.count))
                .sum::<u64>();
        say!(
            "{}: ok ({} store, {}, {}); --print shows it resolved",
            path.display(),
            config.store.kind.as_str(),
            count(roles, "role"),
            count(config.routes.len() as u64, "route")
        );
        if let Some(warning) = config.per_role_series_warning() {
            tell!("warning: {warning}");
        }
    }
    ExitCode::SUCCESS
}

pub(super) async fn migrate(path: &Path) -> ExitCode {
    // Only the store section, as `status`: run it from wherever the store's
    // credentials are.
    let store_config = match crate::config::Config::load_store(path) {
        Ok(c) => c,
        Err(e) => {
            tell!("error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let store = match crate::store::connect(&store_config).await {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    match store.migrate().await {
        Ok(()) => {
            say!("schema applied to {} store", store.kind());
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

pub(super) async fn status(path: &Path, json: bool) -> ExitCode {
    // Only the store section (and its `${VAR}`s): from any machine that can
    // reach the store.
    let store_config = match crate::config::Config::load_store(path) {
        Ok(c) => c,
        Err(e) => {
            tell!("error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let result = async {
        let store = crate::store::connect(&store_config).await?;
        store.snapshot(&[]).await
    }
    .await;
    let mut records = match result {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    // `devices:partition-2` before `devices:partition-10`.
    records.sort_by(|a, b| role_order(&a.role).cmp(&role_order(&b.role)));
    if json {
        let rows: Vec<_> = records
            .iter()
            .map(|r| {
                serde_json::json!({
                    "role": r.role, "holder": r.holder, "holder_address": r.holder_address,
                    "token": r.token, "valid_for_ms": r.remaining.as_millis() as u64,
                })
            })
            .collect();
        say!("{}", serde_json::Value::Array(rows));
    } else {
        print_table(&records);
        print_spread(&partitions_of(path, &records), &records);
    }
    ExitCode::SUCCESS
}

/// `1 role`, `2 roles`.
fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Sorts a partition's roles by their number, other roles by name.
fn role_order(role: &str) -> (&str, u32, &str) {
    match role.rsplit_once(":partition-") {
        Some((name, i)) => match i.parse() {
            Ok(i) => (name, i, ""),
            Err(_) => (role, 0, role),
        },
        None => (role, 0, ""),
    }
}

/// A partition as the spread lines show it.
struct PartitionLine {
    name: String,
    count: u32,
    balanced: bool,
}

/// The partitions to show: the config's when all of it resolves here, else
/// those the records name (`{name}:partition-{i}`).
fn partitions_of(path: &Path, records: &[LeaseRecord]) -> Vec<PartitionLine> {
    if let Ok(config) = crate::config::Config::load(path) {
        return (config.partitions.iter())
            .map(|p| PartitionLine {
                name: p.name.to_string(),
                count: p.count,
                balanced: p.balance,
            })
            .collect();
    }
    let mut counts: std::collections::BTreeMap<&str, u32> = Default::default();
    for r in records {
        if let Some((name, _)) = r.role.split_once(":partition-") {
            *counts.entry(name).or_default() += 1;
        }
    }
    (counts.into_iter())
        .map(|(name, count)| PartitionLine {
            name: name.to_string(),
            count,
            balanced: false,
        })
        .collect()
}

/// Per partition, how many of its roles each live holder has.
fn print_spread(partitions: &[PartitionLine], records: &[LeaseRecord]) {
    for p in partitions {
        let prefix = format!("{}:partition-", p.name);
        let mut by_holder: std::collections::BTreeMap<&str, usize> = Default::default();
        for r in records.iter().filter(|r| r.role.starts_with(&prefix)) {
            let live = r.holder.as_deref().filter(|_| !r.remaining.is_zero());
            *by_holder.entry(live.unwrap_or("(no holder)")).or_default() += 1;
        }
        let spread: Vec<String> = by_holder.iter().map(|(h, n)| format!("{h} {n}")).collect();
        say!(
            "partition {} ({}{}): {}",
            p.name,
            count(u64::from(p.count), "role"),
            if p.balanced { ", balanced" } else { "" },
            spread.join(", ")
        );
    }
}

/// The lease table as aligned columns.
fn print_table(records: &[LeaseRecord]) {
    let mut rows = vec![[
        "ROLE".to_string(),
        "HOLDER".into(),
        "ADDRESS".into(),
        "TOKEN".into(),
        "VALID FOR".into(),
    ]];
    for r in records {
        let live = r.holder.is_some() && !r.remaining.is_zero();
        rows.push([
            r.role.clone(),
            if live {
                r.holder.clone().unwrap_or_default()
            } else {
                "-".into()
            },
            if live {
                r.holder_address.clone().unwrap_or_default()
            } else {
                "-".into()
            },
            r.token.to_string(),
            if live {
                format!("{}ms", r.remaining.as_millis())
            } else {
                "expired".into()
            },
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        say!("{}", line.join("  ").trim_end());
    }
}

pub(super) async fn probe(url: &str) -> ExitCode {
    let forwarder = match crate::proxy::Forwarder::new(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3),
    ) {
        Ok(f) => f,
        Err(e) => return fail(&e),
    };
    if forwarder
        .probe(
            url,
            crate::proxy::HopProtocol::Http1,
            std::time::Duration::from_secs(3),
        )
        .await
    {
        ExitCode::SUCCESS
    } else {
        tell!("unhealthy: {url}");
        ExitCode::from(EXIT_RUNTIME)
    }
}

pub(super) fn resolve(path: &Path, partition: &str, key: &str, scope: Option<&str>) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Some(p) = config.partitions.iter().find(|p| p.name == partition) else {
        if config.roles.iter().any(|r| r.name == partition) {
            tell!(
                "error: `{partition}` is a role, not a partition, in {}: only partitions are chosen by a key",
                path.display()
            );
        } else {
            tell!(
                "error: partition `{partition}` is not declared in {}",
                path.display()
            );
        }
        return ExitCode::from(EXIT_CONFIG);
    };
    let index = crate::lease::partition_index(scope, key, p.count);
    say!("{}", crate::role::partition_role_name(partition, index));
    ExitCode::SUCCESS
}

/// `rolegate partitions list`: each partition's definition in this config
/// and the one the store records.
pub(super) async fn partitions_list(path: &Path) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let records = async {
        let store = crate::store::connect(&config.store).await?;
        store.partitions().await
    }
    .await;
    let records = match records {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    let mut names: Vec<String> = config
        .partitions
        .iter()
        .map(|p| p.name.to_string())
        .collect();
    names.extend(records.iter().map(|r| r.name.clone()));
    names.sort();
    names.dedup();
    for name in names {
        let here = config
            .partitions
            .iter()
            .find(|p| p.name.as_str() == name)
            .map(|p| crate::lease::definition_text(p.count, &config.partition_scopes(&p.name)));
        let recorded = records.iter().find(|r| r.name == name);
        let verdict = match (&here, recorded) {
            (Some(h), Some(r)) if *h == r.definition => "same",
            (Some(_), Some(_)) => "DIFFERENT",
            (Some(_), None) => "not recorded yet",
            (None, _) => "not in this config",
        };
        say!("{name}: {verdict}");
        if let Some(h) = &here {
            say!("  this config: {h}");
        }
        if let Some(r) = recorded {
            let settling = if r.settling.is_zero() {
                String::new()
            } else {
                format!(", settling for {:?} more", r.settling)
            };
            say!(
                "  store:       {} (epoch {}{settling})",
                r.definition,
                r.epoch
            );
        }
    }
    ExitCode::SUCCESS
}

/// `rolegate partitions resize NAME COUNT`: records the new definition.
pub(super) async fn partitions_resize(
    path: &Path,
    name: &str,
    count: u32,
    settle: Option<std::time::Duration>,
) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Some(partition) = config.partitions.iter().find(|p| p.name.as_str() == name) else {
        tell!(
            "error: {}: no partition `{name}` in this config",
            path.display()
        );
        return ExitCode::from(EXIT_CONFIG);
    };
    if count == 0 || count > 65_536 {
        tell!("error: a partition count must be between 1 and 65536, not {count}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let least = partition.duration;
    let settle = settle.unwrap_or(least).max(least);
    let scopes = config.partition_scopes(&partition.name);
    let result = async {
        let store = crate::store::connect(&config.store).await?;
        crate::lease::redefine_partition(&*store, name, count, &scopes, settle).await
    }
    .await;
    match result {
        Ok((record, false)) => {
            say!(
                "partition `{name}` is already recorded as `{}` (epoch {}); nothing changed",
                record.definition,
                record.epoch
            );
            ExitCode::SUCCESS
        }
        Ok((record, true)) => {
            say!(
                "partition `{name}` is now `{}` (epoch {}). No instance serves it for the next {:?}; then instances deployed with count {count} serve it, and the others answer 503 partition-mismatch until they are",
                record.definition, record.epoch, record.settling
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}
