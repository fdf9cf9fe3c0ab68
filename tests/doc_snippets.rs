//! The docs cannot drift from the code: every YAML snippet in `docs/` and
//! the README passes `rolegate check-config` (the real binary, with its
//! `${VAR}`s set and the certificate files it names made), and every Rust
//! snippet not marked `ignore` is compiled as a doctest (`cargo test --doc`),
//! which this test checks by finding its page among the crate's doc includes.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::cluster;
use support::tls::TlsFiles;

/// One fenced block: where it starts, its info string, its text (dedented),
/// and whether the line before it says it is not a rolegate config.
struct Snippet {
    file: String,
    line: usize,
    info: String,
    text: String,
    not_a_config: bool,
}

/// Marks a YAML block that is some other program's (a pod spec fragment).
const NOT_A_CONFIG: &str = "<!-- not a rolegate config -->";

fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.push(root.join("README.md"));
    pages.sort();
    pages
}

fn snippets(page: &Path) -> Vec<Snippet> {
    let text = std::fs::read_to_string(page).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let name = page
        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap()
        .display()
        .to_string();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            let indent = lines[i].len() - trimmed.len();
            let start = i;
            let mut body = Vec::new();
            i += 1;
            while i < lines.len() && lines[i].trim() != "```" {
                body.push(lines[i].get(indent..).unwrap_or(lines[i].trim_start()));
                i += 1;
            }
            out.push(Snippet {
                file: name.trim_start_matches('/').to_string(),
                line: start + 1,
                info: info.trim().to_string(),
                text: body.join("\n") + "\n",
                not_a_config: start > 0 && lines[start - 1].trim() == NOT_A_CONFIG,
            });
        }
        i += 1;
    }
    out
}

/// A value for each `${VAR}` a snippet uses.
fn env_for(text: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else { break };
        let name = &after[..end];
        let value = if name.contains("ADVERTISE") {
            "http://10.0.0.11:8080".to_string()
        } else if name.ends_with("_HOST") {
            "db.internal:5432".to_string()
        } else if name.ends_with("_NAME") {
            "app".to_string()
        } else {
            "0123456789abcdef0123456789abcdef".to_string()
        };
        env.insert(name.to_string(), value);
        rest = &after[end..];
    }
    env
}

/// The snippet with every `/etc/rolegate/...` file it names made real: CA
/// files get the test CA, the gateway's own pair the server pair, and every
/// other certificate and key the client pair.
fn with_real_files(text: &str, files: &TlsFiles) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("/etc/rolegate/") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || "/._-".contains(c)))
            .unwrap_or(tail.len());
        let path = &tail[..end];
        let name = path.rsplit('/').next().unwrap();
        let is_key = name.ends_with(".key") || name.ends_with("-key.pem");
        let real = if name.ends_with("ca.pem") {
            &files.ca
        } else if name.starts_with("gateway") {
            if is_key {
                &files.server_key
            } else {
                &files.server_cert
            }
        } else if is_key {
            &files.client_key
        } else {
            &files.client_cert
        };
        out.push_str(&real.display().to_string());
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn every_yaml_snippet_in_the_docs_passes_check_config() {
    let files = TlsFiles::generate("doc_snippets");
    let dir = support::test_dir("doc_snippets_yaml");
    let mut checked = 0;
    let mut failures = Vec::new();
    for page in pages() {
        for s in snippets(&page) {
            if !matches!(s.info.as_str(), "yaml" | "yml") || s.not_a_config {
                continue;
            }
            let path = dir.join(format!("{}-{}.yaml", s.file.replace('/', "_"), s.line));
            std::fs::write(&path, with_real_files(&s.text, &files)).unwrap();
            let out = Command::new(cluster::bin())
                .args(["check-config", "--config"])
                .arg(&path)
                .env_clear()
                .envs(env_for(&s.text))
                .output()
                .unwrap();
            checked += 1;
            if !out.status.success() {
                failures.push(format!(
                    "{}:{}: {}",
                    s.file,
                    s.line,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }
    assert!(checked >= 10, "only {checked} YAML snippets found");
    assert!(
        failures.is_empty(),
        "YAML snippets refused by check-config (fix the doc, or mark a block that is not a rolegate config with `{NOT_A_CONFIG}` on the line before it):\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_rust_snippet_in_the_docs_is_compiled_as_a_doctest() {
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    let mut rust_pages = 0;
    for page in pages() {
        let rust: Vec<Snippet> = snippets(&page)
            .into_iter()
            .filter(|s| {
                let mut words = s.info.split(',').map(str::trim);
                words.next() == Some("rust") && !words.any(|w| w == "ignore")
            })
            .collect();
        if rust.is_empty() {
            continue;
        }
        rust_pages += 1;
        let name = page.file_name().unwrap().to_str().unwrap();
        let included = format!("include_str!(\"../docs/{name}\")");
        assert!(
            page.parent().is_some_and(|d| d.ends_with("docs")) && lib.contains(&included),
            "{}:{}: a Rust snippet that no doctest compiles; add `#[doc = {included}]` to an item of `mod doc_snippets` in src/lib.rs (or mark the block `ignore`)",
            rust[0].file,
            rust[0].line
        );
    }
    assert!(rust_pages >= 1, "no Rust snippets found in docs/");
}
