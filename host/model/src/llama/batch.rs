//! What a forward takes and gives besides the weights: the batch (one
//! sequence or several, each with its caches and its rows of the step),
//! which rows' logits come back, and the outputs record (layer taps, the
//! profiler's probe).
use crate::cache::LayerCache;
use specd_mlx::{ops, Array, Result};

/// Which positions' logits a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position (prefill, plain decoding).
    Last,
    /// Every new position (a speculative verify).
    All,
}

/// One sequence's part of a forward: a lone request is a batch of one.
pub struct Seq<'a> {
    /// Its caches, indexed by the model's layer (at least up to the last
    /// layer the forward runs).
    pub caches: &'a mut [Box<dyn LayerCache>],
    /// How many of the step's rows are its (at least one), in batch order.
    pub rows: i32,
    /// Which of its rows' logits come back; `None`: none (prefill).
    pub logits: Option<Logits>,
}

impl Seq<'_> {
    /// What [`crate::Llama::unembed`] reads of it.
    pub fn want(&self) -> Want {
        Want {
            rows: self.rows,
            logits: self.logits,
        }
    }
}

/// One sequence's rows of a step and which of them to unembed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    pub rows: i32,
    pub logits: Option<Logits>,
}

/// Token ids `[T]` (uint32) for [`crate::Llama::embed`].
pub fn ids(tokens: &[u32]) -> Result<Array> {
    Array::from_u32(tokens, &[tokens.len() as i32])
}

/// Each sequence's rows `(first, count)` among the step's.
pub fn spans(rows: impl IntoIterator<Item = i32>) -> Vec<(i32, i32)> {
    let mut at = 0;
    rows.into_iter()
        .map(|n| {
            at += n;
            (at - n, n)
        })
        .collect()
}

/// One sequence's part of a layer: its cache of the layer, and its rows
/// (first, count) among the step's.
pub(crate) type SeqSpan<'a> = (&'a mut Box<dyn LayerCache>, (i32, i32));

/// What [`crate::Llama::unembed`] gives: `[rows, vocab]` for the rows the
/// sequences asked for, in order (`None` where none did), and per sequence
/// its rows `(first, count)` among them (`None`: a prefill chunk).
pub struct Unembedded {
    pub logits: Option<Array>,
    pub spans: Vec<Option<(i32, i32)>>,
    /// The last layer's output over every row, `[1, rows, hidden]`, before
    /// the final norm (what an MTP head drafts from).
    pub hidden: Array,
}

impl Unembedded {
    /// The logits, where some sequence asked for them.
    pub fn logits(self) -> Result<Array> {
        self.logits
            .ok_or_else(|| specd_mlx::Exception("no sequence asked for logits".into()))
    }
}

/// Called with a part's name and outputs as a forward builds them.
pub type Probe<'a> = dyn FnMut(&'static str, &[&Array]) -> Result<()> + 'a;

/// The probe of every forward but the profiler's.
pub fn no_probe(_: &'static str, _: &[&Array]) -> Result<()> {
    Ok(())
}

/// What a forward records besides its output: the rows at the layer
/// boundaries asked for ([`Taps`]) and, for `specd profile`, a probe
/// called with each part as it is built.
pub struct Outputs<'a> {
    pub taps: Taps,
    probe: Box<Probe<'a>>,
}

impl<'a> Outputs<'a> {
    /// Nothing besides the output.
    pub fn none() -> Outputs<'a> {
        Outputs::tapped(&[])
    }

    /// The rows at these layer boundaries ([`Taps::at`]).
    pub fn tapped(boundaries: &[usize]) -> Outputs<'a> {
        Outputs {
            taps: Taps::at(boundaries),
            probe: Box::new(no_probe),
        }
    }

    /// Every part, to `probe`, as it is built.
    pub fn probed(probe: impl FnMut(&'static str, &[&Array]) -> Result<()> + 'a) -> Outputs<'a> {
        Outputs {
            taps: Taps::default(),
            probe: Box::new(probe),
        }
    }

    /// The taps and the probe, for the layers to write to.
    pub(crate) fn parts(&mut self) -> (&mut Taps, &mut Probe<'a>) {
        (&mut self.taps, &mut *self.probe)
    }
}

/// Rows of the residual stream a forward keeps besides its output, at
/// layer boundaries: boundary k holds the rows after the first k layers
/// (0: the embedding; the layer count: the last layer's output, before the
/// final norm). EAGLE-3 heads read three of them, as vLLM numbers them
/// (`eagle_aux_hidden_state_layer_ids`, `_maybe_add_hidden_state` in its
/// llama.py).
#[derive(Default)]
pub struct Taps {
    at: Vec<usize>,
    rows: Vec<Option<Array>>,
}

impl Taps {
    pub fn at(boundaries: &[usize]) -> Taps {
        Taps {
            at: boundaries.to_vec(),
            rows: vec![None; boundaries.len()],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    /// `x`, the rows at boundary `k`, kept where asked for.
    pub(crate) fn offer(&mut self, k: usize, x: &Array) {
        for (b, r) in self.at.iter().zip(&mut self.rows) {
            if *b == k {
                *r = Some(x.clone());
            }
        }
    }

    /// The rows kept, concatenated in the order asked for.
    pub fn features(&mut self) -> Result<Array> {
        let rows = self.take()?;
        ops::concatenate(&rows.iter().collect::<Vec<_>>(), 2)
    }

    /// The rows kept, in the order the boundaries were asked for.
    pub fn take(&mut self) -> Result<Vec<Array>> {
        let rows = std::mem::take(&mut self.rows);
        self.at
            .iter()
            .zip(rows)
            .map(|(b, r)| {
                r.ok_or_else(|| {
                    specd_mlx::Exception(format!(
                        "no rows at layer boundary {b} (past this process's layers)"
                    ))
                })
            })
            .collect()
    }
}
