#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]
// Output goes through `cli`'s `say!`/`tell!`, which lose a line a closed
// stdout or stderr cannot take; `println!` would panic instead.
#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]
#![doc = include_str!("../docs/library.md")]

#[cfg(feature = "gateway")]
mod admin;
mod body;
#[cfg(feature = "gateway")]
mod cli;
mod config;

#[cfg(feature = "gateway")]
mod events;
#[cfg(feature = "gateway")]
mod gateway;
#[cfg(any(test, fuzzing, feature = "gateway"))]
mod http1;
mod identity;
pub mod lease;
#[cfg(feature = "gateway")]
mod listener;
mod protocol;
mod proxy;
mod redact;
mod role;
#[cfg(feature = "gateway")]
mod shutdown;
pub mod store;
mod telemetry;
mod tls;
mod value;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub mod work;

#[cfg(feature = "gateway")]
pub use cli::main as cli_main;
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

/// The pure rules the fuzz targets in `fuzz/` drive: path readings and
/// routing, key extraction, header preparation, hop markers and the
/// config's route targets. Built only
/// by `cargo fuzz` (`--cfg fuzzing`), never part of the API.
#[cfg(fuzzing)]
pub mod fuzzing {
    pub use crate::config::RouteTarget;
    pub use crate::http1::oracle;
    pub use crate::proxy::{canonical, forward, headers, hop, routes};
}
