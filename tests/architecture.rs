//! The module graph stays a DAG: `scripts/architecture --check` (no import
//! cycle between top-level modules or between files of one module) must pass.

use std::process::Command;

#[test]
fn module_graph_has_no_import_cycle() {
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
