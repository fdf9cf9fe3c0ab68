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
        eprintln!(
            "error: {}: upstream.url is required to run the gateway",
            path.display()
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let events = match events.map(crate::events::EventLog::create).transpose() {
        Ok(e) => e.map(Arc::new),
        Err(e) => {
            eprintln!("error: cannot open the event log: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let workers = workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    match crate::gateway::run(config, events, workers).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

pub(super) fn check_config(path: &Path, print: bool) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // The store's TLS files, read and checked as opening the store would.
    if let Err(e) = crate::store::check_tls_files(&config.store) {
        eprintln!("error: {}: {}", path.display(), super::report(&e));
        return ExitCode::from(EXIT_CONFIG);
    }
    // The files `run` would read at start: a bad pair is refused here too.
    if let Err(e) = crate::tls::check_files(config.tls.as_ref(), &config.peers) {
        eprintln!("error: {}: {}", path.display(), e.report());
        return ExitCode::from(super::EXIT_CONFIG);
    }
    if print {
        print!("{}", config.to_yaml());
    } else {
        let roles: u64 = config.roles.len() as u64
            + config
                .partitions
                .iter()
                .map(|p| u64::from(p.count))
                .sum::<u64>();
        println!(
            "{}: ok ({} store, {roles} roles, {} routes); --print shows it resolved",
            path.display(),
            config.store.kind.as_str(),
            config.routes.len()
        );
    }
    ExitCode::SUCCESS
}

pub(super) async fn migrate(path: &Path) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let store = match crate::store::connect(&config.store).await {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    match store.migrate().await {
        Ok(()) => {
            println!("schema applied to {} store", store.kind());
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

pub(super) async fn status(path: &Path, json: bool) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let result = async {
        let store = crate::store::connect(&config.store).await?;
        store.snapshot(&[]).await
    }
    .await;
    let records = match result {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
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
        println!("{}", serde_json::Value::Array(rows));
    } else {
        print_table(&records);
        print_spread(&config, &records);
    }
    ExitCode::SUCCESS
}

/// Per partition, how many of its roles each live holder has.
fn print_spread(config: &crate::config::Config, records: &[LeaseRecord]) {
    for p in &config.partitions {
        let prefix = format!("{}:partition-", p.name);
        let mut by_holder: std::collections::BTreeMap<&str, usize> = Default::default();
        for r in records.iter().filter(|r| r.role.starts_with(&prefix)) {
            let live = r.holder.as_deref().filter(|_| !r.remaining.is_zero());
            *by_holder.entry(live.unwrap_or("(no holder)")).or_default() += 1;
        }
        let spread: Vec<String> = by_holder.iter().map(|(h, n)| format!("{h} {n}")).collect();
        println!(
            "partition {} ({} roles{}): {}",
            p.name,
            p.count,
            if p.balance { ", balanced" } else { "" },
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
        println!("{}", line.join("  ").trim_end());
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
        eprintln!("unhealthy: {url}");
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
            eprintln!(
                "error: `{partition}` is a role, not a partition, in {}: only partitions are chosen by a key",
                path.display()
            );
        } else {
            eprintln!(
                "error: partition `{partition}` is not declared in {}",
                path.display()
            );
        }
        return ExitCode::from(EXIT_CONFIG);
    };
    let index = crate::lease::partition_index(scope, key, p.count);
    println!("{}", crate::role::partition_role_name(partition, index));
    ExitCode::SUCCESS
}
