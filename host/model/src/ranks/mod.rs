//! A model across processes: pipeline ranks over MLX's distributed backend.
//!
//! Rank 0 holds the embedding, the head and the first layers; every other
//! rank a contiguous range of the layers after them ([`Split`]). A step's
//! hidden rows go around the ring: rank 0 runs its layers and sends the
//! rows on with the step's description ([`wire::Frame`]); each rank runs
//! its layers and sends them to the next; the last sends them back to rank
//! 0, which runs the final norm and head. Everything above the forward
//! (scheduling, policies, sampling, the prefix cache) lives on rank 0 only.
//!
//! Rank 0 sees the other ranks' KV caches as [`RemoteCache`]s: the same
//! `LayerCache` trait, so the round, rollback and the prefix cache work on
//! them unchanged. A remote cache keeps the cache's shape (offset, tokens
//! kept, scheduled snapshots) to answer at once, and queues each operation
//! (create, clone, free, rewind, snapshot, restore) to travel with the next
//! frame; every rank applies them in order to its own caches before its
//! layers run ([`stage`]).
pub mod link;
pub mod pipeline;
pub mod remote;
pub mod split;
pub mod stage;
pub mod wire;

pub use link::{Downstream, Timings};
pub use pipeline::Pipeline;
pub use remote::RemoteCache;
pub use split::Split;

/// A process's place in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub rank: usize,
    pub size: usize,
}

impl Group {
    /// The rank frames come from (ring order).
    pub fn prev(&self) -> i32 {
        ((self.rank + self.size - 1) % self.size) as i32
    }
    /// The rank frames go to (ring order).
    pub fn next(&self) -> i32 {
        ((self.rank + 1) % self.size) as i32
    }
}
