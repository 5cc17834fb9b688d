//! A rank after 0: it holds a range of the layers and their caches, and
//! runs them over each frame's rows until rank 0 says stop.
use super::link::lost;
use super::wire::{header, Frame, Kind, HEADER};
use super::Group;
use crate::cache::{CacheOp, KvCache, LayerCache, Snapshot};
use crate::llama::{Llama, Outputs, Seq};
use anyhow::{bail, Context, Result};
use specd_mlx::{distributed as dist, Array, Dtype};
use std::collections::HashMap;
use std::time::Instant;

/// Where a stage's time went.
#[derive(Debug, Default, Clone, Copy)]
pub struct StageTimings {
    /// Frames with rows this rank ran its layers over.
    pub frames: u64,
    /// Waiting for a frame (idle, or the ranks before this one working).
    pub wait_seconds: f64,
    /// Receiving a step's rows once its header is here.
    pub recv_seconds: f64,
    /// This rank's layers.
    pub compute_seconds: f64,
    pub send_seconds: f64,
}

/// The caches this rank holds, by the ids rank 0 gave them.
#[derive(Default)]
struct Caches {
    caches: HashMap<u64, Box<dyn LayerCache>>,
    snaps: HashMap<u64, Snapshot>,
}

impl Caches {
    fn apply(&mut self, model: &Llama, op: CacheOp) -> Result<()> {
        let mine = model.first_layer..model.first_layer + model.layers.len();
        match op {
            CacheOp::New { id, layer } if mine.contains(&layer) => {
                self.caches.insert(id, model.new_cache(layer));
            }
            CacheOp::New { .. } => {}
            CacheOp::Clone { from, to } => {
                if let Some(c) = self.caches.get(&from) {
                    let c = c.boxed_clone();
                    self.caches.insert(to, c);
                }
            }
            CacheOp::Free { id } => {
                self.caches.remove(&id);
            }
            CacheOp::Rewind { id, to } => {
                if let Some(c) = self.caches.get_mut(&id) {
                    if !c.rewind(to) {
                        bail!("cache {id} could not rewind to {to}, as rank 0 expected it to");
                    }
                }
            }
            CacheOp::Prepare { id, offsets } => {
                if let Some(c) = self.caches.get_mut(&id) {
                    c.prepare_snapshots(&offsets);
                }
            }
            CacheOp::Take { id, snaps } => {
                if let Some(c) = self.caches.get_mut(&id) {
                    let taken = c.take_snapshots();
                    if taken.len() != snaps.len() {
                        bail!(
                            "cache {id} took {} snapshots where rank 0 expected {}",
                            taken.len(),
                            snaps.len()
                        );
                    }
                    self.snaps.extend(snaps.into_iter().zip(taken));
                }
            }
            CacheOp::Restore { id, snap } => {
                if let Some(c) = self.caches.get_mut(&id) {
                    let s = self
                        .snaps
                        .get(&snap)
                        .with_context(|| format!("restoring cache {id}: no snapshot {snap}"))?;
                    c.restore(s);
                }
            }
            CacheOp::DropSnap { snap } => {
                self.snaps.remove(&snap);
            }
        }
        Ok(())
    }

    /// Runs `model`'s layers over a step's rows `x`, each sequence over
    /// its own caches (moved out for the step and back after).
    fn step(&mut self, model: &Llama, frame: &Frame, x: &Array) -> Result<Array> {
        let n = model.layer_count();
        let mine = model.first_layer..model.first_layer + model.layers.len();
        let mut per_seq: Vec<Vec<Box<dyn LayerCache>>> = Vec::with_capacity(frame.seqs.len());
        for s in &frame.seqs {
            let mut v: Vec<Box<dyn LayerCache>> = Vec::with_capacity(n);
            for li in 0..n {
                let c = if mine.contains(&li) {
                    let id = s.ids[li - frame.first_remote];
                    self.caches
                        .remove(&id)
                        .with_context(|| format!("layer {li}: no cache {id} on this rank"))?
                } else {
                    Box::new(KvCache::new())
                };
                v.push(c);
            }
            per_seq.push(v);
        }
        let out = {
            let mut rows: Vec<Seq<'_>> = per_seq
                .iter_mut()
                .zip(&frame.seqs)
                .map(|(caches, s)| Seq {
                    caches,
                    rows: s.rows as i32,
                    logits: None,
                })
                .collect();
            model.layers(mine.clone(), x.clone(), &mut rows, &mut Outputs::none())
        };
        // Back where they live, whatever the forward did.
        for (v, s) in per_seq.into_iter().zip(&frame.seqs) {
            for (li, c) in v.into_iter().enumerate() {
                if mine.contains(&li) {
                    self.caches.insert(s.ids[li - frame.first_remote], c);
                }
            }
        }
        Ok(out?)
    }
}

/// Serves frames until rank 0 sends stop (`Ok`) or a peer is lost.
pub fn serve(model: &Llama, group: Group) -> Result<StageTimings> {
    let (prev, next) = (group.prev(), group.next());
    let last = group.rank + 1 == group.size;
    let d = model.config.hidden_size as i32;
    let mut caches = Caches::default();
    let mut t = StageTimings::default();
    let io = |e: specd_mlx::Exception| lost(&e.0);
    loop {
        let t0 = Instant::now();
        let h = dist::recv(&[HEADER], Dtype::Uint32, prev)?;
        h.eval().map_err(io)?;
        let (kind, words, rows) = header(&h.to_vec_u32()?)?;
        let w = dist::recv(&[words as i32], Dtype::Uint32, prev)?;
        w.eval().map_err(io)?;
        if !last {
            // The next rank can read the frame while this one works.
            dist::send(&h, next)?.eval().map_err(io)?;
            dist::send(&w, next)?.eval().map_err(io)?;
        }
        let mut frame = Frame::decode(&w.to_vec_u32()?)?;
        debug_assert_eq!(frame.kind as u32, kind);
        for op in std::mem::take(&mut frame.ops) {
            caches.apply(model, op)?;
        }
        let t1 = Instant::now();
        t.wait_seconds += (t1 - t0).as_secs_f64();
        match frame.kind {
            Kind::Stop => return Ok(t),
            Kind::Ping => {
                if last {
                    let pong = Array::from_u32(&[1], &[1])?;
                    dist::send(&pong, next)?.eval().map_err(io)?;
                }
            }
            Kind::Step => {
                let dtype = specd_mlx::Dtype::from_u8(frame.dtype)
                    .with_context(|| format!("a frame's dtype code {}", frame.dtype))?;
                let x = dist::recv(&[1, rows, d], dtype, prev)?;
                x.eval().map_err(io)?;
                let t2 = Instant::now();
                let y = caches.step(model, &frame, &x)?;
                y.eval()?;
                let t3 = Instant::now();
                dist::send(&y, next)?.eval().map_err(io)?;
                t.frames += 1;
                t.recv_seconds += (t2 - t1).as_secs_f64();
                t.compute_seconds += (t3 - t2).as_secs_f64();
                t.send_seconds += t3.elapsed().as_secs_f64();
            }
        }
    }
}
