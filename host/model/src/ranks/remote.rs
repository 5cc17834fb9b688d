//! Rank 0's view of a cache another rank holds.
use crate::cache::{CacheOp, LayerCache, OpQueue, RemoteSnap, Snapshot};
use specd_mlx::{Array, Result};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// A cache of another rank's layer, as rank 0 sees it. It answers from
/// the cache's shape, which it keeps as the cache itself does (a plain KV
/// cache, or a rotating one of `window` tokens: `crate::cache::rotating`'s
/// rules), and queues every operation for the rank that holds the cache.
pub struct RemoteCache {
    pub id: u64,
    ops: Arc<OpQueue>,
    window: Option<usize>,
    /// KV bytes one token takes in this layer.
    token_bytes: usize,
    offset: usize,
    kept: usize,
    pending: Vec<usize>,
    /// `(offset, kept)` of the snapshots the last update took.
    taken: Vec<(usize, usize)>,
    live: Arc<AtomicUsize>,
}

impl RemoteCache {
    /// A fresh cache for `layer` (created there with the next frame).
    pub fn new(
        ops: &Arc<OpQueue>,
        layer: usize,
        window: Option<usize>,
        token_bytes: usize,
    ) -> Self {
        let id = ops.id();
        ops.push(CacheOp::New { id, layer });
        RemoteCache {
            id,
            ops: ops.clone(),
            window: window.map(|w| w.max(1)),
            token_bytes,
            offset: 0,
            kept: 0,
            pending: Vec::new(),
            taken: Vec::new(),
            live: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The frame that carries `rows` new rows for this cache is on its way:
    /// what the cache's update does there, done to its shape here.
    pub fn advance(&mut self, rows: usize) {
        if let Some(w) = self.window {
            for o in std::mem::take(&mut self.pending) {
                if o > self.offset && o <= self.offset + rows {
                    self.taken.push((o, (self.kept + (o - self.offset)).min(w)));
                }
            }
            self.kept = (self.kept + rows).min(w);
        } else {
            self.kept += rows;
        }
        self.offset += rows;
    }
}

impl Drop for RemoteCache {
    fn drop(&mut self) {
        self.ops.push(CacheOp::Free { id: self.id });
    }
}

impl LayerCache for RemoteCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn update(&mut self, _: &Array, _: &Array) -> Result<(Array, Array)> {
        unreachable!("a remote cache is written by the rank that holds it")
    }

    fn rewind(&mut self, to: usize) -> bool {
        if let Some(w) = self.window {
            // RotatingCache::rewind's rule.
            if to >= self.offset {
                return to == self.offset;
            }
            let first = self.offset - self.kept;
            if to.saturating_sub(w) < first {
                return false;
            }
            self.kept -= self.offset - to;
        } else {
            self.kept = self.kept.min(to);
        }
        if to < self.offset {
            self.offset = to;
            self.ops.push(CacheOp::Rewind { id: self.id, to });
        }
        true
    }

    fn prepare_snapshots(&mut self, offsets: &[usize]) {
        // A plain cache rewinds live and takes none.
        if self.window.is_some() {
            self.pending = offsets.to_vec();
            self.ops.push(CacheOp::Prepare {
                id: self.id,
                offsets: offsets.to_vec(),
            });
        }
    }

    fn take_snapshots(&mut self) -> Vec<Snapshot> {
        if self.window.is_none() {
            return Vec::new();
        }
        let pending = std::mem::take(&mut self.pending);
        let taken = std::mem::take(&mut self.taken);
        if pending.is_empty() && taken.is_empty() {
            return Vec::new();
        }
        let snaps: Vec<Snapshot> = taken
            .into_iter()
            .map(|(offset, kept)| {
                let id = self.ops.id();
                Snapshot::remote(offset, RemoteSnap::new(id, kept, &self.ops), &self.live)
            })
            .collect();
        self.ops.push(CacheOp::Take {
            id: self.id,
            snaps: snaps
                .iter()
                .filter_map(|s| s.remote_snap().map(|r| r.id))
                .collect(),
        });
        snaps
    }

    fn restore(&mut self, snap: &Snapshot) {
        let (id, kept) = snap
            .remote_snap()
            .map(|r| (r.id, r.kept))
            .expect("a remote cache restores the snapshots it took");
        self.ops.push(CacheOp::Restore {
            id: self.id,
            snap: id,
        });
        (self.offset, self.kept) = (snap.offset, kept);
    }

    fn state(&self) -> Vec<&Array> {
        Vec::new()
    }

    fn held_bytes(&self) -> usize {
        self.kept * self.token_bytes
    }

    fn snapshot_counts(&self) -> (usize, usize) {
        (crate::cache::live_count(&self.live), self.pending.len())
    }

    fn boxed_clone(&self) -> Box<dyn LayerCache> {
        let id = self.ops.id();
        self.ops.push(CacheOp::Clone {
            from: self.id,
            to: id,
        });
        Box::new(RemoteCache {
            id,
            ops: self.ops.clone(),
            window: self.window,
            token_bytes: self.token_bytes,
            offset: self.offset,
            kept: self.kept,
            pending: Vec::new(),
            taken: Vec::new(),
            live: Arc::new(AtomicUsize::new(0)),
        })
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::RotatingCache;
    use specd_mlx::Dtype;

    /// `t` rows of keys/values `[1, 1, t, 2]`.
    fn rows(t: i32) -> Array {
        Array::zeros(&[1, 1, t, 2], Dtype::Float32).unwrap()
    }

    /// A remote cache answers every call as the rotating cache it stands
    /// for, through a speculative round's life: updates past the window,
    /// snapshots, rewinds that can and cannot happen in place, restores
    /// and clones.
    #[test]
    fn a_remote_cache_keeps_a_rotating_cache_shape() {
        let ops = Arc::new(OpQueue::default());
        let mut real = RotatingCache::new(8);
        let mut shadow = RemoteCache::new(&ops, 3, Some(8), 16);
        let same = |r: &RotatingCache, s: &RemoteCache| {
            assert_eq!(r.offset(), s.offset());
            assert_eq!(r.snapshot_counts(), s.snapshot_counts());
        };
        let update = |r: &mut RotatingCache, s: &mut RemoteCache, t: i32| {
            r.update(&rows(t), &rows(t)).unwrap();
            s.advance(t as usize);
        };
        update(&mut real, &mut shadow, 5);
        same(&real, &shadow);
        assert_eq!(real.rewind(3), shadow.rewind(3));
        same(&real, &shadow);
        // Rounds past the window: snapshot at the offsets kept.
        for round in 0..6 {
            let base = real.offset();
            let keep = [base + 1, base + 2, base + 4];
            real.prepare_snapshots(&keep);
            shadow.prepare_snapshots(&keep);
            update(&mut real, &mut shadow, 4);
            let (a, b) = (real.take_snapshots(), shadow.take_snapshots());
            assert_eq!(
                a.iter().map(|s| s.offset).collect::<Vec<_>>(),
                b.iter().map(|s| s.offset).collect::<Vec<_>>()
            );
            same(&real, &shadow);
            // Accept 1 of 3 drafts: rewind in place where it can, else
            // restore the snapshot.
            let to = base + 2;
            let (ra, rb) = (real.rewind(to), shadow.rewind(to));
            assert_eq!(ra, rb, "round {round}");
            if !ra {
                let i = a.iter().position(|s| s.offset == to).unwrap();
                real.restore(&a[i]);
                shadow.restore(&b[i]);
            }
            same(&real, &shadow);
            let (x, y) = (real.boxed_clone(), shadow.boxed_clone());
            assert_eq!(x.offset(), y.offset());
            assert_eq!(x.held_bytes() / 16, y.held_bytes() / 16);
        }
        assert_eq!(real.snapshot_counts(), (0, 0));
        assert_eq!(shadow.snapshot_counts(), (0, 0));
        // What the rank holding the cache is told, in order.
        let told = ops.take();
        assert!(matches!(told[0], CacheOp::New { layer: 3, .. }));
        for kind in ["Prepare", "Take", "Restore", "Clone", "Free", "DropSnap"] {
            assert!(
                told.iter().any(|o| format!("{o:?}").starts_with(kind)),
                "no {kind} in {told:?}"
            );
        }
    }
}
