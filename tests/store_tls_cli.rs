//! Store TLS through the binary: every TLS example config in
//! `docs/stores.md` passes `rolegate check-config` (with real PEM files at
//! the paths it names) and reads back from `--print`; `check-config`
//! refuses a TLS file it cannot use, naming the file, without connecting;
//! `rolegate migrate` and `status` use the same TLS settings as the gateway.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::tls::{ServerTls, TlsFiles};

fn rolegate(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rolegate"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run rolegate")
}

fn write_config(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a config");
    path.display().to_string()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The fenced YAML blocks of a markdown file that configure a store kind.
fn store_examples(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```yaml") => current = Some(String::new()),
            (Some(block), "```") => {
                if block.contains("kind:") {
                    blocks.push(block.clone());
                }
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[cfg(all(feature = "redis", feature = "etcd", feature = "postgres"))]
#[test]
fn the_store_tls_examples_in_the_docs_pass_check_config_and_read_back() {
    let files = TlsFiles::generate("docs_tls");
    let etc = files.dir.join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    for (from, to) in [
        (&files.ca, "store-ca.pem"),
        (&files.client_cert, "store-client.pem"),
        (&files.client_key, "store-client-key.pem"),
        (&files.ca, "pg-ca.pem"),
        (&files.client_cert, "pg-client.pem"),
        (&files.client_key, "pg-client-key.pem"),
    ] {
        std::fs::copy(from, etc.join(to)).expect("copy a PEM file");
    }
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/stores.md"))
        .expect("read docs/stores.md");
    let examples = store_examples(&docs);
    assert!(
        examples.len() >= 4,
        "TLS examples found: {}",
        examples.len()
    );
    let env = [("REDIS_PASSWORD", "s3cret")];
    for (i, example) in examples.iter().enumerate() {
        let yaml = example.replace("/etc/rolegate/", &format!("{}/", etc.display()));
        let path = write_config(&files.dir, &format!("example-{i}.yaml"), &yaml);
        let out = rolegate(&["check-config", "--print", "--config", &path], &env);
        assert_eq!(out.status.code(), Some(0), "{example}\n{}", text(&out));
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        for key in [
            "sslmode=verify-full",
            "sslrootcert=",
            "ca_file:",
            "cert_file:",
        ] {
            if example.contains(key) {
                assert!(printed.contains(key), "--print dropped {key}:\n{printed}");
            }
        }
        let again = write_config(&files.dir, &format!("printed-{i}.yaml"), &printed);
        let out = rolegate(&["check-config", "--config", &again], &env);
        assert_eq!(out.status.code(), Some(0), "{printed}\n{}", text(&out));
    }
}

#[cfg(feature = "redis")]
#[test]
fn check_config_refuses_an_unusable_tls_file_naming_it_without_connecting() {
    let files = TlsFiles::generate("check_tls_files");
    let not_pem = files.dir.join("not-pem.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let missing = files.dir.join("missing.pem");
    let client = |cert: &Path, key: &Path| {
        format!(
            "    cert_file: {}\n    key_file: {}\n",
            cert.display(),
            key.display()
        )
    };
    let cases = [
        (
            format!("    ca_file: {}\n", missing.display()),
            missing.clone(),
            "cannot read",
        ),
        (
            format!("    ca_file: {}\n", not_pem.display()),
            not_pem.clone(),
            "is not a PEM certificate: no items found",
        ),
        (
            client(&files.client_cert, &not_pem),
            not_pem.clone(),
            "is not a PEM private key",
        ),
        (
            client(&files.client_cert, &files.wrong_host_key),
            files.wrong_host_key.clone(),
            "cannot be used together",
        ),
    ];
    for (tls, file, says) in cases {
        // Port 1: nothing listens; check-config must not try to connect.
        let yaml = format!("store:\n  kind: redis\n  url: rediss://127.0.0.1:1\n  tls:\n{tls}");
        let path = write_config(&files.dir, "bad-tls.yaml", &yaml);
        let out = rolegate(&["check-config", "--config", &path], &[]);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(2), "{yaml}\n{all}");
        assert!(all.contains(&file.display().to_string()), "{all}");
        assert!(all.contains(says), "{all}");
    }
    let url = format!(
        "postgres://u@127.0.0.1:1/db?sslmode=verify-full&sslrootcert={}",
        missing.display()
    );
    let path = write_config(
        &files.dir,
        "bad-pg.yaml",
        &format!("store:\n  kind: postgres\n  url: {url}\n"),
    );
    let out = rolegate(&["check-config", "--config", &path], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(&missing.display().to_string()),
        "{}",
        text(&out)
    );
}

#[cfg(feature = "redis")]
#[test]
fn migrate_and_status_use_the_store_tls_settings() {
    let files = TlsFiles::generate("cli_tls");
    let server = support::tls::redis(&files, ServerTls::CLIENT_CERTS);
    let base = format!(
        "store:\n  kind: redis\n  url: rediss://127.0.0.1:{}\n  table: {}\n  tls:\n    ca_file: {}\n",
        server.port,
        support::unique_table("cli_tls"),
        files.ca.display()
    );
    let with_cert = format!(
        "{base}    cert_file: {}\n    key_file: {}\nroles:\n  - name: maintenance\n",
        files.client_cert.display(),
        files.client_key.display()
    );
    let good = write_config(&files.dir, "with-cert.yaml", &with_cert);
    let out = rolegate(&["migrate", "--config", &good], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = rolegate(&["status", "--json", "--config", &good], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let without = write_config(&files.dir, "without-cert.yaml", &base);
    let out = rolegate(&["status", "--config", &without], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("cannot connect to Redis"),
        "{}",
        text(&out)
    );
    let other = base.replace(
        &files.ca.display().to_string(),
        &files.other_ca.display().to_string(),
    );
    let other = write_config(&files.dir, "other-ca.yaml", &other);
    let out = rolegate(&["migrate", "--config", &other], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("UnknownIssuer"), "{}", text(&out));
}
