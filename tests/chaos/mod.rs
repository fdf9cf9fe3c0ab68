//! The parts of the fault-injection test (`tests/chaos.rs`): the store the
//! run uses and its faults (`backend.rs`), the harness (processes, load and
//! faults), the TCP fault proxy, and the checker.

pub mod backend;
pub mod checker;
pub mod fault_proxy;
pub mod harness;

/// Gateways in the cluster.
pub const GATEWAYS: usize = 5;
/// Partition roles, besides the one plain role.
pub const PARTITIONS: u32 = 16;
