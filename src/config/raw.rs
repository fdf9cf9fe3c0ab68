//! The raw, span-carrying shapes straight from YAML, before any default or
//! check, and the translation of parser errors into [`ConfigError`].

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::ConfigError;

/// Turns a parse error into a [`ConfigError`]; for an unknown key, points at
/// the key's own line (the parser reports the enclosing mapping).
pub(super) fn yaml_error(text: &str, file: &str, e: &serde_saphyr::Error) -> ConfigError {
    let mut line = e.location().map(|l| l.line()).filter(|l| *l > 0);
    let mut message = e.to_string();
    if let Some(at) = message.rfind(" at line ") {
        message.truncate(at);
    }
    let mut key = String::new();
    if let Some(rest) = message.strip_prefix("unknown field `") {
        if let Some(name) = rest.split('`').next() {
            let from = line.unwrap_or(1) as usize;
            let found = text
                .lines()
                .enumerate()
                .skip(from.saturating_sub(1))
                .find(|(_, l)| {
                    let l = l.trim_start().trim_start_matches("- ");
                    l.strip_prefix(name)
                        .is_some_and(|r| r.trim_start().starts_with(':'))
                });
            key = match found {
                Some((i, _)) => {
                    line = Some(i as u64 + 1);
                    dotted_path(text, i).unwrap_or_else(|| name.to_string())
                }
                None => name.to_string(),
            };
            message = format!(
                "unknown key{}",
                message
                    .strip_prefix(&format!("unknown field `{name}`"))
                    .unwrap_or("")
            );
        }
    }
    ConfigError {
        file: file.to_string(),
        line,
        key,
        message,
    }
}

/// The dotted path of the key on line `at` (0-based) of block-style YAML,
/// e.g. `upstream.health.timeout` or `routes[1].key.header`, read from the
/// indentation of the lines up to it. `None` when that line holds no key.
fn dotted_path(text: &str, at: usize) -> Option<String> {
    enum Step<'a> {
        Key(&'a str),
        Item(usize),
    }
    // (indentation, step): a key owns deeper lines; an item owns its mapping.
    let mut stack: Vec<(usize, Step)> = Vec::new();
    for line in text.lines().take(at + 1) {
        let content = line.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let mut indent = line.len() - content.len();
        let mut rest = content;
        if let Some(after) = content.strip_prefix("- ") {
            while stack.last().is_some_and(|(i, _)| *i > indent) {
                stack.pop();
            }
            let index = match stack.last() {
                Some((i, Step::Item(n))) if *i == indent => {
                    let next = *n + 1;
                    stack.pop();
                    next
                }
                _ => 0,
            };
            stack.push((indent, Step::Item(index)));
            indent += 2 + (after.len() - after.trim_start().len());
            rest = after.trim_start();
        } else {
            while stack.last().is_some_and(|(i, _)| *i >= indent) {
                stack.pop();
            }
        }
        if let Some((key, _)) = rest.split_once(':') {
            let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
            if !key.is_empty() && !key.contains([' ', '{', '[']) {
                stack.push((indent, Step::Key(key)));
            }
        }
    }
    if !matches!(stack.last(), Some((_, Step::Key(_)))) {
        return None;
    }
    let mut path = String::new();
    for (_, step) in &stack {
        match step {
            Step::Key(k) if path.is_empty() => path.push_str(k),
            Step::Key(k) => {
                path.push('.');
                path.push_str(k);
            }
            Step::Item(n) => path.push_str(&format!("[{n}]")),
        }
    }
    Some(path)
}

pub(super) type Text = Spanned<String>;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) instance: RawInstance,
    pub(super) listen: Option<Text>,
    pub(super) admin_listen: Option<Text>,
    pub(super) upstream: Option<RawUpstream>,
    pub(super) store: Option<RawStore>,
    #[serde(default)]
    pub(super) lease: RawTimings,
    #[serde(default)]
    pub(super) roles: Vec<RawRole>,
    #[serde(default)]
    pub(super) partitions: Vec<RawPartition>,
    #[serde(default)]
    pub(super) routes: Vec<RawRoute>,
    #[serde(default)]
    pub(super) proxy: RawProxy,
    #[serde(default)]
    pub(super) shutdown: RawShutdown,
    pub(super) tls: Option<Spanned<RawTls>>,
    #[serde(default)]
    pub(super) peers: RawPeers,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInstance {
    pub(super) name: Option<Text>,
    pub(super) advertise: Option<Text>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    pub(super) url: Text,
    pub(super) protocol: Option<Text>,
    pub(super) health: Option<RawHealth>,
    pub(super) close_after_body: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp2 {
    pub(super) enabled: Option<bool>,
    pub(super) max_concurrent_streams: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    pub(super) path: Option<Text>,
    pub(super) interval: Option<Text>,
    pub(super) unhealthy_after: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) kind: Option<Text>,
    pub(super) url: Option<Text>,
    pub(super) migrate: Option<bool>,
    pub(super) table: Option<Text>,
    pub(super) username: Option<Text>,
    pub(super) password: Option<Text>,
    pub(super) tls: Option<Spanned<RawStoreTls>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStoreTls {
    pub(super) ca_file: Option<Text>,
    pub(super) cert_file: Option<Text>,
    pub(super) key_file: Option<Text>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTimings {
    pub(super) duration: Option<Text>,
    pub(super) renew_interval: Option<Text>,
    pub(super) safety_margin: Option<Text>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRole {
    pub(super) name: Text,
    pub(super) duration: Option<Text>,
    pub(super) renew_interval: Option<Text>,
    pub(super) safety_margin: Option<Text>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPartition {
    pub(super) name: Text,
    pub(super) count: Spanned<u64>,
    pub(super) duration: Option<Text>,
    pub(super) renew_interval: Option<Text>,
    pub(super) safety_margin: Option<Text>,
    pub(super) balance: Option<bool>,
    pub(super) rebalance_delay: Option<Text>,
    pub(super) handover_drain: Option<Text>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) prefixes: Spanned<Vec<Text>>,
    pub(super) role: Option<Text>,
    pub(super) partition: Option<Text>,
    pub(super) scope: Option<Text>,
    pub(super) key: Option<Spanned<RawKey>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKey {
    pub(super) header: Option<Text>,
    pub(super) query: Option<Text>,
    pub(super) path_segment: Option<Spanned<SegmentIndex>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum SegmentIndex {
    Number(u64),
    Word(String),
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProxy {
    pub(super) connect_timeout: Option<Text>,
    pub(super) response_header_timeout: Option<Text>,
    pub(super) retry_after: Option<Spanned<u64>>,
    pub(super) cluster_secret: Option<Text>,
    pub(super) idle_timeout: Option<Text>,
    pub(super) case_insensitive_paths: Option<bool>,
    pub(super) upgrades: Option<Vec<Text>>,
    pub(super) trusted_proxies: Option<Vec<Text>>,
    pub(super) max_connections: Option<Spanned<u64>>,
    pub(super) hold_timeout: Option<Text>,
    pub(super) max_held: Option<Spanned<u64>>,
    #[serde(default)]
    pub(super) http2: RawHttp2,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShutdown {
    pub(super) drain_timeout: Option<Text>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert_file: Option<Text>,
    pub(super) key_file: Option<Text>,
    pub(super) client_ca_file: Option<Text>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPeers {
    pub(super) ca_file: Option<Text>,
    pub(super) cert_file: Option<Text>,
    pub(super) key_file: Option<Text>,
    pub(super) require_client_cert: Option<Spanned<bool>>,
    pub(super) protocol: Option<Text>,
}
