//! The one error type of the store layer. Every variant that wraps a failure
//! keeps it as its `source()`, and its message already names the whole cause
//! chain (so `{error}` at the CLI edge or in a log says "Connection refused",
//! not only "pool timed out"). Secrets in URLs are redacted from the message.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use super::BadTableName;

/// A boxed cause, as kept by [`StoreError`] variants.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a store call or a store constructor failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached, or failed the call.
    #[error("{context}: {}", Chain(&**.source))]
    Unavailable {
        /// What was being done, and against which server (no secrets).
        context: Cow<'static, str>,
        /// The underlying failure.
        #[source]
        source: BoxError,
    },
    /// A call or a connection attempt got no answer in time.
    #[error("{what} timed out after {}", humantime::format_duration(*.after))]
    Timeout {
        /// What was waited for.
        what: Cow<'static, str>,
        /// How long.
        after: Duration,
    },
    /// The store answered something this version cannot read.
    #[error("{context}: unexpected answer from the store: {}", Chain(&**.source))]
    Decode {
        /// What was being read.
        context: Cow<'static, str>,
        /// The decoding failure.
        #[source]
        source: BoxError,
    },
    /// The lease table (or its companions) is missing or outdated.
    #[error(
        "schema missing or outdated ({detail}); run `rolegate migrate` or set store.migrate: true"
    )]
    Schema {
        /// The database's own words (e.g. `relation "x" does not exist`).
        detail: String,
        /// The failure that revealed it.
        #[source]
        source: BoxError,
    },
    /// The store's user lacks privileges a gateway needs.
    #[error("the store user lacks privileges a gateway needs: {missing}; grant them or connect as a user that has them")]
    Privileges {
        /// What is missing, e.g. `rolegate_role_leases: UPDATE`.
        missing: String,
    },
    /// The store configuration (URL, endpoints) is unusable.
    #[error("bad store configuration: {field}: {}", Chain(&**.source))]
    Config {
        /// The configuration key at fault, e.g. `store.url`.
        field: &'static str,
        /// Why it was refused.
        #[source]
        source: BoxError,
    },
    /// The table name or key namespace given to a store constructor is refused.
    #[error("bad store configuration: store.table: {0}")]
    BadTableName(#[from] BadTableName),
    /// The store kind was left out of this build.
    #[error("store kind `{0}` is not built into this binary (cargo feature `{0}`)")]
    NotBuilt(&'static str),
}

impl StoreError {
    /// A failed call or connection: `context` says what and where.
    pub fn unavailable(context: impl Into<Cow<'static, str>>, source: impl Into<BoxError>) -> Self {
        StoreError::Unavailable {
            context: context.into(),
            source: source.into(),
        }
    }

    /// A wait that ran out.
    pub fn timeout(what: impl Into<Cow<'static, str>>, after: Duration) -> Self {
        StoreError::Timeout {
            what: what.into(),
            after,
        }
    }

    /// An answer that could not be decoded.
    pub fn decode(context: impl Into<Cow<'static, str>>, source: impl Into<BoxError>) -> Self {
        StoreError::Decode {
            context: context.into(),
            source: source.into(),
        }
    }

    /// A refused configuration value.
    pub fn config(field: &'static str, source: impl Into<BoxError>) -> Self {
        StoreError::Config {
            field,
            source: source.into(),
        }
    }

    /// Whether the schema is missing (the caller may register its rows again
    /// once it has been applied).
    pub fn is_schema(&self) -> bool {
        matches!(self, StoreError::Schema { .. })
    }

    /// Whether the configuration itself is refused (fixing it needs an
    /// edit, not a retry): a bad URL, file, table name, or a kind not built.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            StoreError::Config { .. } | StoreError::BadTableName(_) | StoreError::NotBuilt(_)
        )
    }
}

/// Renders an error and its sources as `outer: inner: innermost`, skipping a
/// source whose text its parent already quotes, with URL secrets redacted.
struct Chain<'a>(&'a (dyn StdError + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = with_sources(self.0.to_string(), self.0.source());
        f.write_str(&crate::redact::redact_text(&text))
    }
}

/// `head` followed by the text of `source` and of each source after it,
/// except those `head` (or an earlier source) already quotes.
pub(super) fn with_sources(head: String, source: Option<&(dyn StdError + 'static)>) -> String {
    let mut text = head;
    let mut next = source;
    while let Some(e) = next {
        let part = e.to_string();
        if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer wrapper")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("quoting: {0}")]
    struct Quoting(#[source] std::io::Error);

    fn refused() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused")
    }

    #[test]
    fn the_message_names_the_whole_cause_chain_once() {
        let e =
            StoreError::unavailable("cannot connect to PostgreSQL at db:5432", Outer(refused()));
        assert_eq!(
            e.to_string(),
            "cannot connect to PostgreSQL at db:5432: outer wrapper: Connection refused"
        );
        assert!(e.source().is_some());
        let e = StoreError::unavailable("claim", Quoting(refused()));
        assert_eq!(e.to_string(), "claim: quoting: Connection refused");
    }

    #[test]
    fn secrets_in_causes_are_redacted() {
        let e = StoreError::config("store.url", "bad url postgres://app:s3cret@db/app");
        assert_eq!(
            e.to_string(),
            "bad store configuration: store.url: bad url postgres://app:<redacted>@db/app"
        );
    }

    #[test]
    fn timeouts_say_what_and_how_long() {
        let e = StoreError::timeout("one-shot claim", Duration::from_millis(1500));
        assert_eq!(e.to_string(), "one-shot claim timed out after 1s 500ms");
    }

    #[test]
    fn a_bad_table_name_is_a_typed_configuration_error() {
        let e = StoreError::from(BadTableName("Bad".into()));
        assert!(matches!(e, StoreError::BadTableName(_)));
        assert!(e.to_string().contains("store.table"), "{e}");
    }
}
