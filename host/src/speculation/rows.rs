//! What a round reads of each verified row. A plain greedy round needs per
//! row only the argmax and the top-2 margin of the raw logits, so the
//! target computes those on the device and copies back two numbers a row
//! instead of the vocabulary ([`VerifyRows::Argmax`]). Every other request
//! (sampling, penalties, logprobs, a grammar) reads the whole rows and runs
//! the host's transforms ([`VerifyRows::Logits`]).
use super::draft::DraftProb;
use crate::sampling::{
    argmax_margin, distributions, sample_index, Distribution, Rng, RowTask, SamplingParams,
};
use std::time::Instant;

/// The argmax of one row's raw logits (the first index of the largest) and
/// its lead over the runner-up, exactly as [`argmax_margin`] gives them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowArgmax {
    pub argmax: u32,
    pub margin: f32,
}

impl RowArgmax {
    pub fn of(logits: &[f32]) -> RowArgmax {
        let (argmax, margin) = argmax_margin(logits);
        RowArgmax { argmax, margin }
    }
}

/// A verify forward's result, as the round reads it.
#[derive(Debug, Clone)]
pub enum VerifyRows {
    /// Every row's logits on the host.
    Logits(Vec<Vec<f32>>),
    /// Per row only its argmax and margin (plain greedy requests).
    Argmax(Vec<RowArgmax>),
}

impl VerifyRows {
    pub fn len(&self) -> usize {
        match self {
            VerifyRows::Logits(r) => r.len(),
            VerifyRows::Argmax(r) => r.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Vec<Vec<f32>>> for VerifyRows {
    fn from(rows: Vec<Vec<f32>>) -> Self {
        VerifyRows::Logits(rows)
    }
}

/// Each row's final distribution, as far as the round needs it.
pub(crate) enum RowDists {
    /// After every transform of the request, from the host's rows.
    Full(Vec<Distribution>),
    /// Plain greedy: one-hot at the argmax, entropy 0 (what
    /// [`crate::sampling::distribution`] gives at temperature 0 without
    /// penalties), held as the argmax alone.
    Greedy(Vec<RowArgmax>),
}

impl RowDists {
    pub fn len(&self) -> usize {
        match self {
            RowDists::Full(d) => d.len(),
            RowDists::Greedy(a) => a.len(),
        }
    }

    pub fn argmax(&self, i: usize) -> u32 {
        match self {
            RowDists::Full(d) => d[i].argmax,
            RowDists::Greedy(a) => a[i].argmax,
        }
    }

    pub fn margin(&self, i: usize) -> f32 {
        match self {
            RowDists::Full(d) => d[i].margin,
            RowDists::Greedy(a) => a[i].margin,
        }
    }

    /// p of `token` at row `i`.
    pub fn p(&self, i: usize, token: u32) -> f32 {
        match self {
            RowDists::Full(d) => d[i].p(token),
            RowDists::Greedy(a) => f32::from(a[i].argmax == token),
        }
    }

    pub fn entropy(&self, i: usize) -> f32 {
        match self {
            RowDists::Full(d) => d[i].entropy,
            RowDists::Greedy(_) => 0.0,
        }
    }

    /// Draws the token of row `i` (its argmax when greedy; no uniform is
    /// drawn then, on either kind).
    pub fn sample(&self, i: usize, params: &SamplingParams, rng: &mut Rng) -> u32 {
        match self {
            RowDists::Full(d) => d[i].draw(params, rng),
            RowDists::Greedy(a) => a[i].argmax,
        }
    }

    /// Samples norm(max(0, p - q)) at row `i`: what speculative sampling
    /// draws after a rejection, so the output keeps the target distribution.
    pub fn residual(
        &self,
        i: usize,
        q: &DraftProb,
        token: u32,
        params: &SamplingParams,
        rng: &mut Rng,
    ) -> u32 {
        let p = match self {
            RowDists::Full(d) if !params.greedy() => &d[i],
            _ => return self.argmax(i),
        };
        let mut r = p.probs.clone();
        match q {
            DraftProb::PointMass => r[token as usize] = 0.0,
            DraftProb::Dist(qd) => {
                for (x, qv) in r.iter_mut().zip(&qd.probs) {
                    *x = (*x - qv).max(0.0);
                }
            }
        }
        let u = rng.uniform();
        sample_index(&r, u).unwrap_or_else(|| p.sample_with(u))
    }

    /// Keeps the first `n` rows and hands the full distributions out (none
    /// for greedy rows: they were never on the host).
    pub fn into_committed(self, n: usize) -> Vec<Distribution> {
        match self {
            RowDists::Full(mut d) => {
                d.truncate(n);
                d
            }
            RowDists::Greedy(_) => Vec::new(),
        }
    }
}

/// A round's verify rows with the request's grammar masks applied, before
/// the host's transforms ([`read_rows`] applies those).
pub struct MaskedRows {
    rows: VerifyRows,
    /// The penalties' window before the first row, then the drafts: row
    /// `i` counts `history[..base + i]`. Empty when nothing is penalized.
    history: Vec<u32>,
    base: usize,
    params: SamplingParams,
    seconds: f64,
}

impl MaskedRows {
    /// `rows` of a round that drafted `drafts` after `log`; `seconds` is
    /// what masking them took.
    pub fn new(
        rows: VerifyRows,
        drafts: &[u32],
        log: &[u32],
        params: &SamplingParams,
        seconds: f64,
    ) -> Self {
        let (history, base) = if params.penalized() {
            // Only the last `repeat_last_n` of the log count, drafts or not.
            let window = &log[log.len().saturating_sub(params.repeat_last_n)..];
            ([window, drafts].concat(), window.len())
        } else {
            (Vec::new(), 0)
        };
        MaskedRows {
            rows,
            history,
            base,
            params: params.clone(),
            seconds,
        }
    }

    fn history(&self, row: usize) -> &[u32] {
        if self.history.is_empty() {
            &[]
        } else {
            &self.history[..(self.base + row).min(self.history.len())]
        }
    }
}

/// A verify's rows as its round decides from them.
pub struct ReadRows {
    /// The (masked) logits, where the verify copied them back.
    pub(crate) rows: Vec<Vec<f32>>,
    pub(crate) dists: RowDists,
    /// Masking, plus this request's share of the transforms' wall time.
    pub(crate) seconds: f64,
}

/// One request's rows read ([`read_rows`] of one).
pub fn read_one(masked: MaskedRows, threads: usize) -> ReadRows {
    read_rows(vec![masked], threads)
        .pop()
        .expect("read_rows gives one result per request")
}

/// Every request's rows read, all their distributions computed together
/// over `threads` threads (one verify's rows, or a batched step's).
pub fn read_rows(masked: Vec<MaskedRows>, threads: usize) -> Vec<ReadRows> {
    let t = Instant::now();
    let dists = {
        let tasks: Vec<RowTask<'_>> = masked
            .iter()
            .flat_map(|m| {
                let rows = match &m.rows {
                    VerifyRows::Logits(r) => r.as_slice(),
                    VerifyRows::Argmax(_) => &[],
                };
                rows.iter().enumerate().map(move |(i, r)| RowTask {
                    logits: r,
                    params: &m.params,
                    history: m.history(i),
                })
            })
            .collect();
        distributions(&tasks, threads)
    };
    let total = dists.len().max(1) as f64;
    let wall = t.elapsed().as_secs_f64();
    let mut dists = dists.into_iter();
    masked
        .into_iter()
        .map(|m| match m.rows {
            VerifyRows::Logits(rows) => {
                let d: Vec<Distribution> = dists.by_ref().take(rows.len()).collect();
                ReadRows {
                    seconds: m.seconds + wall * d.len() as f64 / total,
                    rows,
                    dists: RowDists::Full(d),
                }
            }
            VerifyRows::Argmax(a) => ReadRows {
                rows: Vec::new(),
                dists: RowDists::Greedy(a),
                seconds: m.seconds,
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::distribution;

    /// The argmax-only rows answer what the host's greedy distributions do.
    #[test]
    fn greedy_rows_answer_as_host_distributions() {
        let rows = [
            vec![0.5, 2.0, 1.0, -3.0],
            vec![1.0, 1.0, 0.5, 0.0],
            vec![-1.0, -2.0, -0.5, -0.25],
        ];
        let params = SamplingParams::default();
        let full = RowDists::Full(rows.iter().map(|r| distribution(r, &params, &[])).collect());
        let light = RowDists::Greedy(rows.iter().map(|r| RowArgmax::of(r)).collect());
        let (mut r1, mut r2) = (Rng::new(1), Rng::new(1));
        for i in 0..rows.len() {
            assert_eq!(full.argmax(i), light.argmax(i));
            assert_eq!(full.margin(i).to_bits(), light.margin(i).to_bits());
            assert_eq!(full.entropy(i), light.entropy(i));
            for t in 0..4 {
                assert_eq!(full.p(i, t), light.p(i, t));
            }
            assert_eq!(
                full.sample(i, &params, &mut r1),
                light.sample(i, &params, &mut r2)
            );
            let q = DraftProb::PointMass;
            assert_eq!(
                full.residual(i, &q, 0, &params, &mut r1),
                light.residual(i, &q, 0, &params, &mut r2)
            );
        }
        // Neither drew a uniform.
        assert_eq!(r1.uniform(), r2.uniform());
        // A tie goes to the first index, as on the host.
        assert_eq!(light.argmax(1), 0);
        assert_eq!(light.margin(1), 0.0);
    }
}
