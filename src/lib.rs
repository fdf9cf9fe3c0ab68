#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![doc = include_str!("../docs/library.md")]

mod admin;
mod body;
mod cli;
pub mod config;

pub mod events;
mod gateway;
mod identity;
pub mod lease;
mod listener;
mod protocol;
mod proxy;
mod redact;
mod role;
mod shutdown;
pub mod store;
mod telemetry;
mod tls;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub mod work;

pub use config::{Config, ConfigError};
pub use lease::{
    Coordinator, CoordinatorBuilder, CoordinatorError, HeldLease, LeaseTimings, OneShotLease,
    RoleLease, RolePartition,
};
pub use proxy::{
    Cidr, ForwardError, Forwarder, HolderService, KeyExtractor, KeySource, LayerError,
    LayerOptions, PartitionHolderLayer, Problem, Reason, RoleHolderLayer,
};
pub use role::{RoleName, RoleNameError, MAX_PARTITION_COUNT, MAX_ROLE_NAME_LEN};
pub use store::{LeaseStore, StoreConfig, StoreError, StoreKind};

/// The Rust snippets of `docs/` pages other than `docs/library.md` (the crate
/// docs above) are compiled here as doctests, one hidden item per page, e.g.
/// `#[doc = include_str!("../docs/PAGE.md")] struct Page;`.
/// `tests/doc_snippets.rs` fails when a page with a snippet is missing.
#[cfg(doctest)]
mod doc_snippets {}

/// Not API: the binary's entry point and the internals that the tests,
/// benchmarks and fuzz targets exercise directly. May change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::cli::main;
    pub use crate::proxy::{canonical, forward, headers, hop, routes};
}
