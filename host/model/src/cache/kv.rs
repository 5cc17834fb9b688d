//! The plain KV cache: keys/values grow in steps, and a rewind just moves the
//! offset back (the rows past it are overwritten by the next update).
//!
//! Two ways in. [`KvCache::update`] appends through MLX ops (slice_update,
//! functional). The fused attention kernel (`kernels::attention_kv_rows`,
//! one op per layer for every sequence of a step) instead writes the new
//! rows into the buffers in place: [`KvCache::writable`] hands it buffers
//! this cache allocated itself and shares with no clone (the prefix cache
//! holds clones), copying first where needed, and [`KvCache::written`] takes
//! back the buffers ordered after the write.
use specd_mlx::{kernels, ops, Array, Dtype, Result};
use std::sync::Arc;

const STEP: i32 = 256;

#[derive(Clone, Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    /// Set while the buffers are the in-place kernel's own (from
    /// `kernels::kv_alloc`); every clone of the cache shares it, so a count
    /// above one means another cache reads the same buffers and a write in
    /// place must copy first.
    own: Option<Arc<()>>,
}

impl KvCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Tokens held.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Appends `k`, `v` (`[B, kv_heads, T, head_dim]`) and returns the whole
    /// cached keys and values.
    pub fn update(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        if self
            .keys
            .as_ref()
            .is_some_and(|k| k.dtype() != Dtype::Float32)
        {
            return Err(specd_mlx::Exception(
                "a 16-bit KV cache is written by the fused attention kernel only".into(),
            ));
        }
        let s = k.shape();
        let (b, h, t, d) = (s[0], s[1], s[2], s[3]);
        let vd = v.dim(3);
        let start = self.offset as i32;
        let end = start + t;
        let cap = self.keys.as_ref().map(|a| a.dim(2)).unwrap_or(0);
        if end > cap {
            let new_cap = (end + STEP - 1) / STEP * STEP;
            let grow = |old: Option<&Array>, dim: i32| -> Result<Array> {
                let fresh = Array::zeros(&[b, h, new_cap - start, dim], Dtype::Float32)?;
                match old {
                    Some(o) if start > 0 => {
                        let kept = o.slice(&[0, 0, 0, 0], &[b, h, start, dim])?;
                        ops::concatenate(&[&kept, &fresh], 2)
                    }
                    _ => Ok(fresh),
                }
            };
            self.keys = Some(grow(self.keys.as_ref(), d)?);
            self.values = Some(grow(self.values.as_ref(), vd)?);
        }
        let keys = self.keys.take().expect("allocated above");
        let values = self.values.take().expect("allocated above");
        let keys = keys.slice_update(k, &[0, 0, start, 0], &[b, h, end, d])?;
        let values = values.slice_update(v, &[0, 0, start, 0], &[b, h, end, vd])?;
        self.offset = end as usize;
        // The buffers are MLX's now (maybe donated): the in-place kernel
        // copies before writing.
        self.own = None;
        let out = (
            keys.slice(&[0, 0, 0, 0], &[b, h, end, d])?,
            values.slice(&[0, 0, 0, 0], &[b, h, end, vd])?,
        );
        self.keys = Some(keys);
        self.values = Some(values);
        Ok(out)
    }

    /// Buffers `[1, kv_heads, cap, head_dim]` with room for `rows` more
    /// tokens that the fused attention kernel may write in place: this
    /// cache's own and shared with no clone (a copy of the held tokens
    /// otherwise), grown in steps.
    pub fn writable(
        &mut self,
        rows: usize,
        kv_heads: i32,
        head_dim: i32,
        half: bool,
    ) -> Result<(&Array, &Array)> {
        let start = self.offset as i32;
        let end = start + rows as i32;
        let cap = self.keys.as_ref().map(|a| a.dim(2)).unwrap_or(0);
        let alone = matches!(&self.own, Some(o) if Arc::strong_count(o) == 1);
        let want = if half { Dtype::Float16 } else { Dtype::Float32 };
        let same_type = self.keys.as_ref().is_none_or(|k| k.dtype() == want);
        if end > cap || !alone || !same_type {
            let new_cap = if end > cap {
                (end + STEP - 1) / STEP * STEP
            } else {
                cap
            };
            let copy = |old: Option<&Array>| {
                kernels::kv_alloc(
                    old.filter(|_| start > 0),
                    start,
                    kv_heads,
                    new_cap,
                    head_dim,
                    half,
                )
            };
            self.keys = Some(copy(self.keys.as_ref())?);
            self.values = Some(copy(self.values.as_ref())?);
            self.own = Some(Arc::new(()));
        }
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Ok((k, v)),
            _ => unreachable!("allocated above"),
        }
    }

    /// After the kernel wrote `rows` tokens: its keys and values (the same
    /// buffers, ordered after the write).
    pub fn written(&mut self, rows: usize, keys: Array, values: Array) {
        self.keys = Some(keys);
        self.values = Some(values);
        self.offset += rows;
    }

    /// Moves the offset back to `offset` (a live rewind; always possible here).
    pub fn truncate(&mut self, offset: usize) {
        self.offset = self.offset.min(offset);
    }
}

impl super::LayerCache for KvCache {
    fn offset(&self) -> usize {
        self.offset
    }
    fn update(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        KvCache::update(self, k, v)
    }
    fn rewind(&mut self, offset: usize) -> bool {
        self.truncate(offset);
        true
    }
    // A plain KV cache always rewinds live: no snapshots needed.
    fn prepare_snapshots(&mut self, _: &[usize]) {}
    fn take_snapshots(&mut self) -> Vec<super::Snapshot> {
        Vec::new()
    }
    fn restore(&mut self, snap: &super::Snapshot) {
        (self.keys, self.values, self.offset) = snap.held();
        self.own = None;
    }
    fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }
    fn snapshot_counts(&self) -> (usize, usize) {
        (0, 0)
    }
    fn boxed_clone(&self) -> Box<dyn super::LayerCache> {
        Box::new(self.clone())
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn as_kv(&mut self) -> Option<&mut KvCache> {
        Some(self)
    }
}
