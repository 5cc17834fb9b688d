//! What is done to a cache that another process holds, as values: the
//! operations (made where the cache is seen, applied where it is held) and
//! the handle of a snapshot taken there. The caches here know nothing of
//! how the operations travel; a pipeline's wire (`crate::ranks`) carries
//! them.
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One cache operation, in the order it was made; the process holding
/// the caches applies those of its own, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CacheOp {
    /// A fresh cache `id` for layer `layer`.
    New {
        id: u64,
        layer: usize,
    },
    /// `to` a copy of `from` (the prefix cache keeps it).
    Clone {
        from: u64,
        to: u64,
    },
    Free {
        id: u64,
    },
    Rewind {
        id: u64,
        to: usize,
    },
    /// The offsets the next update should snapshot.
    Prepare {
        id: u64,
        offsets: Vec<usize>,
    },
    /// The snapshots the last update took, named in the order taken.
    Take {
        id: u64,
        snaps: Vec<u64>,
    },
    Restore {
        id: u64,
        snap: u64,
    },
    DropSnap {
        snap: u64,
    },
}

/// The operations made since they were last taken, in order, and the ids
/// given to caches and snapshots.
#[derive(Default)]
pub struct OpQueue {
    queue: Mutex<Vec<CacheOp>>,
    next: AtomicU64,
}

impl OpQueue {
    pub fn push(&self, op: CacheOp) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(op);
    }
    pub fn take(&self) -> Vec<CacheOp> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }
    pub fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// A snapshot another process holds; dropping it frees it there.
pub struct RemoteSnap {
    pub id: u64,
    /// Tokens the cache keeps once restored to it.
    pub kept: usize,
    ops: Arc<OpQueue>,
}

impl RemoteSnap {
    /// Snapshot `id`, named by the queue that tells its holder.
    pub fn new(id: u64, kept: usize, ops: &Arc<OpQueue>) -> RemoteSnap {
        RemoteSnap {
            id,
            kept,
            ops: ops.clone(),
        }
    }
}

impl Drop for RemoteSnap {
    fn drop(&mut self) {
        self.ops.push(CacheOp::DropSnap { snap: self.id });
    }
}
