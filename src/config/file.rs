//! The configuration file's schema: one set of serde structs that a file
//! is read into (every value with the line it came from) and that
//! `check-config --print` writes back out. Defaults and checks are applied
//! by the resolver (the sibling files); unknown keys, wrong types and YAML
//! errors are reported here with the path the deserializer was at.
//!
//! The parser is `serde-saphyr`: a serde YAML 1.2 reader that gives every
//! value its line ([`Spanned`]), a structured error per failure (the
//! unknown field's name, its location), and a streaming deserializer that
//! `serde_path_to_error` can wrap for the dotted path.

use serde::{Deserialize, Serialize};
use serde_saphyr::MessageFormatter;
/// The parser's located value and location, as the resolver uses them.
pub(super) use serde_saphyr::{Location, Spanned};

use super::ConfigError;

/// Reads `text` into the schema; `file` names it in errors.
pub(super) fn parse(text: &str, file: &str) -> Result<File, ConfigError> {
    let mut options = serde_saphyr::Options::default();
    options.with_snippet = false;
    let mut path = String::new();
    serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            path = dotted(e.path());
            e.into_inner()
        })
    })
    .map_err(|e| {
        let message = match &e {
            serde_saphyr::Error::SerdeUnknownField {
                field, expected, ..
            } => format!(
                "unknown key `{field}`, expected one of {}",
                expected.join(", ")
            ),
            e => serde_saphyr::DefaultMessageFormatter
                .format_message(e)
                .into_owned(),
        };
        ConfigError {
            file: file.to_string(),
            line: e.location().map(|l| l.line()).filter(|l| *l > 0),
            key: path,
            message,
        }
    })
}

/// The dotted key of `path`, e.g. `routes[1].key.header`. A [`Spanned`]
/// value is read as a map holding it under `value`: that step is not a key
/// of the file (no section of the schema has a key named `value`).
fn dotted(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Map { key } if key == "value" => {}
            Segment::Map { key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    out
}

/// The file's YAML text.
pub(super) fn render(file: &File) -> String {
    serde_saphyr::to_string(file).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
}

/// A value as it will be printed: no line of its own.
pub(super) fn printed<T>(value: T) -> Spanned<T> {
    Spanned::new(value, Location::UNKNOWN, Location::UNKNOWN)
}

pub(super) type Text = Spanned<String>;

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    #[serde(default)]
    pub(super) instance: Instance,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) listen: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) admin_listen: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) upstream: Option<Upstream>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) store: Option<Store>,
    #[serde(default)]
    pub(super) lease: Timings,
    #[serde(default)]
    pub(super) roles: Vec<Role>,
    #[serde(default)]
    pub(super) partitions: Vec<Partition>,
    #[serde(default)]
    pub(super) routes: Vec<Route>,
    #[serde(default)]
    pub(super) proxy: Proxy,
    #[serde(default)]
    pub(super) shutdown: Shutdown,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tls: Option<Spanned<Tls>>,
    #[serde(default)]
    pub(super) peers: Peers,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Instance {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) name: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) advertise: Option<Text>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Upstream {
    pub(super) url: Text,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) protocol: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) health: Option<Health>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) close_after_body: Option<bool>,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Http2 {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_concurrent_streams: Option<Spanned<u64>>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Health {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) path: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) interval: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) unhealthy_after: Option<Spanned<u64>>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Store {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) kind: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) url: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) migrate: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) table: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) username: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) password: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tls: Option<Spanned<StoreTls>>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StoreTls {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) ca_file: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cert_file: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) key_file: Option<Text>,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Timings {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) duration: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) renew_interval: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) safety_margin: Option<Text>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Role {
    pub(super) name: Text,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) duration: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) renew_interval: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) safety_margin: Option<Text>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Partition {
    pub(super) name: Text,
    pub(super) count: Spanned<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) duration: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) renew_interval: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) safety_margin: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) balance: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) rebalance_delay: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) handover_drain: Option<Text>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Route {
    pub(super) prefixes: Spanned<Vec<Text>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) role: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) partition: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) scope: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) key: Option<Spanned<Key>>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Key {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) header: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) query: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) path_segment: Option<Spanned<SegmentIndex>>,
}

#[derive(Deserialize, Serialize)]
#[serde(untagged)]
pub(super) enum SegmentIndex {
    Number(u64),
    Word(String),
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Proxy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) connect_timeout: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) response_header_timeout: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) retry_after: Option<Spanned<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cluster_secret: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) idle_timeout: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) case_insensitive_paths: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) upgrades: Option<Vec<Text>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) trusted_proxies: Option<Vec<Text>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_connections: Option<Spanned<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) hold_timeout: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_held: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) http2: Http2,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Shutdown {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) drain_timeout: Option<Text>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Tls {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cert_file: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) key_file: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) client_ca_file: Option<Text>,
}

#[derive(Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct Peers {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) ca_file: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cert_file: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) key_file: Option<Text>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) require_client_cert: Option<Spanned<bool>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) protocol: Option<Text>,
}
