//! The draft-length schedules ([`ScheduleLogic`](crate::ScheduleLogic)
//! implementations), one file each.

mod adaedl;
mod bandit;
mod constant;
mod heuristic;
mod throughput;

pub use adaedl::AdaEdl;
pub use bandit::Bandit;
pub use constant::Constant;
pub use heuristic::{Heuristic, HeuristicTransient};
pub use throughput::{
    batch_share, estimate_verify, Throughput, ThroughputCarry, CARRY_WEIGHT, PROBE_AFTER,
};

/// The default first k (`constant`'s `k`, `heuristic`'s and `throughput`'s
/// `initial`).
fn default_initial() -> u32 {
    4
}
