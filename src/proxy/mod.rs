//! The proxy: route table and keys, the holder decision, forwarding, header
//! rules, problem answers and the tower layers.

pub(crate) mod affine;
#[allow(unreachable_pub)] // pub for the fuzz targets (`crate::fuzzing`)
pub mod canonical;
pub(crate) mod defaults;
mod form_body;
#[allow(unreachable_pub)] // pub for the fuzz targets (`crate::fuzzing`)
pub mod forward;
pub(crate) mod gate;
pub(crate) mod h2pool;
#[allow(unreachable_pub)] // pub for the fuzz targets (`crate::fuzzing`)
pub mod headers;
pub(crate) mod hold;
#[allow(unreachable_pub)] // pub for the fuzz targets (`crate::fuzzing`)
pub mod hop;
pub(crate) mod idle;
pub(crate) mod keys;
pub(crate) mod layer;
pub(crate) mod problem;
#[cfg(test)]
mod properties;
#[allow(unreachable_pub)] // pub for the fuzz targets (`crate::fuzzing`)
pub mod routes;
pub(crate) mod stack;
pub(crate) mod term_body;
pub(crate) mod trust;
pub(crate) mod tunnel;
#[cfg(any(test, feature = "gateway"))]
pub(crate) mod turns;

#[cfg(feature = "gateway")]
pub(crate) use affine::Affinity;
pub(crate) use forward::HopProtocol;
pub use forward::{ForwardError, Forwarder};
#[cfg(feature = "gateway")]
pub(crate) use gate::{failure_problem, NextHop};
pub(crate) use keys::FormBody;
pub use keys::{KeyExtractor, KeySource};
pub use layer::{HolderService, LayerError, LayerOptions, PartitionHolderLayer, RoleHolderLayer};
pub use problem::{Problem, Reason};
pub use trust::Cidr;
