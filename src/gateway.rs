//! The binary's wiring: config → store → coordinator → listeners.

use std::path::Path;
use std::process::ExitCode;

pub async fn run(path: &Path) -> ExitCode {
    let _ = path;
    eprintln!("error: run is not wired yet");
    ExitCode::from(crate::cli::EXIT_RUNTIME)
}
