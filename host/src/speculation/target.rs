//! What a round needs from a model: forward new tokens after what its
//! caches hold, get logits rows back as plain numbers, and roll back.
//! [`LlamaTarget`] is the real thing; tests script fakes with one-hot logits.
use super::rows::{RowArgmax, VerifyRows};
use super::stats::ForwardTimes;
use crate::cache::{LayerCache, Snapshot};
use crate::model::llama::{ids, Outputs, Seq, Want};
use crate::model::ranks::Pipeline;
use crate::model::Logits;
use crate::sampling::argmax_margin;
use anyhow::{Context, Result};
use specd_mlx::{kernels, ops, Array};
use std::sync::Arc;
use std::time::Instant;

/// What a round's verify forward copies back ([`Target::verify`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VerifyMode {
    /// Every row's logits.
    #[default]
    Rows,
    /// Only each row's argmax and top-2 margin, computed on the device (what
    /// a plain greedy round reads).
    Argmax,
}

pub trait Target: Send {
    fn vocab_size(&self) -> usize;
    /// Tokens its caches hold.
    fn offset(&self) -> usize;
    /// Forwards `tokens` after the cached ones; returns logits for every new
    /// position when `all`, else only for the last.
    fn forward(&mut self, tokens: &[u32], all: bool) -> Result<Vec<Vec<f32>>>;
    /// A round's verify: forwards `tokens` after the cached ones (logits of
    /// every new position) and returns what `mode` asks for.
    /// Where `taps` is given, the forward's feature rows come back too
    /// ([`Verified::hidden`]; a target without features gives none). The
    /// default reads the rows through [`Target::forward`].
    fn verify(
        &mut self,
        tokens: &[u32],
        mode: VerifyMode,
        _taps: Option<&[usize]>,
    ) -> Result<Verified> {
        let rows = self.forward(tokens, tokens.len() > 1)?;
        let rows = if mode == VerifyMode::Argmax {
            VerifyRows::Argmax(rows.iter().map(|r| RowArgmax::of(r)).collect())
        } else {
            VerifyRows::Logits(rows)
        };
        Ok(Verified { rows, hidden: None })
    }
    /// What the last [`Target::verify`] or [`Target::forward`] spent its time
    /// on, where the target measures it (zeros otherwise).
    fn take_forward_times(&mut self) -> ForwardTimes {
        ForwardTimes::default()
    }
    /// Forwards without computing logits (prefill); the feature rows of
    /// `taps` where given, as [`Target::verify`].
    fn prefill(&mut self, tokens: &[u32], taps: Option<&[usize]>) -> Result<Option<HiddenRows>>;
    /// Rolls the caches back to `offset` tokens: in place where possible,
    /// else from a snapshot the last forward took. Drops every snapshot.
    fn rewind(&mut self, offset: usize) -> Result<()>;
    /// Asks the next forward to snapshot these offsets (the points a
    /// speculative round may roll back to).
    fn prepare_snapshots(&mut self, _offsets: &[usize]) {}
    /// Snapshots alive and offsets still scheduled, summed over layers.
    fn snapshot_counts(&self) -> (usize, usize) {
        (0, 0)
    }
    /// Plain greedy decoding, overlapped: `pending` (the token the caches do
    /// not hold yet) is forwarded, then each token produced, at most `max`.
    /// Every token goes to `each(token, top-2 margin)`, which returns false
    /// to stop. Ends with the caches holding all but the last token produced,
    /// as after plain rounds; returns how many were produced. `None` where
    /// the target cannot (then the caller runs plain rounds).
    fn greedy_overlapped(
        &mut self,
        _pending: u32,
        _max: usize,
        _each: &mut dyn FnMut(u32, f32) -> Result<bool>,
    ) -> Option<Result<usize>> {
        None
    }
}

/// What a forward gives back: its rows, and where the caller named taps,
/// the feature rows of the positions it forwarded (what an MTP head drafts
/// from).
pub struct Verified {
    pub rows: VerifyRows,
    pub hidden: Option<HiddenRows>,
}

/// The feature rows a draft head reads (the last layer's output before the
/// final norm, or tapped boundaries side by side) at consecutive positions
/// of a sequence: `rows` `[1, n, width]` for positions `start..start + n`.
/// Where a request's head reads them, the layer boundaries are its taps
/// (empty: the last layer's output).
#[derive(Clone)]
pub struct HiddenRows {
    pub start: usize,
    pub rows: Array,
}

impl std::fmt::Debug for HiddenRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HiddenRows({}..{})", self.start, self.end())
    }
}

impl HiddenRows {
    /// `next` after these rows where it follows on and the run stays
    /// within [`MAX_KEPT_HIDDEN`], else `next` in their place.
    pub fn then(self, next: HiddenRows) -> Result<HiddenRows> {
        if self.end() == next.start && self.len() + next.len() <= MAX_KEPT_HIDDEN {
            return Ok(HiddenRows {
                start: self.start,
                rows: ops::concatenate(&[&self.rows, &next.rows], 1)?,
            });
        }
        Ok(next)
    }

    /// The rows of positions before `offset` (a roll back to `offset`:
    /// rejected drafts' rows go with their cache entries).
    pub fn before(self, offset: usize) -> Result<HiddenRows> {
        if offset <= self.start {
            return Ok(self);
        }
        let keep = (offset - self.start).min(self.len()) as i32;
        if keep as usize == self.len() {
            return Ok(self);
        }
        let d = self.rows.dim(2);
        Ok(HiddenRows {
            start: self.start,
            rows: self.rows.slice(&[0, 0, 0], &[1, keep, d])?,
        })
    }

    pub fn len(&self) -> usize {
        self.rows.dim(1) as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn end(&self) -> usize {
        self.start + self.len()
    }
}

/// Rows kept beyond this many without a draft head reading them are
/// dropped (a drafter that failed no longer reads them; nothing should grow
/// without bound).
const MAX_KEPT_HIDDEN: usize = 8192;

/// A llama (or its first `n_layers` layers, for self-speculation) with its
/// own per-layer KV caches.
pub struct LlamaTarget {
    pub model: Arc<Pipeline>,
    pub caches: Vec<Box<dyn LayerCache>>,
    pub n_layers: usize,
    /// Per layer, what the forwards since the last rewind snapshotted.
    snapshots: Vec<Vec<Snapshot>>,
    /// The last forward's times.
    times: ForwardTimes,
}

impl LlamaTarget {
    pub fn new(model: Arc<Pipeline>) -> Self {
        let n = model.layer_count();
        Self::first_layers(model, n)
    }

    pub fn first_layers(model: Arc<Pipeline>, n_layers: usize) -> Self {
        let n_layers = n_layers.clamp(1, model.layer_count());
        let caches = model.new_caches_n(n_layers);
        LlamaTarget {
            model,
            caches,
            n_layers,
            snapshots: Vec::new(),
            times: ForwardTimes::default(),
        }
    }

    pub fn with_caches(model: Arc<Pipeline>, caches: Vec<Box<dyn LayerCache>>) -> Self {
        let n_layers = caches.len();
        LlamaTarget {
            model,
            caches,
            n_layers,
            snapshots: Vec::new(),
            times: ForwardTimes::default(),
        }
    }

    /// The layers' output over token ids `ids` `[T]`, and where `taps` is
    /// given, its feature rows (positions from the caches' offset on).
    fn hidden(
        &mut self,
        ids: &Array,
        taps: Option<&[usize]>,
    ) -> Result<(Array, Option<HiddenRows>)> {
        let start = self.offset();
        let mut out = match taps {
            Some(taps) => Outputs::tapped(taps),
            None => Outputs::none(),
        };
        let x = self.model.embed(ids)?;
        let mut seq = [Seq {
            caches: &mut self.caches,
            rows: ids.dim(0),
            logits: None,
        }];
        let h = self.model.layers(self.n_layers, x, &mut seq, &mut out)?;
        // Its features: the last layer's rows, or its taps side by side.
        let features = match taps {
            None => None,
            Some([]) => Some(h.clone()),
            Some(_) => Some(out.taps.features()?),
        };
        let hidden = features.map(|rows| HiddenRows { start, rows });
        Ok((h, hidden))
    }

    /// The logits of `which` of the rows `h` `[1, T, hidden]`.
    fn unembed(&self, h: &Array, which: Logits) -> Result<Array> {
        let want = Want {
            rows: h.dim(1),
            logits: Some(which),
        };
        Ok(self
            .model
            .unembed(h, &[want], &mut Outputs::none())?
            .logits()?)
    }

    /// Adds what the last forward snapshotted: a model drafter forwards one
    /// token at a time and may roll back past several of them.
    fn collect_snapshots(&mut self) {
        let taken: Vec<Vec<Snapshot>> =
            self.caches.iter_mut().map(|c| c.take_snapshots()).collect();
        if self.snapshots.len() != taken.len() {
            self.snapshots = taken;
            return;
        }
        for (kept, new) in self.snapshots.iter_mut().zip(taken) {
            kept.extend(new);
        }
    }

    /// Queues one forward of `ids` and the argmax of its logits on the
    /// device, without waiting: the argmax can feed the next forward before
    /// the host has seen it.
    fn queue_greedy(&mut self, ids: &Array) -> Result<(Array, Array)> {
        let (h, _) = self.hidden(ids, None)?;
        let logits = self.unembed(&h, Logits::Last)?;
        let next = ops::argmax(&logits, -1, false)?;
        specd_mlx::async_eval(&[&next, &logits])?;
        Ok((logits, next))
    }

    fn run_greedy_overlapped(
        &mut self,
        pending: u32,
        max: usize,
        each: &mut dyn FnMut(u32, f32) -> Result<bool>,
    ) -> Result<usize> {
        let base = self.offset();
        let mut produced = 0usize;
        let mut cur = Some(self.queue_greedy(&Array::from_u32(&[pending], &[1])?)?);
        while let Some((logits, next)) = cur.take() {
            // The following forward is queued before this one is waited on:
            // building its graph overlaps this one's compute.
            let ahead = if produced + 1 < max {
                Some(self.queue_greedy(&next)?)
            } else {
                None
            };
            let (tok, margin) = argmax_margin(&logits.to_vec_f32()?);
            let fed = next.to_vec_u32()?[0];
            produced += 1;
            if !each(tok, margin)? {
                break;
            }
            cur = if fed == tok {
                ahead
            } else {
                // An exact tie the device broke otherwise: the queued
                // forward took the wrong token. Redo it with the host's.
                self.rewind(base + produced)?;
                if produced < max {
                    Some(self.queue_greedy(&Array::from_u32(&[tok], &[1])?)?)
                } else {
                    None
                }
            };
        }
        self.rewind(base + produced)?;
        Ok(produced)
    }

    /// Starts the clock and builds the forward of `tokens` (the `which`
    /// rows' logits, the feature rows of `taps`), then takes the caches'
    /// snapshots.
    fn build(
        &mut self,
        tokens: &[u32],
        which: Logits,
        taps: Option<&[usize]>,
    ) -> Result<(Array, Option<HiddenRows>, Instant)> {
        let t = Instant::now();
        let (h, hidden) = self.hidden(&ids(tokens)?, taps)?;
        let logits = self.unembed(&h, which)?;
        self.collect_snapshots();
        Ok((logits, hidden, t))
    }

    /// Runs `eval` (the wait for the device) then `read` (the copy to the
    /// host), and records them as [`ForwardTimes`] with the build since `t`.
    fn timed<T>(
        &mut self,
        t: Instant,
        eval: impl FnOnce() -> Result<()>,
        read: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let built = t.elapsed().as_secs_f64();
        eval()?;
        let device = t.elapsed().as_secs_f64() - built;
        let out = read()?;
        self.times = ForwardTimes {
            build: built,
            device,
            readback: t.elapsed().as_secs_f64() - built - device,
        };
        Ok(out)
    }

    /// Evaluates `logits` (built since `t`) and copies every row to the host.
    fn read_rows(&mut self, logits: Array, t: Instant) -> Result<Vec<Vec<f32>>> {
        let vocab = self.vocab_size();
        self.timed(
            t,
            || Ok(logits.eval()?),
            || {
                Ok(logits
                    .to_vec_f32()?
                    .chunks(vocab)
                    .map(|c| c.to_vec())
                    .collect())
            },
        )
    }

    fn eval_caches(&self) -> Result<()> {
        let state: Vec<&specd_mlx::Array> = self.caches.iter().flat_map(|c| c.state()).collect();
        specd_mlx::eval(&state)?;
        Ok(())
    }
}

impl Target for LlamaTarget {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn offset(&self) -> usize {
        self.caches.first().map(|c| c.offset()).unwrap_or(0)
    }

    fn forward(&mut self, tokens: &[u32], all: bool) -> Result<Vec<Vec<f32>>> {
        let which = if all { Logits::All } else { Logits::Last };
        let (logits, _, t) = self.build(tokens, which, None)?;
        self.read_rows(logits, t)
    }

    fn verify(
        &mut self,
        tokens: &[u32],
        mode: VerifyMode,
        taps: Option<&[usize]>,
    ) -> Result<Verified> {
        let which = if tokens.len() > 1 {
            Logits::All
        } else {
            Logits::Last
        };
        let (logits, hidden, t) = self.build(tokens, which, taps)?;
        if mode == VerifyMode::Rows {
            let rows = VerifyRows::Logits(self.read_rows(logits, t)?);
            return Ok(Verified { rows, hidden });
        }
        let stats = DeviceArgmax::queue(&[&logits])?;
        // The logits are evaluated with the statistics and kept (for a
        // flagged row, read back whole); one sync, one small copy.
        let mut rows = self.timed(
            t,
            || Ok(specd_mlx::eval(&[&stats.values, &logits])?),
            || stats.read(&[&logits]),
        )?;
        let rows = VerifyRows::Argmax(rows.pop().unwrap_or_default());
        Ok(Verified { rows, hidden })
    }

    fn take_forward_times(&mut self) -> ForwardTimes {
        std::mem::take(&mut self.times)
    }

    fn prefill(&mut self, tokens: &[u32], taps: Option<&[usize]>) -> Result<Option<HiddenRows>> {
        if tokens.is_empty() {
            return Ok(None);
        }
        // Caches are all we need: skip the head.
        let (_, hidden) = self.hidden(&ids(tokens)?, taps)?;
        self.collect_snapshots();
        self.eval_caches()?;
        Ok(hidden)
    }

    fn rewind(&mut self, offset: usize) -> Result<()> {
        let snapshots = std::mem::take(&mut self.snapshots);
        for (i, c) in self.caches.iter_mut().enumerate() {
            if c.offset() == offset || c.rewind(offset) {
                continue;
            }
            let snap = snapshots
                .get(i)
                .and_then(|s| s.iter().find(|s| s.offset == offset))
                .ok_or_else(|| {
                    anyhow::anyhow!("layer {i} cannot rewind to {offset} and has no snapshot there")
                })?;
            c.restore(snap);
        }
        Ok(())
    }

    fn prepare_snapshots(&mut self, offsets: &[usize]) {
        for c in &mut self.caches {
            c.prepare_snapshots(offsets);
        }
    }

    fn greedy_overlapped(
        &mut self,
        pending: u32,
        max: usize,
        each: &mut dyn FnMut(u32, f32) -> Result<bool>,
    ) -> Option<Result<usize>> {
        // A wrapped sliding window cannot drop the one forward queued ahead.
        if self.model.config.sliding_window.is_some() || max == 0 {
            return None;
        }
        Some(self.run_greedy_overlapped(pending, max, each))
    }

    fn snapshot_counts(&self) -> (usize, usize) {
        self.caches
            .iter()
            .map(|c| c.snapshot_counts())
            .fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
    }
}

/// Per row of some logits arrays (each `[n, vocab]`), queued on the device
/// as `values` `[rows, 4]` ([`kernels::row_top2_list`]: one op, one pass
/// over each row): the argmax (as a float: exact below 2^24, which every
/// vocabulary is), the largest logit, the largest at any other index, and
/// whether the row is free of NaN. Only these four numbers a row are copied
/// back.
struct DeviceArgmax {
    values: Array,
}

impl DeviceArgmax {
    fn queue(logits: &[&Array]) -> Result<DeviceArgmax> {
        Ok(DeviceArgmax {
            values: kernels::row_top2_list(logits)?,
        })
    }

    /// Per array of `logits` (those queued, in order), its rows' argmax and
    /// margin, as [`argmax_margin`] gives them on the host (the kernel
    /// keeps what the host's scan keeps, ties and signed zeros included). A
    /// row the kernel flags (one holding a NaN; on a GPU, also a tie) is
    /// read back whole and decided on the host.
    fn read(&self, logits: &[&Array]) -> Result<Vec<Vec<RowArgmax>>> {
        let v = self.values.to_vec_f32()?;
        let mut stats = v.chunks(4);
        logits
            .iter()
            .map(|l| {
                let (n, vocab) = (l.dim(0), l.dim(1));
                (0..n)
                    .map(|r| {
                        let s = stats.next().context("a statistics row per logits row")?;
                        let (argmax, top, second, exact) = (s[0] as u32, s[1], s[2], s[3]);
                        if exact == 1.0 {
                            return Ok(RowArgmax {
                                argmax,
                                margin: top - second,
                            });
                        }
                        let row = l
                            .slice(&[r, 0], &[r + 1, vocab])?
                            .to_vec_f32()
                            .context("reading a flagged row back")?;
                        Ok(RowArgmax::of(&row))
                    })
                    .collect()
            })
            .collect()
    }
}

/// One sequence's part of a batched step ([`forward_batch`]).
pub struct StepRows<'a> {
    pub target: &'a mut LlamaTarget,
    /// Its new tokens (at least one) after what its caches hold.
    pub tokens: &'a [u32],
    /// Which rows' logits it wants; `None` for a prefill chunk.
    pub logits: Option<Logits>,
    /// Where its drafter reads the target's feature rows: their layer
    /// boundaries (empty: the last layer's output); they come back with its
    /// rows ([`Verified::hidden`]).
    pub taps: Option<&'a [usize]>,
}

/// One forward over the rows of several targets of `model` (each over all
/// its layers): the continuous-batching step. Per target, in order, its
/// logits rows (none for a prefill chunk), as [`Target::forward`] returns
/// them; snapshots are taken as there, and every cache is evaluated.
pub fn forward_batch(model: &Pipeline, parts: &mut [StepRows<'_>]) -> Result<Vec<Vec<Vec<f32>>>> {
    let modes = vec![VerifyMode::Rows; parts.len()];
    forward_batch_verify(model, parts, &modes)?
        .into_iter()
        .map(|r| match r.rows {
            VerifyRows::Logits(rows) => Ok(rows),
            VerifyRows::Argmax(_) => anyhow::bail!("argmax rows where logits were asked"),
        })
        .collect()
}

/// [`forward_batch`], with what each target's rows become (`modes[i]` for
/// `parts[i]`, as [`Target::verify`] gives them): a light part gets only
/// each row's argmax and top-2 margin ([`RowArgmax::of`], the host's rule),
/// its rows never held as vectors. A prefill chunk gets `Logits` with no
/// rows. A part that names taps gets its feature rows ([`Verified::hidden`]).
///
/// A light part's statistics are queued on the device ([`DeviceArgmax`],
/// one pass over its rows) with the step and evaluated in the same sync,
/// as a lone light round does; only they are copied back.
pub fn forward_batch_verify(
    model: &Pipeline,
    parts: &mut [StepRows<'_>],
    modes: &[VerifyMode],
) -> Result<Vec<Verified>> {
    anyhow::ensure!(modes.len() == parts.len(), "one verify mode per part");
    for p in parts.iter() {
        anyhow::ensure!(
            p.target.n_layers == model.layer_count() && std::ptr::eq(&*p.target.model, model),
            "a batched step runs full targets of one model"
        );
    }
    // Where each part's rows start in its sequence and in the step.
    let starts: Vec<(usize, i32)> = parts
        .iter()
        .scan(0i32, |at, p| {
            let here = *at;
            *at += p.tokens.len() as i32;
            Some((p.target.offset(), here))
        })
        .collect();
    // Every boundary a part's head reads, each tapped once for the step.
    let mut taps: Vec<usize> = Vec::new();
    for p in parts.iter() {
        for b in p.taps.unwrap_or_default() {
            if !taps.contains(b) {
                taps.push(*b);
            }
        }
    }
    let mut out = Outputs::tapped(&taps);
    let tokens: Vec<u32> = parts
        .iter()
        .flat_map(|p| p.tokens.iter().copied())
        .collect();
    let batch = {
        let mut rows: Vec<Seq<'_>> = parts
            .iter_mut()
            .map(|p| Seq {
                caches: &mut p.target.caches,
                rows: p.tokens.len() as i32,
                logits: p.logits,
            })
            .collect();
        model.forward(&ids(&tokens)?, model.layer_count(), &mut rows, &mut out)?
    };
    let tapped = out.taps.take()?;
    let mut hidden = Vec::with_capacity(parts.len());
    for (p, &(start, at)) in parts.iter().zip(&starts) {
        let Some(want) = p.taps else {
            hidden.push(None);
            continue;
        };
        // Its features: the last layer's rows, or its taps side by side.
        let n = p.tokens.len() as i32;
        let of = |a: &Array| a.slice(&[0, at, 0], &[1, at + n, a.dim(2)]);
        let rows = match want {
            [] => of(&batch.hidden)?,
            want => {
                let cols = want
                    .iter()
                    .map(|b| of(&tapped[taps.iter().position(|x| x == b).expect("a union")]))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                ops::concatenate(&cols.iter().collect::<Vec<_>>(), 2)?
            }
        };
        hidden.push(Some(HiddenRows { start, rows }));
    }
    let part_rows = |l: &Array, (a, n): (i32, i32)| l.slice(&[a, 0], &[a + n, l.dim(1)]);
    // Where every part that has rows reads them light (a greedy decode or
    // verify step), the statistics of all the rows come from one op over
    // the logits as they are; otherwise each part's rows are a slice.
    let all_light = batch
        .spans
        .iter()
        .zip(modes)
        .all(|(s, m)| s.is_none() || *m == VerifyMode::Argmax);
    let outs: Vec<Option<Array>> = match (&batch.logits, all_light) {
        (Some(l), false) => batch
            .spans
            .iter()
            .map(|s| s.map(|s| part_rows(l, s)).transpose())
            .collect::<std::result::Result<_, _>>()?,
        _ => vec![None; parts.len()],
    };
    let light: Vec<&Array> = match (&batch.logits, all_light) {
        (Some(l), true) => vec![l],
        _ => outs
            .iter()
            .zip(modes)
            .filter_map(|(o, m)| o.as_ref().filter(|_| *m == VerifyMode::Argmax))
            .collect(),
    };
    let stats = if light.is_empty() {
        None
    } else {
        Some(DeviceArgmax::queue(&light)?)
    };
    let mut wanted: Vec<&Array> = outs.iter().flatten().chain(&batch.logits).collect();
    wanted.extend(stats.as_ref().map(|s| &s.values));
    for (p, s) in parts.iter().zip(&batch.spans) {
        if s.is_none() {
            wanted.extend(p.target.caches.iter().flat_map(|c| c.state()));
        }
    }
    specd_mlx::eval(&wanted)?;
    // The light parts' rows in part order, whether read from the whole
    // logits or from each light part's slice in turn.
    let mut light_rows = stats
        .map(|s| s.read(&light))
        .transpose()?
        .unwrap_or_default()
        .into_iter()
        .flatten();
    let vocab = model.config.vocab_size;
    let mut res = Vec::with_capacity(parts.len());
    for (((p, (o, span)), mode), hidden) in parts
        .iter_mut()
        .zip(outs.iter().zip(&batch.spans))
        .zip(modes)
        .zip(hidden)
    {
        p.target.collect_snapshots();
        let rows = match (span, mode) {
            (Some((_, n)), VerifyMode::Argmax) => {
                let rows: Vec<RowArgmax> = light_rows.by_ref().take(*n as usize).collect();
                anyhow::ensure!(rows.len() == *n as usize, "rows for each light part");
                VerifyRows::Argmax(rows)
            }
            (Some(_), VerifyMode::Rows) => {
                let l = o.as_ref().context("a slice for each part read whole")?;
                VerifyRows::Logits(l.to_vec_f32()?.chunks(vocab).map(|c| c.to_vec()).collect())
            }
            (None, _) => VerifyRows::Logits(Vec::new()),
        };
        res.push(Verified { rows, hidden });
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device's argmax and margin are the host's, ties (first index)
    /// and rows without a number included.
    #[test]
    fn device_argmax_answers_as_the_host() {
        let rows: [[f32; 5]; 5] = [
            [0.5, 2.0, 1.0, -3.0, 1.5],
            [1.0, 3.0, 0.5, 3.0, 0.0],
            [f32::NAN, 1.0, 2.0, 0.0, 1.5],
            [-1.0, -2.0, -0.5, -0.25, -4.0],
            [f32::NEG_INFINITY, 0.0, f32::INFINITY, 1.0, f32::INFINITY],
        ];
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let logits = Array::from_f32(&flat, &[5, 5]).unwrap();
        let stats = DeviceArgmax::queue(&[&logits]).unwrap();
        specd_mlx::eval(&[&stats.values, &logits]).unwrap();
        let got = stats.read(&[&logits]).unwrap().remove(0);
        for (i, (r, g)) in rows.iter().zip(&got).enumerate() {
            let want = RowArgmax::of(r);
            assert_eq!(want.argmax, g.argmax, "row {i}");
            assert_eq!(want.margin.to_bits(), g.margin.to_bits(), "row {i}");
        }
        assert_eq!(got[1].argmax, 1, "a tie goes to the first index");
    }
}
