//! The module graph stays a DAG and the code stays in small pieces:
//! `scripts/architecture --check` (no import cycle between top-level modules
//! or between files of one module, no file in src/ over 600 lines, no
//! function over 80) must pass.

use std::process::Command;

#[test]
fn module_graph_has_no_cycle_and_code_stays_small() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("python3")
        .arg(format!("{root}/scripts/architecture"))
        .arg("--check")
        .output()
        .expect("python3 is needed to run scripts/architecture (apt-get install python3)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/architecture --check:\n{text}"
    );
    assert!(text.contains("no import cycle"), "{text}");
}
