//! Per-layer attention caches behind one trait: an offset, a live rewind
//! where the cache can, and snapshots where it cannot (a rotating cache that
//! wrapped). Before a speculative forward the round asks for snapshots at the
//! offsets it may roll back to (`prepare_snapshots`); the cache takes them
//! during the forward (`take_snapshots`); `restore` puts one back. Every
//! snapshot is dropped when the round ends, and a counter proves it.
pub mod kv;
pub mod ops;
pub mod prefix;
pub mod rotating;
pub mod suffix;

pub use kv::KvCache;
pub use ops::{CacheOp, OpQueue, RemoteSnap};
pub use prefix::PrefixCache;
pub use rotating::RotatingCache;
pub use suffix::SuffixCorpus;

use specd_mlx::{Array, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What a snapshot holds: the rows themselves, or the handle of a
/// snapshot another process took of the cache it holds.
pub enum Held {
    Rows { keys: Array, values: Array },
    Remote(RemoteSnap),
}

/// A cache's state at one offset. Counted while alive.
pub struct Snapshot {
    pub offset: usize,
    pub held: Held,
    live: Arc<AtomicUsize>,
}

impl Snapshot {
    pub fn new(offset: usize, keys: Array, values: Array, live: &Arc<AtomicUsize>) -> Snapshot {
        Snapshot::of(offset, Held::Rows { keys, values }, live)
    }

    /// A snapshot another process holds.
    pub fn remote(offset: usize, remote: RemoteSnap, live: &Arc<AtomicUsize>) -> Snapshot {
        Snapshot::of(offset, Held::Remote(remote), live)
    }

    fn of(offset: usize, held: Held, live: &Arc<AtomicUsize>) -> Snapshot {
        live.fetch_add(1, Ordering::SeqCst);
        Snapshot {
            offset,
            held,
            live: live.clone(),
        }
    }

    /// The handle of a snapshot another process holds.
    pub fn remote_snap(&self) -> Option<&RemoteSnap> {
        match &self.held {
            Held::Remote(r) => Some(r),
            Held::Rows { .. } => None,
        }
    }

    /// What a cache holds once restored to this snapshot: its keys, values
    /// and offset.
    pub fn held(&self) -> (Option<Array>, Option<Array>, usize) {
        match &self.held {
            Held::Rows { keys, values } => (Some(keys.clone()), Some(values.clone()), self.offset),
            Held::Remote(_) => (None, None, self.offset),
        }
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

pub trait LayerCache: Send {
    /// Tokens held.
    fn offset(&self) -> usize;
    /// Appends `k`, `v` (`[1, kv_heads, T, head_dim]`) and returns the keys
    /// and values the new queries attend to.
    fn update(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)>;
    /// Moves back to `offset` in place; false where it cannot.
    fn rewind(&mut self, offset: usize) -> bool;
    /// Offsets the next update should snapshot (those a round may keep).
    fn prepare_snapshots(&mut self, offsets: &[usize]);
    /// The snapshots the last update took (and clears the schedule).
    fn take_snapshots(&mut self) -> Vec<Snapshot>;
    /// Puts a snapshot back; the cache then holds `snap.offset` tokens.
    fn restore(&mut self, snap: &Snapshot);
    /// Arrays to evaluate to materialize the cache.
    fn state(&self) -> Vec<&Array>;
    /// Snapshots alive (taken and not yet dropped), and offsets still scheduled.
    fn snapshot_counts(&self) -> (usize, usize);
    /// A deep-enough copy for the prefix cache (arrays are immutable; this
    /// shares buffers).
    fn boxed_clone(&self) -> Box<dyn LayerCache>;
    /// The plain KV cache behind the trait, for the fused attention kernel
    /// that writes it in place; `None` for every other kind.
    fn as_kv(&mut self) -> Option<&mut KvCache> {
        None
    }
    /// The cache as `Any`, for a layer that knows which kind it made (a
    /// pipeline's caches of other ranks' layers).
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
    /// Bytes of keys and values held (the prefix cache's bound counts them).
    fn held_bytes(&self) -> usize {
        self.state().iter().map(|a| a.nbytes()).sum()
    }
}

pub(crate) fn live_count(c: &Arc<AtomicUsize>) -> usize {
    c.load(Ordering::SeqCst)
}
