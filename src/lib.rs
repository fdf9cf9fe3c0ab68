#![forbid(unsafe_code)]
#![doc = include_str!("../docs/library.md")]

pub mod admin;
pub mod cli;
pub mod config;
pub mod demo;
pub mod events;
pub mod gateway;
pub mod identity;
pub mod lease;
pub mod listener;
pub mod proxy;
pub mod redact;
pub mod role;
pub mod store;
pub mod telemetry;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub mod work;

pub use config::{Config, ConfigError, LeaseTimings};
pub use lease::{Coordinator, CoordinatorBuilder, HeldLease, RoleLease, RolePartition};
