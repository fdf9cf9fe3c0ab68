//! The shipped deployment files under `deploy/` (walked through in
//! `docs/deploy.md`): each rolegate config in them passes the real
//! `rolegate check-config` with exactly the environment its manifest provides,
//! and the manifests around it fit the config: the orchestrator waits longer
//! than the gateway drains, probes reach the admin listener, traffic and
//! forwarded hops reach the public listener, the gateway reads the file it
//! mounts, and the gateways never need schema privileges.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use rolegate::Config;
use serde_json::Value;

type Env = BTreeMap<String, String>;

/// What a stop may take after its drain bound: ending the work left (1 s),
/// the release (up to 2 s), the hand-on pause (0.5 s), open connections
/// finishing (up to 2 s), the final release call and exit (1 s).
const STOP_SLACK: Duration = Duration::from_millis(6500);

/// What the downward API would give a pod.
const POD_IP: &str = "10.244.1.17";
const POD_NAME: &str = "my-app-5d8f7c9b6-x7k2p";

fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `rolegate check-config` on `text`, with `env` as the whole environment.
fn check_config(text: &str, env: &Env) -> Output {
    let mut file = tempfile::Builder::new()
        .prefix("rolegate-deploy-")
        .suffix(".yaml")
        .tempfile()
        .expect("temp config");
    file.write_all(text.as_bytes()).expect("write temp config");
    file.flush().expect("flush temp config");
    Command::new(env!("CARGO_BIN_EXE_rolegate"))
        .env_clear()
        .envs(env)
        .args(["check-config", "--print"])
        .arg("--config")
        .arg(file.path())
        .output()
        .expect("run rolegate check-config")
    // `file` is removed here.
}

fn assert_check_config_passes(what: &str, text: &str, env: &Env) -> String {
    let out = check_config(text, env);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: check-config refused it with env {:?}:\n{}",
        env.keys().collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The resolved config, as the gateway would see it with `env`.
fn resolve(what: &str, text: &str, env: &Env) -> Config {
    Config::parse(text, what, &|name| env.get(name).cloned())
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

// ---------------------------------------------------------------- Kubernetes

const K8S: &str = "deploy/kubernetes/rolegate-sidecar.yaml";

struct Kube {
    docs: Vec<Value>,
}

impl Kube {
    fn load() -> Self {
        let docs: Vec<Value> = serde_saphyr::from_multiple(&repo_file(K8S))
            .unwrap_or_else(|e| panic!("{K8S}: not valid multi-document YAML: {e}"));
        Self {
            docs: docs.into_iter().filter(|d| !d.is_null()).collect(),
        }
    }

    /// The only document of `kind`.
    fn one(&self, kind: &str) -> &Value {
        let found: Vec<&Value> = self.docs.iter().filter(|d| d["kind"] == kind).collect();
        assert_eq!(found.len(), 1, "{K8S}: expected exactly one {kind}");
        found[0]
    }

    fn pod_spec(&self) -> &Value {
        &self.one("Deployment")["spec"]["template"]["spec"]
    }

    fn container(&self, name: &str) -> &Value {
        self.pod_spec()["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{K8S}: no container named {name}"))
    }

    fn gateway(&self) -> &Value {
        self.container("rolegate")
    }

    /// The `rolegate.yaml` the gateway reads: the file named by `--config`,
    /// from the ConfigMap mounted on its directory.
    fn config_text(&self) -> String {
        let gateway = self.gateway();
        let config_path = config_arg(gateway);
        let (dir, file) = config_path
            .rsplit_once('/')
            .unwrap_or_else(|| panic!("--config {config_path} is not an absolute path"));
        let mount = gateway["volumeMounts"]
            .as_array()
            .expect("volumeMounts")
            .iter()
            .find(|m| m["mountPath"] == dir)
            .unwrap_or_else(|| panic!("{K8S}: nothing is mounted at {dir}"));
        let volume = self.pod_spec()["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("{K8S}: no volume {}", mount["name"]));
        let map = self.one("ConfigMap");
        assert_eq!(
            volume["configMap"]["name"], map["metadata"]["name"],
            "{K8S}: the config volume is not the ConfigMap in this file"
        );
        map["data"][file]
            .as_str()
            .unwrap_or_else(|| panic!("{K8S}: the ConfigMap has no data.\"{file}\""))
            .to_string()
    }

    /// The gateway container's environment, with plausible values for what
    /// Kubernetes injects (downward API, Secrets).
    fn gateway_env(&self) -> Env {
        let mut env = Env::new();
        for var in self.gateway()["env"].as_array().expect("env") {
            let name = var["name"].as_str().expect("env name").to_string();
            let value = if let Some(v) = var["value"].as_str() {
                v.to_string()
            } else if let Some(field) = var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                match field {
                    "status.podIP" => POD_IP.to_string(),
                    "metadata.name" => POD_NAME.to_string(),
                    other => panic!("{K8S}: env {name}: no test value for fieldRef {other}"),
                }
            } else if var["valueFrom"]["secretKeyRef"].is_object() {
                // Like `openssl rand -hex 32`, as the manifest's comment says.
                "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".to_string()
            } else {
                panic!("{K8S}: env {name}: no test value for {var}");
            };
            env.insert(name, value);
        }
        env
    }

    fn resolved(&self) -> Config {
        resolve(K8S, &self.config_text(), &self.gateway_env())
    }
}

/// The value after `--config` in the container's args.
fn config_arg(container: &Value) -> String {
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg"))
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--config")
        .expect("--config in args");
    args[at + 1].to_string()
}

/// A container port given by number or by name.
fn container_port(container: &Value, port: &Value) -> u16 {
    if let Some(n) = port.as_u64() {
        return n as u16;
    }
    let name = port.as_str().expect("port number or name");
    container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("{K8S}: no container port named {name}")) as u16
}

/// How long a container's preStop hook sleeps (`exec: sleep N` or `sleep.seconds`).
fn pre_stop_sleep(container: &Value) -> Duration {
    let hook = &container["lifecycle"]["preStop"];
    if let Some(s) = hook["sleep"]["seconds"].as_u64() {
        return Duration::from_secs(s);
    }
    let cmd: Vec<&str> = hook["exec"]["command"]
        .as_array()
        .unwrap_or_else(|| panic!("{K8S}: container {} has no preStop", container["name"]))
        .iter()
        .map(|a| a.as_str().expect("string command"))
        .collect();
    match cmd.as_slice() {
        ["sleep", n] => Duration::from_secs(n.parse().expect("sleep seconds")),
        other => panic!("{K8S}: preStop is not a sleep: {other:?}"),
    }
}

#[test]
fn kubernetes_config_map_passes_check_config_with_the_pods_env() {
    let kube = Kube::load();
    let out = assert_check_config_passes(K8S, &kube.config_text(), &kube.gateway_env());
    assert!(
        out.contains(&format!("advertise: http://{POD_IP}:")),
        "the pod IP did not reach instance.advertise:\n{out}"
    );
}

#[test]
fn kubernetes_grace_period_outlasts_the_gateways_pre_stop_and_drain() {
    let kube = Kube::load();
    let grace = Duration::from_secs(
        kube.pod_spec()["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("terminationGracePeriodSeconds"),
    );
    let drain = kube.resolved().shutdown.drain_timeout;
    let pre_stop = pre_stop_sleep(kube.gateway());
    assert!(
        grace >= pre_stop + drain + STOP_SLACK,
        "terminationGracePeriodSeconds {grace:?} must exceed preStop {pre_stop:?} + \
         shutdown.drain_timeout {drain:?} + {STOP_SLACK:?}, or the kubelet SIGKILLs \
         the gateway mid-drain and the others wait for expiry"
    );
}

#[test]
fn kubernetes_app_outlives_the_gateways_drain() {
    let kube = Kube::load();
    let drain = kube.resolved().shutdown.drain_timeout;
    let gateway = pre_stop_sleep(kube.gateway());
    let app = pre_stop_sleep(kube.container("app"));
    assert!(
        app >= gateway + drain,
        "the app's preStop ({app:?}) must cover the gateway's preStop ({gateway:?}) + \
         drain_timeout ({drain:?}): the app must still answer requests the gateway drains"
    );
    let grace = kube.pod_spec()["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    assert!(
        Duration::from_secs(grace) > app,
        "the grace period must leave the app time to stop after its preStop"
    );
}

#[test]
fn kubernetes_probes_hit_readyz_and_healthz_on_the_admin_listener() {
    let kube = Kube::load();
    let config = kube.resolved();
    let gateway = kube.gateway();
    assert!(
        config.admin_listen.ip().is_unspecified(),
        "admin_listen {} must not be loopback: the kubelet probes the pod IP",
        config.admin_listen
    );
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &gateway[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe} path");
        assert_eq!(
            container_port(gateway, &get["port"]),
            config.admin_listen.port(),
            "{probe} must probe the admin listener"
        );
    }
}

#[test]
fn kubernetes_service_and_advertise_reach_the_gateways_public_listener() {
    let kube = Kube::load();
    let config = kube.resolved();
    let gateway = kube.gateway();
    let service = kube.one("Service");
    let ports = service["spec"]["ports"].as_array().expect("Service ports");
    assert!(!ports.is_empty());
    for port in ports {
        assert_eq!(
            container_port(gateway, &port["targetPort"]),
            config.listen.port(),
            "the Service must send traffic to the gateway, never around it"
        );
    }
    let labels = &kube.one("Deployment")["spec"]["template"]["metadata"]["labels"];
    for (k, v) in service["spec"]["selector"].as_object().expect("selector") {
        assert_eq!(&labels[k], v, "the Service selector must match the pods");
    }
    assert_eq!(
        config.instance.advertise.as_deref(),
        Some(format!("http://{POD_IP}:{}", config.listen.port()).as_str()),
        "other gateways forward to the pod IP on the public listener"
    );
}

#[test]
fn kubernetes_gateway_reads_the_config_map_it_mounts() {
    // config_text() follows --config to the mount, the volume and the ConfigMap.
    let kube = Kube::load();
    assert!(kube.config_text().contains("store:"));
}

// ------------------------------------------------------------------- systemd

const UNIT: &str = "deploy/systemd/rolegate.service";
const SYSTEMD_CONFIG: &str = "deploy/systemd/rolegate.yaml";
const SYSTEMD_ENV: &str = "deploy/systemd/rolegate.env.example";
const INSTALLED_CONFIG: &str = "/etc/rolegate/rolegate.yaml";

/// `[Section] Key=Value` lines of a unit file, later assignments last.
fn unit_entries(text: &str) -> BTreeMap<(String, String), Vec<String>> {
    let mut entries: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
        } else if let Some((k, v)) = line.split_once('=') {
            entries
                .entry((section.clone(), k.trim().to_string()))
                .or_default()
                .push(v.trim().to_string());
        }
    }
    entries
}

fn service_value(text: &str, key: &str) -> String {
    unit_entries(text)
        .get(&("Service".to_string(), key.to_string()))
        .and_then(|v| v.last().cloned())
        .unwrap_or_else(|| panic!("{UNIT}: no {key}= in [Service]"))
}

/// A systemd time span: `25`, `25s`, `1min 30s`.
fn systemd_span(text: &str) -> Duration {
    match text.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(text)
            .unwrap_or_else(|e| panic!("{UNIT}: time span {text:?}: {e}")),
    }
}

/// `KEY=VALUE` lines of an environment file.
fn env_file(text: &str) -> Env {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("{SYSTEMD_ENV}: not KEY=VALUE: {l}"));
            (k.to_string(), v.trim_matches('"').to_string())
        })
        .collect()
}

#[test]
fn systemd_config_passes_check_config_with_the_example_env_file() {
    let out = assert_check_config_passes(
        SYSTEMD_CONFIG,
        &repo_file(SYSTEMD_CONFIG),
        &env_file(&repo_file(SYSTEMD_ENV)),
    );
    assert!(out.contains("kind: postgres"), "{out}");
}

#[test]
fn systemd_unit_runs_the_shipped_config_with_its_env_file() {
    let unit = repo_file(UNIT);
    let exec = service_value(&unit, "ExecStart");
    assert!(
        exec.ends_with(&format!(" run --config {INSTALLED_CONFIG}")),
        "ExecStart must run {INSTALLED_CONFIG}: {exec}"
    );
    assert_eq!(
        service_value(&unit, "EnvironmentFile"),
        "/etc/rolegate/rolegate.env"
    );
    let user = service_value(&unit, "User");
    assert!(
        !user.is_empty() && user != "root",
        "a dedicated user, not {user:?}"
    );
}

#[test]
fn systemd_stop_timeout_outlasts_the_drain_and_stops_with_sigterm() {
    let unit = repo_file(UNIT);
    let config = resolve(
        SYSTEMD_CONFIG,
        &repo_file(SYSTEMD_CONFIG),
        &env_file(&repo_file(SYSTEMD_ENV)),
    );
    let drain = config.shutdown.drain_timeout;
    let stop = systemd_span(&service_value(&unit, "TimeoutStopSec"));
    assert!(
        stop >= drain + STOP_SLACK,
        "TimeoutStopSec {stop:?} must exceed shutdown.drain_timeout {drain:?} + {STOP_SLACK:?}"
    );
    assert_eq!(service_value(&unit, "KillSignal"), "SIGTERM");
    assert_eq!(service_value(&unit, "Restart"), "on-failure");
}

// ------------------------------------------------------------------ PostgreSQL

#[test]
fn gateways_never_migrate_and_the_migrate_config_targets_their_table() {
    let kube = Kube::load();
    let gateways = [
        (K8S, kube.resolved()),
        (
            SYSTEMD_CONFIG,
            resolve(
                SYSTEMD_CONFIG,
                &repo_file(SYSTEMD_CONFIG),
                &env_file(&repo_file(SYSTEMD_ENV)),
            ),
        ),
    ];
    let migrate_file = "deploy/postgres/migrate.yaml";
    let env: Env = [
        ("ROLEGATE_OWNER_PASSWORD", "0123abcd"),
        ("ROLEGATE_DB_HOST", "db.internal:5432"),
        ("ROLEGATE_DB_NAME", "app"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into();
    assert_check_config_passes(migrate_file, &repo_file(migrate_file), &env);
    let migrate = resolve(migrate_file, &repo_file(migrate_file), &env);
    for (file, config) in gateways {
        assert_eq!(config.store.kind, rolegate::StoreKind::Postgres, "{file}");
        assert!(
            !config.store.migrate,
            "{file}: the least-privilege runtime role cannot apply the schema; \
             store.migrate: true would retry it forever"
        );
        assert_eq!(config.store.table, migrate.store.table, "{file}");
    }
    let grants = repo_file("deploy/postgres/grants.sql");
    assert!(
        grants.contains(&format!(" ON {} TO ", migrate.store.table)),
        "deploy/postgres/grants.sql must grant on {}",
        migrate.store.table
    );
}
