//! A sliding-window cache: it keeps the last `window` tokens. Once it has
//! wrapped (evicted tokens), rolling back past the eviction is impossible in
//! place, so a speculative round snapshots the offsets it may keep and
//! restores one.
use super::{live_count, LayerCache, Snapshot};
use specd_mlx::{ops, Array, Result};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Snapshot restores of rotating caches in this process. A rotating cache
/// is restored only when it cannot rewind in place, i.e. after its window
/// wrapped: tests read this to know a long speculative run took that path.
static RESTORES: AtomicU64 = AtomicU64::new(0);

/// How many times a rotating cache was restored from a snapshot (after a
/// wrap), process-wide.
pub fn restores() -> u64 {
    RESTORES.load(Ordering::Relaxed)
}

pub struct RotatingCache {
    window: usize,
    /// `[1, h, n, d]`, the last n <= window tokens in order.
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    pending: Vec<usize>,
    taken: Vec<Snapshot>,
    live: Arc<AtomicUsize>,
}

impl RotatingCache {
    pub fn new(window: usize) -> Self {
        RotatingCache {
            window: window.max(1),
            keys: None,
            values: None,
            offset: 0,
            pending: Vec::new(),
            taken: Vec::new(),
            live: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn kept(&self) -> usize {
        self.keys.as_ref().map(|k| k.dim(2) as usize).unwrap_or(0)
    }

    /// The last `min(window, len)` entries of the first `len` of `a`.
    fn window_of(&self, a: &Array, len: usize) -> Result<Array> {
        let s = a.shape();
        let start = len.saturating_sub(self.window) as i32;
        a.slice(&[0, 0, start, 0], &[s[0], s[1], len as i32, s[3]])
    }
}

impl LayerCache for RotatingCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn update(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        let t = k.dim(2) as usize;
        let n = self.kept();
        let (fk, fv) = match (&self.keys, &self.values) {
            (Some(ok), Some(ov)) => (
                ops::concatenate(&[ok, k], 2)?,
                ops::concatenate(&[ov, v], 2)?,
            ),
            _ => (k.clone(), v.clone()),
        };
        // Snapshots at the scheduled offsets inside this update.
        let pending = std::mem::take(&mut self.pending);
        for o in pending {
            if o > self.offset && o <= self.offset + t {
                let len = n + (o - self.offset);
                let snap = Snapshot::new(
                    o,
                    self.window_of(&fk, len)?,
                    self.window_of(&fv, len)?,
                    &self.live,
                );
                self.taken.push(snap);
            }
        }
        self.offset += t;
        self.keys = Some(self.window_of(&fk, n + t)?);
        self.values = Some(self.window_of(&fv, n + t)?);
        // The new queries attend to the previous window plus themselves.
        Ok((fk, fv))
    }

    fn rewind(&mut self, to: usize) -> bool {
        if to >= self.offset {
            return to == self.offset;
        }
        let n = self.kept();
        let first = self.offset - n; // position of the oldest kept token
                                     // Positions [to - window, to) must all still be here.
        if to.saturating_sub(self.window) < first {
            return false;
        }
        let drop = self.offset - to;
        let keep = n - drop;
        let cut = |a: &Array| {
            let s = a.shape();
            a.slice(&[0, 0, 0, 0], &[s[0], s[1], keep as i32, s[3]])
        };
        match (self.keys.as_ref().map(cut), self.values.as_ref().map(cut)) {
            (Some(Ok(k)), Some(Ok(v))) => {
                self.keys = Some(k);
                self.values = Some(v);
                self.offset = to;
                true
            }
            _ => false,
        }
    }

    fn prepare_snapshots(&mut self, offsets: &[usize]) {
        self.pending = offsets.to_vec();
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn take_snapshots(&mut self) -> Vec<Snapshot> {
        self.pending.clear();
        std::mem::take(&mut self.taken)
    }

    fn restore(&mut self, snap: &Snapshot) {
        RESTORES.fetch_add(1, Ordering::Relaxed);
        (self.keys, self.values, self.offset) = snap.held();
    }

    fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }

    fn snapshot_counts(&self) -> (usize, usize) {
        (live_count(&self.live), self.pending.len())
    }

    fn boxed_clone(&self) -> Box<dyn LayerCache> {
        Box::new(RotatingCache {
            keys: self.keys.clone(),
            values: self.values.clone(),
            offset: self.offset,
            ..RotatingCache::new(self.window)
        })
    }
}
