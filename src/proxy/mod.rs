//! The proxy: route table and keys, the holder decision, forwarding, header
//! rules, problem answers and the tower layers.

pub(crate) mod affine;
pub mod canonical;
pub mod defaults;
pub mod forward;
pub mod gate;
pub(crate) mod h2pool;
pub mod headers;
pub mod hold;
pub mod hop;
pub mod idle;
pub mod keys;
pub mod layer;
pub mod problem;
pub mod routes;
pub(crate) mod term_body;
pub mod trust;
pub(crate) mod tunnel;
pub(crate) mod turns;

pub(crate) use affine::Affinity;
pub use forward::{ForwardError, Forwarder, HopProtocol};
pub use gate::{failure_problem, NextHop, Settled};
pub use keys::{KeyExtractor, KeySource};
pub use layer::{HolderService, LayerError, LayerOptions, PartitionHolderLayer, RoleHolderLayer};
pub use problem::{Problem, Reason};
pub use trust::Cidr;
