//! The command line: `run` (default), `check-config`, `migrate`, `status`,
//! `resolve`, `demo`, `probe`. Exit codes: 0 success, 2 usage or config,
//! 1 runtime failure. This is the binary's edge: errors are rendered here,
//! with their whole chain of causes.

/// A line to stdout. Output that cannot be written (a closed pipe, a `| head`,
/// a journal that went away) is lost; the process goes on. Every line the
/// binary writes goes through this or `tell!`, never `println!`, which
/// panics on a closed stdout.
macro_rules! say {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Text to stdout without a newline, under `say!`'s rule.
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = write!(out, $($arg)*);
        let _ = out.flush();
    }};
}

/// A line to stderr, under `say!`'s rule.
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod commands;
mod demo;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::Config;

#[derive(Debug, Parser)]
#[command(name = "rolegate", version, about = "Lease-coordinated HTTP gateway")]
pub(crate) struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Config file (for `run` when no subcommand is given).
    #[arg(long, short, global = true, default_value = "rolegate.yaml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the gateway (the default).
    Run {
        /// Append a JSON-lines log of held intervals and local admissions
        /// (CLOCK_MONOTONIC nanoseconds) to FILE, for fault-injection checks.
        #[arg(long, value_name = "FILE")]
        events: Option<PathBuf>,
        /// Request-serving threads, each with its own listener (SO_REUSEPORT)
        /// and its own upstream connections [default: the number of cores].
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
        workers: Option<u16>,
    },
    /// Validate the config (exit 2 when refused).
    CheckConfig {
        /// Print the resolved config, every default filled in; it is a
        /// valid config itself (secrets become `${VAR}` references).
        #[arg(long)]
        print: bool,
        /// Check the store instead, from the `store` section alone (only its
        /// `${VAR}`s need be set): connect, check the schema and the grants,
        /// report the round trip. Exit 1 when the store refuses.
        #[arg(long, conflicts_with = "print")]
        connect: bool,
    },
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
    /// Partition definitions recorded in the store.
    #[command(subcommand)]
    Partitions(PartitionsCommand),
    /// Which partition role a key maps to.
    Resolve {
        partition: String,
        key: String,
        #[arg(long)]
        scope: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum PartitionsCommand {
    /// List each partition's definition: this config's and the store's.
    List,
    /// Record a new definition of partition NAME with COUNT roles (and the
    /// scopes of this config's routes): an explicit migration. Every
    /// instance ends its terms of the partition; no instance serves it
    /// until the change settles (the longest lease duration); then
    /// instances deployed with the new definition serve it and the others
    /// answer 503 partition-mismatch.
    Resize {
        /// The partition.
        name: String,
        /// Its new number of roles, 1 to 65536.
        count: u32,
        /// How long nobody serves the partition [default: the partition's
        /// lease duration in this config]. Never shorter than that.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        settle: Option<std::time::Duration>,
    },
}

/// Exit code of a runtime failure (store down, port taken).
pub(crate) const EXIT_RUNTIME: u8 = 1;
/// Exit code of a usage or config error.
pub(crate) const EXIT_CONFIG: u8 = 2;

/// Loads the config or prints the refusal; `Err` carries the exit code.
/// Loads a config, or prints why not and gives the exit code.
pub(crate) fn load_config(path: &std::path::Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|e| {
        tell!("error: {e}");
        ExitCode::from(EXIT_CONFIG)
    })
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    // rolegate at info; everything else (sqlx notices, hyper, tonic) at warn.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,rolegate=info"));
    // Colour only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        // A log line that cannot be written is lost; by default the
        // subscriber would report that with `eprintln!`, which panics the
        // task that logged when stderr is closed.
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// An error with its causes, `outer: cause: root cause`, each said once.
pub(crate) fn report(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    crate::redact::redact_text(&text)
}

/// Prints an error with its causes and gives the runtime-failure exit code.
pub(crate) fn fail(error: &dyn std::error::Error) -> ExitCode {
    tell!("error: {}", report(error));
    ExitCode::from(EXIT_RUNTIME)
}

/// The `rolegate` binary: parses the arguments and runs one command.
pub fn main() -> ExitCode {
    let args = Cli::parse();
    init_logging(args.log_format);
    // A small main runtime: the coordinator, the admin listener and the
    // health probe. `run` serves requests on worker threads of their own.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tell!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let code = runtime.block_on(dispatch(args));
    // The command is done: nothing left may hold the exit (a pool's
    // connections, a lookup on a blocking thread).
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}

async fn dispatch(args: Cli) -> ExitCode {
    let config = args.config.as_path();
    let default = Command::Run {
        events: None,
        workers: None,
    };
    match args.command.unwrap_or(default) {
        Command::Run { events, workers } => {
            commands::run(config, events.as_deref(), workers.map(usize::from)).await
        }
        Command::CheckConfig { print, connect } => {
            if connect {
                commands::check_store(config).await
            } else {
                commands::check_config(config, print)
            }
        }
        Command::Migrate => commands::migrate(config).await,
        Command::Status { json } => commands::status(config, json).await,
        Command::Partitions(PartitionsCommand::List) => commands::partitions_list(config).await,
        Command::Partitions(PartitionsCommand::Resize {
            name,
            count,
            settle,
        }) => commands::partitions_resize(config, &name, count, settle).await,
        Command::Resolve {
            partition,
            key,
            scope,
        } => commands::resolve(config, &partition, &key, scope.as_deref()),
        Command::Demo {
            base_port,
            store,
            store_url,
        } => {
            let options = demo::DemoOptions {
                base_port,
                store,
                store_url,
            };
            demo::run(options).await
        }
        Command::Probe { url } => commands::probe(&url).await,
        Command::DemoApp { port, name } => demo::run_app(port, name).await,
    }
}
