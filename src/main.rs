#![forbid(unsafe_code)]

//! The `rolegate` binary: everything lives in the library's CLI module.

fn main() -> std::process::ExitCode {
    rolegate::cli_main()
}
