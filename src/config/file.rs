//! Reading and writing the file's text: the YAML parser, the path and line
//! of a refused value, and [`Locations`], where each key of a file is (for
//! the checks between settings, which run on the typed values).
//!
//! The parser is `serde-saphyr`: a serde YAML 1.2 reader that gives every
//! value its line ([`Spanned`]), a structured error per failure (the
//! unknown field's name, its location), and a streaming deserializer that
//! `serde_path_to_error` can wrap for the dotted path.

use std::fmt;

use serde::de::{DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_saphyr::MessageFormatter;
use serde_saphyr::Spanned;

use super::ConfigError;

/// Reads `text` into `T`; `file` names it in errors.
pub(super) fn parse<T: DeserializeOwned>(text: &str, file: &str) -> Result<T, ConfigError> {
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

/// The dotted key of `path`, e.g. `routes[1].key.header`.
fn dotted(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
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

/// `value` as YAML text.
pub(super) fn render<T: Serialize>(value: &T) -> String {
    serde_saphyr::to_string(value).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
}

/// Where each key of a file is, by its dotted path (`proxy.max_held`,
/// `routes[1].key`): the lines of the refusals that involve several
/// settings, and whether a key whose default depends on another was set.
/// It is the file's YAML tree with each value's line, looked up by path,
/// so no key needs an entry here.
pub(super) struct Locations(Spanned<Tree>);

impl Locations {
    /// Where the keys of `text` are. A file the typed read accepted is
    /// YAML, and the tree takes any value (`.inf` and `.nan` included), so
    /// this should not fail; if it does, the resolver refuses the file
    /// rather than guess which keys it sets.
    pub(super) fn read(text: &str, file: &str) -> Result<Self, ConfigError> {
        let mut options = serde_saphyr::Options::default();
        options.with_snippet = false;
        options.non_finite_float_policy = serde_saphyr::NonFiniteFloatPolicy::PassThrough;
        serde_saphyr::from_str_with_options::<Option<Spanned<Tree>>>(text, options)
            .map(|tree| {
                Locations(tree.unwrap_or_else(|| {
                    Spanned::new(
                        Tree::Leaf,
                        serde_saphyr::Location::UNKNOWN,
                        serde_saphyr::Location::UNKNOWN,
                    )
                }))
            })
            .map_err(|e| ConfigError {
                file: file.to_string(),
                line: e.location().map(|l| l.line()).filter(|l| *l > 0),
                key: String::new(),
                message: format!(
                    "cannot tell which keys the file sets ({}); quote the value",
                    serde_saphyr::DefaultMessageFormatter.format_message(&e)
                ),
            })
    }

    /// The node at `key`: map keys joined by `.`, list items as `[i]`.
    fn find(&self, key: &str) -> Option<&Spanned<Tree>> {
        let mut node = &self.0;
        for part in key.split('.') {
            let (name, indexes) = match part.find('[') {
                Some(at) => (&part[..at], &part[at..]),
                None => (part, ""),
            };
            if !name.is_empty() {
                let Tree::Map(entries) = &node.value else {
                    return None;
                };
                node = &entries.iter().find(|(k, _)| k == name)?.1;
            }
            for index in indexes.split('[').skip(1) {
                let i: usize = index.strip_suffix(']')?.parse().ok()?;
                let Tree::Seq(items) = &node.value else {
                    return None;
                };
                node = items.get(i)?;
            }
        }
        Some(node)
    }

    /// The 1-based line of `key`'s value.
    pub(super) fn line(&self, key: &str) -> Option<u64> {
        self.find(key)
            .map(|n| n.referenced.line())
            .filter(|l| *l > 0)
    }

    /// Whether the file sets `key` to a value (a key left empty does not).
    pub(super) fn has(&self, key: &str) -> bool {
        self.find(key)
            .is_some_and(|n| !matches!(n.value, Tree::Null))
    }
}

/// Any YAML value, with the location of each part.
enum Tree {
    Map(Vec<(String, Spanned<Tree>)>),
    Seq(Vec<Spanned<Tree>>),
    Leaf,
    /// A key left empty (`max_held:`, `~`, `null`): set to nothing, which
    /// reads as unset.
    Null,
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

/// A map key of any scalar kind, as text.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_unit<E>(self) -> Result<Key, E> {
                Ok(Key(String::new()))
            }
        }
        d.deserialize_any(KeyVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries = Vec::new();
        while let Some((Key(k), v)) = map.next_entry::<Key, Spanned<Tree>>()? {
            entries.push((k, v));
        }
        Ok(Tree::Map(entries))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element::<Spanned<Tree>>()? {
            items.push(v);
        }
        Ok(Tree::Seq(items))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_str<E>(self, _: &str) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_unit<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_none<E>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}
