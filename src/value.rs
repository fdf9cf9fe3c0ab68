//! How one value of the configuration file is read and written back. A setting names
//! its kind in its field's serde attribute (`with = "value::duration"`,
//! `deserialize_with = "value::count::<_, u32, 1, 1000>"`, ...): reading
//! expands `${VAR}` and refuses a bad value with the parser's line, and
//! `check-config --print` writes the value so that reading it again gives
//! the same setting.
//!
//! `${VAR}` is answered from the variables the text references, looked up
//! once when the file is read ([`Context`]), so a value's reader needs no
//! argument besides the value.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest duration any setting takes: every duration is added to a
/// clock somewhere, and past this the sum would not fit.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// What reading a file may consult besides its text.
pub(crate) struct Context {
    /// Every `${VAR}` the text names, with its value (`None`: not set).
    env: HashMap<String, Option<String>>,
    /// Whether this binary has the store kind of a name.
    built: Box<dyn Fn(&str) -> bool>,
}

impl Context {
    /// Looks up each `${NAME}` that appears in `text` (comments too: a
    /// lookup costs nothing, and only a value that uses it can fail).
    pub(crate) fn new(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        built: impl Fn(&str) -> bool + 'static,
    ) -> Self {
        let mut vars = HashMap::new();
        let mut rest = text;
        while let Some(at) = rest.find("${") {
            rest = &rest[at + 2..];
            // Only a well-formed name is looked up: at most the file's size
            // in names, however many `${` it has.
            let len = rest
                .bytes()
                .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
                .count();
            if len > 0 && rest.as_bytes().get(len) == Some(&b'}') {
                let name = &rest[..len];
                if !vars.contains_key(name) {
                    vars.insert(name.to_string(), env(name));
                }
            }
        }
        Self {
            env: vars,
            built: Box::new(built),
        }
    }
}

thread_local! {
    static CONTEXT: RefCell<Option<Context>> = const { RefCell::new(None) };
}

/// Runs `read` with `context` in force on this thread.
pub(crate) fn with_context<R>(context: Context, read: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            CONTEXT.with(|c| c.borrow_mut().take());
        }
    }
    CONTEXT.with(|c| *c.borrow_mut() = Some(context));
    let _reset = Reset;
    read()
}

/// Whether the binary reading the file has the store kind named `kind`
/// (`None` outside a read).
pub(crate) fn built(kind: &str) -> Option<bool> {
    CONTEXT.with(|c| c.borrow().as_ref().map(|c| (c.built)(kind)))
}

/// `${VAR}` expanded from the context (outside one, every variable is unset).
fn expand<E: serde::de::Error>(s: &str) -> Result<String, E> {
    CONTEXT.with(|c| {
        let c = c.borrow();
        let env = |name: &str| c.as_ref().and_then(|c| c.env.get(name).cloned().flatten());
        expand_env(s, &env).map_err(E::custom)
    })
}

/// A string with `${VAR}` expanded.
pub(crate) fn read_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Option::<String>::deserialize(d)? {
        Some(s) => expand(&s),
        None => Err(D::Error::custom(
            "has no value: give it one, or remove the key for its default",
        )),
    }
}

/// A list; an empty key is refused like any value left empty.
pub(crate) fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<Vec<T>>::deserialize(d)?.ok_or_else(|| {
        D::Error::custom("has no value: give it one, or remove the key for its default")
    })
}

/// A section (`proxy:`, `store:`) that may be left empty: an empty one is
/// all defaults.
pub(crate) fn section<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// An optional string with `${VAR}` expanded (a key left empty is unset).
pub(crate) fn read_opt_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| expand(&s))
        .transpose()
}

/// `s` as the file writes it: `$` doubled, so that reading it again expands
/// no `${VAR}` the value happens to contain.
pub(crate) fn written(s: &str) -> String {
    s.replace('$', "$$")
}

/// Text.
pub(crate) mod text {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        read_text(d)
    }
    pub(crate) fn serialize<S: Serializer>(v: &str, s: S) -> Result<S::Ok, S::Error> {
        written(v).serialize(s)
    }
}

/// Optional text.
pub(crate) mod opt_text {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        read_opt_text(d)
    }
    pub(crate) fn serialize<S: Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        v.as_deref().map(written).serialize(s)
    }
}

/// A list of texts.
pub(crate) mod texts {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        list::<D, String>(d)?.iter().map(|s| expand(s)).collect()
    }
    pub(crate) fn serialize<S: Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|v| written(v)))
    }
}

fn parse_duration<E: serde::de::Error>(s: &str) -> Result<Duration, E> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| {
        E::custom(format!(
            "`{s}` is not a duration ({e}); write e.g. 500ms, 15s, 2m"
        ))
    })?;
    if d > MAX_DURATION {
        return Err(E::custom(format!(
            "`{s}` is longer than a year, the longest duration a setting takes"
        )));
    }
    Ok(d)
}

fn write_duration<S: Serializer>(d: Duration, s: S) -> Result<S::Ok, S::Error> {
    humantime::format_duration(d).to_string().serialize(s)
}

/// A duration (`500ms`, `15s`, `2m`), at most a year.
pub(crate) mod duration {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        parse_duration(&read_text(d)?)
    }
    pub(crate) fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        write_duration(*v, s)
    }
}

/// A duration whose default comes from another key (a role's timings
/// from `lease`, a partition's delays from its renew interval): left empty
/// it is unset like an absent key, and the resolver fills it in; zero
/// stands in until then.
pub(crate) mod inherited_duration {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match read_opt_text(d)? {
            Some(s) => parse_duration(&s),
            None => Ok(Duration::ZERO),
        }
    }
    pub(crate) fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        write_duration(*v, s)
    }
}

/// A duration greater than zero.
pub(crate) mod positive {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = parse_duration(&read_text(d)?)?;
        if v.is_zero() {
            return Err(D::Error::custom("must be greater than 0"));
        }
        Ok(v)
    }
    pub(crate) fn serialize<S: Serializer>(v: &Duration, s: S) -> Result<S::Ok, S::Error> {
        write_duration(*v, s)
    }
}

/// A whole number from `MIN` to `MAX`, as `T`.
pub(crate) fn count<'de, D, T, const MIN: u64, const MAX: u64>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    let Some(n) = Option::<u64>::deserialize(d)? else {
        return Err(D::Error::custom(
            "has no value: give it one, or remove the key for its default",
        ));
    };
    if n < MIN || n > MAX {
        return Err(D::Error::custom(format!(
            "must be between {MIN} and {MAX}, got {n}"
        )));
    }
    T::try_from(n).map_err(|_| D::Error::custom(format!("{n} is too large")))
}

/// [`count`] for a number whose default comes from another key
/// (`proxy.max_held`): left empty it is unset like an absent key, and the
/// resolver fills it in; `MIN` stands in until then.
pub(crate) fn inherited_count<'de, D, T, const MIN: u64, const MAX: u64>(
    d: D,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    let n = Option::<u64>::deserialize(d)?.unwrap_or(MIN);
    if n < MIN || n > MAX {
        return Err(D::Error::custom(format!(
            "must be between {MIN} and {MAX}, got {n}"
        )));
    }
    T::try_from(n).map_err(|_| D::Error::custom(format!("{n} is too large")))
}

/// A socket address like `0.0.0.0:8080`.
pub(crate) mod socket {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        let s = read_text(d)?;
        s.trim().parse().map_err(|e| {
            D::Error::custom(format!(
                "`{s}` is not a socket address like 0.0.0.0:8080 ({e})"
            ))
        })
    }
    pub(crate) fn serialize<S: Serializer>(v: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
        v.to_string().serialize(s)
    }
}

fn read_path<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    let s = read_text(d)?;
    if s.trim().is_empty() {
        return Err(D::Error::custom("must be a file path"));
    }
    Ok(PathBuf::from(s))
}

fn write_path<S: Serializer>(p: &std::path::Path, s: S) -> Result<S::Ok, S::Error> {
    written(&p.display().to_string()).serialize(s)
}

/// A file path.
pub(crate) mod path {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        read_path(d)
    }
    pub(crate) fn serialize<S: Serializer>(v: &std::path::Path, s: S) -> Result<S::Ok, S::Error> {
        write_path(v, s)
    }
}

/// An optional file path.
pub(crate) mod opt_path {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<PathBuf>, D::Error> {
        match read_opt_text(d)? {
            Some(s) if s.trim().is_empty() => Err(D::Error::custom("must be a file path")),
            s => Ok(s.map(PathBuf::from)),
        }
    }
    pub(crate) fn serialize<S: Serializer>(v: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(p) => write_path(p, s),
            None => s.serialize_none(),
        }
    }
}

/// An `http://` or `https://` base URL, kept without its trailing `/`;
/// written with any password redacted.
pub(crate) mod http_url {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        let s = read_text(d)?;
        check_http_url(&s).map_err(D::Error::custom)?;
        Ok(s.trim_end_matches('/').to_string())
    }
    pub(crate) fn serialize<S: Serializer>(v: &str, s: S) -> Result<S::Ok, S::Error> {
        written(&crate::redact::redact_url(v)).serialize(s)
    }
}

/// An optional `http://` or `https://` base URL (an address other gateways
/// use: nothing to redact).
pub(crate) mod opt_http_url {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let Some(s) = read_opt_text(d)? else {
            return Ok(None);
        };
        check_http_url(&s).map_err(D::Error::custom)?;
        Ok(Some(s.trim_end_matches('/').to_string()))
    }
    pub(crate) fn serialize<S: Serializer>(v: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
        v.as_deref().map(written).serialize(s)
    }
}

/// A URL that may carry a password, written with it redacted.
pub(crate) mod redacted_url {
    use super::*;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        read_text(d)
    }
    pub(crate) fn serialize<S: Serializer>(v: &str, s: S) -> Result<S::Ok, S::Error> {
        written(&crate::redact::redact_url(v)).serialize(s)
    }
}

/// A secret: read as text, written as a `${VAR}` reference to set at run
/// time, never as itself.
pub(crate) fn write_secret<S: Serializer>(
    v: &Option<String>,
    var: &str,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(_) => format!("${{{var}}}").serialize(s),
        None => s.serialize_none(),
    }
}

/// One of a fixed set of words, each standing for a value.
pub(crate) fn word<'de, D: Deserializer<'de>, T: Copy>(
    d: D,
    words: &[(&str, T)],
    what: &str,
) -> Result<T, D::Error> {
    let s = read_text(d)?;
    (words.iter().find(|(w, _)| *w == s).map(|(_, v)| *v)).ok_or_else(|| {
        let names: Vec<&str> = words.iter().map(|(w, _)| *w).collect();
        D::Error::custom(format!("`{s}` is not {what}: use {}", names.join(" or ")))
    })
}

/// The word that stands for `v` in `words`, as [`word`] reads it.
pub(crate) fn write_word<S: Serializer, T: PartialEq>(
    v: &T,
    words: &[(&str, T)],
    s: S,
) -> Result<S::Ok, S::Error> {
    words
        .iter()
        .find(|(_, w)| w == v)
        .map(|(w, _)| *w)
        .serialize(s)
}

/// A role or partition name.
pub(crate) mod role_name {
    use super::*;
    use crate::role::RoleName;
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RoleName, D::Error> {
        RoleName::new(&read_text(d)?).map_err(D::Error::custom)
    }
    pub(crate) fn serialize<S: Serializer>(v: &RoleName, s: S) -> Result<S::Ok, S::Error> {
        written(v.as_str()).serialize(s)
    }
}

/// A URL the gateway cannot use; it quotes the URL with secrets redacted.
#[derive(Debug, thiserror::Error)]
pub(super) enum UrlError {
    #[error("`{0}` is not a URL ({1})")]
    Invalid(String, #[source] http::uri::InvalidUri),
    #[error("`{0}` must start with http:// or https://")]
    Scheme(String),
    #[error("`{0}` has no host")]
    NoHost(String),
    #[error("`{0}` has a query (`?…`); a path prefix is all a base URL may add")]
    Query(String),
    #[error("`{0}` has a fragment (`#…`); a path prefix is all a base URL may add")]
    Fragment(String),
}

pub(super) fn check_http_url(s: &str) -> Result<(), UrlError> {
    let uri: Result<http::Uri, _> = s.parse();
    let shown = crate::redact::redact_url(s);
    let uri = uri.map_err(|e| UrlError::Invalid(shown.clone(), e))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(UrlError::Scheme(shown)),
    }
    if uri.host().is_none() {
        return Err(UrlError::NoHost(shown));
    }
    // Every request's path is appended: a query here would end up in the
    // middle of the app's path.
    if uri.query().is_some() {
        return Err(UrlError::Query(shown));
    }
    // A fragment is dropped when the URI is parsed, and with it every path
    // appended after it: the app would see the prefix alone.
    if s.contains('#') {
        return Err(UrlError::Fragment(shown));
    }
    Ok(())
}

/// A `${VAR}` that cannot be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EnvError {
    /// `${` without `}`.
    #[error("unterminated `${{` in `{0}`")]
    Unterminated(String),
    /// A name outside `[A-Za-z0-9_]+`.
    #[error("`${{{0}}}` is not a valid variable name")]
    BadName(String),
    /// The variable is not set.
    #[error("environment variable `{0}` is not set")]
    Unset(String),
}

/// Expands `${NAME}`; an unset variable is an error. `$$` stands for `$`.
pub(crate) fn expand_env(
    input: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, EnvError> {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| EnvError::Unterminated(input.to_string()))?;
            let name = &body[..end];
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(EnvError::BadName(name.to_string()));
            }
            let value = env(name).ok_or_else(|| EnvError::Unset(name.to_string()))?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_looks_up_each_named_variable_once_and_ends_with_the_read() {
        let asked = std::cell::Cell::new(0);
        let env = |name: &str| {
            asked.set(asked.get() + 1);
            (name == "A").then(|| "a".to_string())
        };
        let context = Context::new("x: ${A}\ny: ${A}${B}\n# ${C", &env, |_| true);
        assert_eq!(asked.get(), 2, "A and B, once each; `${{C` is unterminated");
        let read = with_context(context, || expand::<serde::de::value::Error>("${A}-$${B}"));
        assert_eq!(read.unwrap(), "a-${B}");
        assert!(
            expand::<serde::de::value::Error>("${A}").is_err(),
            "outside a read every variable is unset"
        );
    }
}
