//! Rank 0's end of the ring: it sends each step's frame and hidden rows
//! to rank 1 and waits for the last rank's rows to come back.
use super::remote::RemoteCache;
use super::wire::{Frame, Kind, Seq, HEADER};
use super::{Group, Split};
use crate::cache::{LayerCache, OpQueue};
use crate::LlamaConfig;
use anyhow::{anyhow, Context, Result};
use specd_mlx::{distributed as dist, Array, Dtype};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Where rank 0's time in the ring went, summed over its frames.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timings {
    /// Frames sent with rows (a batched step is two: its micro-batches).
    pub frames: u64,
    /// Evaluating rank 0's own layers (before the rows can go).
    pub local_seconds: f64,
    /// Sending the header, the description and the rows.
    pub send_seconds: f64,
    /// Waiting for the rows to come back: the other ranks' layers and
    /// every hop's transfer.
    pub recv_seconds: f64,
}

/// A step on its way around the ring: what comes back.
pub struct Sent {
    shape: Vec<i32>,
    dtype: Dtype,
}

pub struct Downstream {
    pub group: Group,
    pub split: Split,
    ops: Arc<OpQueue>,
    /// The rotating window of each layer's cache (`None`: a plain one).
    windows: Vec<Option<usize>>,
    /// KV bytes a token takes in one layer (the remote caches count them).
    token_bytes: AtomicUsize,
    /// Set once the other ranks were told to exit: nothing more is sent.
    stopped: AtomicBool,
    /// Set once a peer was lost: nothing more can run.
    broken: AtomicBool,
    /// Whether a batched step goes as two micro-batches (the default).
    pub micro_batches: AtomicBool,
    /// Held while a frame is sent or received: one thread on the ring at a
    /// time (frames come back in the order sent).
    timings: Mutex<Timings>,
}

impl Downstream {
    pub fn new(group: Group, split: Split, config: &LlamaConfig, token_bytes: usize) -> Self {
        let windows = (0..config.num_hidden_layers)
            .map(|i| config.sliding_window.filter(|_| config.is_local(i)))
            .collect();
        Downstream {
            group,
            split,
            ops: Arc::new(OpQueue::default()),
            windows,
            token_bytes: AtomicUsize::new(token_bytes),
            stopped: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            micro_batches: AtomicBool::new(true),
            timings: Mutex::new(Timings::default()),
        }
    }

    /// Whether a peer of the group was lost: nothing more can run (rank
    /// 0's health reports it before the process exits).
    pub fn broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    fn mark_broken(&self) {
        self.broken.store(true, Ordering::SeqCst);
    }

    /// The first layer another rank holds.
    pub fn first_remote(&self) -> usize {
        self.split.ranges[0].end
    }

    /// A cache for `layer`, which another rank holds.
    pub fn new_cache(&self, layer: usize) -> Box<dyn LayerCache> {
        Box::new(RemoteCache::new(
            &self.ops,
            layer,
            self.windows[layer],
            self.token_bytes.load(Ordering::Relaxed),
        ))
    }

    /// The KV bytes a token takes in one layer, for caches made from now.
    pub fn set_token_bytes(&self, bytes: usize) {
        self.token_bytes.store(bytes, Ordering::Relaxed);
    }

    pub fn timings(&self) -> Timings {
        *self.timings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The other ranks' layers over `x` `[1, T, hidden]`: the rows of
    /// each `(caches, rows)` in order, the caches of every layer. Returns
    /// the last layer's rows (evaluated).
    pub fn forward<'a>(
        &self,
        x: &Array,
        seqs: impl Iterator<Item = (&'a mut [Box<dyn LayerCache>], i32)>,
    ) -> Result<Array> {
        let sent = self.send(x, seqs)?;
        self.recv(sent)
    }

    /// Sends a step's rows `x` on (as [`Downstream::forward`]); the rows
    /// come back through [`Downstream::recv`], in the order sent.
    pub fn send<'a>(
        &self,
        x: &Array,
        seqs: impl Iterator<Item = (&'a mut [Box<dyn LayerCache>], i32)>,
    ) -> Result<Sent> {
        let first = self.first_remote();
        let seqs = seqs
            .map(|(caches, rows)| {
                let ids = caches[first..]
                    .iter_mut()
                    .map(|c| {
                        let r = c
                            .as_any_mut()
                            .downcast_mut::<RemoteCache>()
                            .context("a layer another rank holds has a local cache")?;
                        r.advance(rows as usize);
                        Ok(r.id)
                    })
                    .collect::<Result<Vec<u64>>>()?;
                Ok(Seq {
                    rows: rows as u32,
                    ids,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut t = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        if self.stopped.load(Ordering::SeqCst) {
            return Err(anyhow!("the other ranks were told to stop"));
        }
        let t0 = Instant::now();
        x.eval()?;
        let t1 = Instant::now();
        let frame = Frame {
            kind: Kind::Step,
            ops: self.ops.take(),
            first_remote: first,
            seqs,
            dtype: x.dtype() as u8,
        };
        self.exchange(&frame, Some(x))
            .inspect_err(|_| self.mark_broken())?;
        t.frames += 1;
        t.local_seconds += (t1 - t0).as_secs_f64();
        t.send_seconds += t1.elapsed().as_secs_f64();
        Ok(Sent {
            shape: x.shape(),
            dtype: x.dtype(),
        })
    }

    /// The rows of the oldest step sent and not yet received.
    pub fn recv(&self, sent: Sent) -> Result<Array> {
        let mut t = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        let t0 = Instant::now();
        let y = dist::recv(&sent.shape, sent.dtype, self.group.prev())?;
        y.eval()
            .map_err(|e| lost(&e.0))
            .inspect_err(|_| self.mark_broken())?;
        t.recv_seconds += t0.elapsed().as_secs_f64();
        Ok(y)
    }

    /// A round trip with no rows: every rank is there (and the pending
    /// cache operations are applied). Errors once a peer is lost.
    pub fn ping(&self) -> Result<()> {
        let _t = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        if self.stopped.load(Ordering::SeqCst) {
            return Ok(());
        }
        let frame = self.control(Kind::Ping);
        self.exchange(&frame, None)
            .and_then(|()| {
                let pong = dist::recv(&[1], Dtype::Uint32, self.group.prev())?;
                pong.eval().map_err(|e| lost(&e.0))
            })
            .inspect_err(|_| self.mark_broken())
    }

    /// Tells every rank to exit (rank 0 is done); once.
    pub fn stop(&self) -> Result<()> {
        let _t = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        if self.stopped.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let frame = self.control(Kind::Stop);
        self.exchange(&frame, None)
    }

    fn control(&self, kind: Kind) -> Frame {
        Frame {
            kind,
            ops: self.ops.take(),
            first_remote: self.first_remote(),
            seqs: Vec::new(),
            dtype: 0,
        }
    }

    /// Sends `frame` (and a step's rows `x`) to the next rank.
    fn exchange(&self, frame: &Frame, x: Option<&Array>) -> Result<()> {
        let (header, words) = frame.encode()?;
        let next = self.group.next();
        let send =
            |a: &Array| -> Result<()> { dist::send(a, next)?.eval().map_err(|e| lost(&e.0)) };
        send(&Array::from_u32(&header, &[HEADER])?)?;
        send(&Array::from_u32(&words, &[words.len() as i32])?)?;
        if let Some(x) = x {
            send(x)?;
        }
        Ok(())
    }
}

/// The error every rank gives when a peer is gone.
pub fn lost(detail: &str) -> anyhow::Error {
    anyhow!("a rank of the pipeline group was lost ({detail}); this process cannot run the model any more")
}
