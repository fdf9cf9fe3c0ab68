//! The parts of the fault-injection test (`tests/chaos.rs`): the harness
//! (processes, load and faults), the TCP fault proxy, and the checker.

pub mod checker;
pub mod fault_proxy;
pub mod harness;

/// Gateways in the cluster.
pub const GATEWAYS: usize = 5;
/// Partition roles, besides the one plain role.
pub const PARTITIONS: u32 = 16;
/// Lease timings of every gateway.
pub const DURATION_MS: u64 = 1_000;
pub const RENEW_MS: u64 = 250;
pub const MARGIN_MS: u64 = 300;
