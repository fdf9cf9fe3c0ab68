#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use rolegate::cli::{self, Cli, Command};

fn main() -> ExitCode {
    let args = Cli::parse();
    cli::init_logging(args.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(cli::EXIT_RUNTIME);
        }
    };
    runtime.block_on(async move {
        match args.command.unwrap_or(Command::Run { events: None }) {
            Command::Run { events } => {
                rolegate::gateway::run(&args.config, events.as_deref()).await
            }
            Command::CheckConfig => cli::check_config(&args.config).await,
            Command::Migrate => cli::migrate(&args.config).await,
            Command::Status { json } => cli::status(&args.config, json).await,
            Command::Resolve {
                partition,
                key,
                scope,
            } => cli::resolve(&args.config, &partition, &key, scope.as_deref()),
            Command::Demo {
                base_port,
                store,
                store_url,
            } => {
                let options = rolegate::demo::DemoOptions {
                    base_port,
                    store,
                    store_url,
                };
                rolegate::demo::run(options).await
            }
            Command::Probe { url } => cli::probe(&url).await,
            Command::DemoApp { port, name } => rolegate::demo::run_app(port, name).await,
        }
    })
}
