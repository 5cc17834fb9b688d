//! The model as rank 0 of a pipeline runs it: its own layers, then the
//! other ranks' ([`Downstream`]), with a batch's sequences split into two
//! micro-batches where that lets the ranks work at once. A process alone
//! is a pipeline of one rank (no downstream). The model itself
//! ([`Llama`]) knows nothing of ranks: this wrapper sits above it.
use super::Downstream;
use crate::cache::LayerCache;
use crate::llama::{Llama, Outputs, Seq, Unembedded};
use specd_mlx::{ops, Array, Result};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A model and, on rank 0 of a pipeline, the ranks that run the layers
/// after its own. Reads as the model it wraps.
#[derive(Clone)]
pub struct Pipeline {
    pub model: Llama,
    /// The ranks holding the layers after `model.layers` (their caches
    /// are [`super::RemoteCache`]s here).
    pub downstream: Option<Arc<Downstream>>,
}

impl Deref for Pipeline {
    type Target = Llama;
    fn deref(&self) -> &Llama {
        &self.model
    }
}

impl DerefMut for Pipeline {
    fn deref_mut(&mut self) -> &mut Llama {
        &mut self.model
    }
}

fn io(e: anyhow::Error) -> specd_mlx::Exception {
    specd_mlx::Exception(format!("{e:#}"))
}

impl Pipeline {
    /// A model that runs every layer in this process.
    pub fn alone(model: Llama) -> Pipeline {
        Pipeline {
            model,
            downstream: None,
        }
    }

    /// Fresh caches, one per layer of the model.
    pub fn new_caches(&self) -> Vec<Box<dyn LayerCache>> {
        self.new_caches_n(self.layer_count())
    }

    /// Caches for the first `n` layers: remote for the layers the other
    /// ranks hold.
    pub fn new_caches_n(&self, n: usize) -> Vec<Box<dyn LayerCache>> {
        (0..n)
            .map(|i| match &self.downstream {
                Some(d) if i >= self.local_end() => d.new_cache(i),
                _ => self.model.new_cache(i),
            })
            .collect()
    }

    /// The first `end` layers over `x` ([`Llama::layers`]): this
    /// process's, then, where `end` is past them, the other ranks' (all of
    /// theirs: a pipeline runs the whole model or rank 0's part).
    pub fn layers(
        &self,
        end: usize,
        x: Array,
        seqs: &mut [Seq<'_>],
        out: &mut Outputs<'_>,
    ) -> Result<Array> {
        let here = end.min(self.local_end());
        let x = self.model.layers(self.first_layer..here, x, seqs, out)?;
        if end <= here {
            return Ok(x);
        }
        match &self.downstream {
            Some(d) if end == self.layer_count() => d
                .forward(&x, seqs.iter_mut().map(|s| (&mut *s.caches, s.rows)))
                .map_err(io),
            _ => Err(specd_mlx::Exception(format!(
                "layers {here}..{end} are not held by this process"
            ))),
        }
    }

    /// A forward of token ids `ids` `[T]` (the sequences' rows in order)
    /// through the first `end` layers and the head: [`Llama::embed`], the
    /// layers, [`Llama::unembed`] of the rows each sequence asks for.
    pub fn forward(
        &self,
        ids: &Array,
        end: usize,
        seqs: &mut [Seq<'_>],
        out: &mut Outputs<'_>,
    ) -> Result<Unembedded> {
        if let Some(d) = &self.downstream {
            if seqs.len() > 1
                && end == self.layer_count()
                && d.micro_batches.load(Ordering::Relaxed)
            {
                if !out.taps.is_empty() {
                    return Err(specd_mlx::Exception(
                        "layer taps across pipeline ranks".into(),
                    ));
                }
                return self.forward_halves(d, ids, seqs, out);
            }
        }
        let x = self.layers(end, self.embed(ids)?, seqs, out)?;
        let wants: Vec<_> = seqs.iter().map(Seq::want).collect();
        self.unembed(&x, &wants, out)
    }

    /// [`Pipeline::forward`] on rank 0 of a pipeline, as two
    /// micro-batches: the second half's layers here run while the next
    /// rank runs the first half's, and the first half's head while it runs
    /// the second's. Every row is computed as in one batch (the kernels
    /// are batch-invariant), so the result is the same, bit for bit.
    fn forward_halves(
        &self,
        d: &Downstream,
        ids: &Array,
        seqs: &mut [Seq<'_>],
        out: &mut Outputs<'_>,
    ) -> Result<Unembedded> {
        // Halves of about equal rows, each at least one sequence.
        let total: i32 = seqs.iter().map(|s| s.rows).sum();
        let mut mid = 1;
        let mut rows = seqs[0].rows;
        while mid + 1 < seqs.len() && 2 * (rows + seqs[mid].rows) <= total {
            rows += seqs[mid].rows;
            mid += 1;
        }
        let (a, b) = seqs.split_at_mut(mid);
        let mut sent = Vec::with_capacity(2);
        let mut first = 0;
        for half in [&mut *a, &mut *b] {
            let n: i32 = half.iter().map(|s| s.rows).sum();
            let x = self.embed(&ids.slice(&[first], &[first + n])?)?;
            first += n;
            let x = self.model.layers(0..self.local_end(), x, half, out)?;
            let rows = half.iter_mut().map(|s| (&mut *s.caches, s.rows));
            sent.push(d.send(&x, rows).map_err(io)?);
        }
        let mut outs = Vec::with_capacity(2);
        for (half, x) in [&*a, &*b].into_iter().zip(sent) {
            let x = d.recv(x).map_err(io)?;
            let wants: Vec<_> = half.iter().map(Seq::want).collect();
            let u = self.unembed(&x, &wants, out)?;
            // Computed now: the next rank works on the other half meanwhile.
            if let Some(l) = &u.logits {
                l.eval()?;
            }
            outs.push(u);
        }
        let (ub, ua) = (outs.pop().expect("two"), outs.pop().expect("two"));
        let shift = ua.logits.as_ref().map_or(0, |l| l.dim(0));
        let logits = match (ua.logits, ub.logits) {
            (Some(x), Some(y)) => Some(ops::concatenate(&[&x, &y], 0)?),
            (x, y) => x.or(y),
        };
        let spans = ua
            .spans
            .into_iter()
            .chain(ub.spans.into_iter().map(|s| s.map(|(f, n)| (f + shift, n))))
            .collect();
        Ok(Unembedded {
            logits,
            spans,
            hidden: ops::concatenate(&[&ua.hidden, &ub.hidden], 1)?,
        })
    }
}
