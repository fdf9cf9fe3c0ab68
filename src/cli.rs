//! The command line: `run` (default), `check-config`, `migrate`, `status`,
//! `resolve`. Exit codes: 0 success, 2 usage or config, 1 runtime failure.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::Config;

#[derive(Debug, Parser)]
#[command(name = "rolegate", version, about = "Lease-coordinated HTTP gateway")]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Config file (for `run` when no subcommand is given).
    #[arg(long, short, global = true, default_value = "rolegate.yaml")]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (the default).
    Run {
        /// Append a JSON-lines log of held intervals and local admissions
        /// (CLOCK_MONOTONIC nanoseconds) to FILE, for fault-injection checks.
        #[arg(long, value_name = "FILE")]
        events: Option<PathBuf>,
    },
    /// Validate the config and print it resolved (exit 2 when refused).
    CheckConfig,
    /// Apply the store schema.
    Migrate,
    /// Print the store's lease table.
    Status {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A local cluster: three gateways and three demo apps on the embedded store.
    Demo {
        /// First public port (admin ports at +10, apps at +20); 0 picks free ports.
        #[arg(long, default_value_t = 8081)]
        base_port: u16,
        /// Store kind for the demo cluster.
        #[arg(long, default_value = "sqlite")]
        store: String,
        /// Store URL (needed for every store but sqlite).
        #[arg(long)]
        store_url: Option<String>,
    },
    /// GET a URL; exit 0 on a 2xx answer within 3 s (container health checks).
    Probe { url: String },
    /// The demo's app (used by `demo`).
    #[command(hide = true)]
    DemoApp {
        #[arg(long)]
        port: u16,
        #[arg(long)]
        name: String,
    },
    /// Which partition role a key maps to.
    Resolve {
        partition: String,
        key: String,
        #[arg(long)]
        scope: Option<String>,
    },
}

pub const EXIT_RUNTIME: u8 = 1;
pub const EXIT_CONFIG: u8 = 2;

/// Loads the config or prints the refusal; `Err` carries the exit code.
pub fn load_config(path: &std::path::Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|e| {
        eprintln!("error: {e}");
        ExitCode::from(EXIT_CONFIG)
    })
}

pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

pub async fn check_config(path: &std::path::Path) -> ExitCode {
    match load_config(path) {
        Ok(c) => {
            print!("{}", c.to_yaml());
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

pub async fn migrate(path: &std::path::Path) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut store_config = config.store.clone();
    store_config.migrate = false;
    let store = match crate::store::open(&store_config).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    match store.migrate().await {
        Ok(()) => {
            println!("schema applied to {} store", store.kind());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

pub async fn status(path: &std::path::Path, json: bool) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut store_config = config.store.clone();
    store_config.migrate = false;
    let result = async {
        let store = crate::store::open(&store_config).await?;
        store.snapshot(&[]).await
    }
    .await;
    let records = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
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
        return ExitCode::SUCCESS;
    }
    let mut rows = vec![[
        "ROLE".to_string(),
        "HOLDER".into(),
        "ADDRESS".into(),
        "TOKEN".into(),
        "VALID FOR".into(),
    ]];
    for r in &records {
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
    ExitCode::SUCCESS
}

pub async fn probe(url: &str) -> ExitCode {
    let forwarder = match crate::proxy::Forwarder::new(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3),
    ) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    if forwarder
        .probe(url, std::time::Duration::from_secs(3))
        .await
    {
        ExitCode::SUCCESS
    } else {
        eprintln!("unhealthy: {url}");
        ExitCode::from(EXIT_RUNTIME)
    }
}

pub fn resolve(
    path: &std::path::Path,
    partition: &str,
    key: &str,
    scope: Option<&str>,
) -> ExitCode {
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
