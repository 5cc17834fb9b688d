//! Turning logits into the final sampling distribution (penalties,
//! temperature, top-k, top-p, min-p) and drawing from it. The same transform
//! serves target and draft, so the probabilities a policy sees are the ones
//! sampling uses. All randomness comes from [`Rng`], seeded per request.
pub mod constraint;
pub mod logprobs;
mod rng;
pub use constraint::{Constraint, Grammars, JsonFormat, SharedConstraint};
pub use logprobs::{token_logprob, LogprobMode, LogprobRequest, TokenLogprob};
pub use rng::{fresh_seed, Rng};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// 1 disables.
    pub repeat_penalty: f32,
    /// How many recent tokens (prompt included) the repeat, presence and
    /// frequency penalties look at, as llama.cpp and Ollama count them.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token in the window (OpenAI
    /// `presence_penalty`); 0 disables.
    #[serde(default)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the window
    /// (OpenAI `frequency_penalty`); 0 disables.
    #[serde(default)]
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// OpenAI's documented defaults for what a request leaves out:
    /// temperature 1, top_p 1, no penalties.
    pub fn openai_defaults() -> Self {
        SamplingParams {
            temperature: 1.0,
            ..Default::default()
        }
    }

    /// Ollama's documented defaults (its Modelfile parameters): temperature
    /// 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1 over the last 64 tokens.
    pub fn ollama_defaults() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.0,
            repeat_penalty: 1.1,
            repeat_last_n: 64,
            ..Default::default()
        }
    }
}

/// A sampling parameter out of its range; request validation
/// ([`crate::request::RequestError::Sampling`]) and tests match on it.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingError {
    pub field: &'static str,
    pub value: f32,
    /// The range, as the message says it.
    pub allowed: &'static str,
}

impl std::fmt::Display for SamplingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} must be {}, got {}",
            self.field, self.allowed, self.value
        )
    }
}

impl std::error::Error for SamplingError {}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), SamplingError> {
        let checks: [(&'static str, f32, bool, &'static str); 6] = [
            (
                "temperature",
                self.temperature,
                self.temperature.is_finite() && self.temperature >= 0.0,
                "a number >= 0",
            ),
            (
                "top_p",
                self.top_p,
                self.top_p > 0.0 && self.top_p <= 1.0,
                "in (0, 1]",
            ),
            (
                "min_p",
                self.min_p,
                self.min_p >= 0.0 && self.min_p < 1.0,
                "in [0, 1)",
            ),
            (
                "repeat_penalty",
                self.repeat_penalty,
                self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0,
                "a number > 0",
            ),
            (
                "presence_penalty",
                self.presence_penalty,
                (-2.0..=2.0).contains(&self.presence_penalty),
                "in [-2, 2]",
            ),
            (
                "frequency_penalty",
                self.frequency_penalty,
                (-2.0..=2.0).contains(&self.frequency_penalty),
                "in [-2, 2]",
            ),
        ];
        match checks.into_iter().find(|c| !c.2) {
            Some((field, value, _, allowed)) => Err(SamplingError {
                field,
                value,
                allowed,
            }),
            None => Ok(()),
        }
    }

    pub fn greedy(&self) -> bool {
        self.temperature == 0.0
    }
    /// Whether any penalty changes the logits.
    pub fn penalized(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
    /// Greedy on the raw logits: no penalty to apply first.
    pub fn plain_greedy(&self) -> bool {
        self.greedy() && !self.penalized()
    }
}

/// The final distribution at one position.
#[derive(Debug, Clone)]
pub struct Distribution {
    /// Argmax of the (penalized) logits.
    pub argmax: u32,
    /// Probabilities over the vocabulary after every transform; one-hot at
    /// the argmax when greedy.
    pub probs: Vec<f32>,
    /// Entropy (nats) of `probs`.
    pub entropy: f32,
    /// Top-2 margin of the raw logits (near-tie diagnostics).
    pub margin: f32,
}

impl Distribution {
    pub fn p(&self, token: u32) -> f32 {
        self.probs.get(token as usize).copied().unwrap_or(0.0)
    }

    /// Draws a token with `u` uniform in [0, 1).
    pub fn sample_with(&self, u: f32) -> u32 {
        sample_index(&self.probs, u).unwrap_or(self.argmax)
    }

    /// The token `params` picks: the argmax when greedy (no uniform drawn),
    /// else a draw with the next uniform of `rng`.
    pub fn draw(&self, params: &SamplingParams, rng: &mut Rng) -> u32 {
        if params.greedy() {
            self.argmax
        } else {
            self.sample_with(rng.uniform())
        }
    }
}

/// Index `i` with the cumulative mass first exceeding `u * total` (the
/// last token with mass when rounding leaves the target unreached).
pub fn sample_index(probs: &[f32], u: f32) -> Option<u32> {
    let total = sum(probs);
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let target = u as f64 * total;
    // Whole blocks are summed (vectorized) until the one the target falls
    // in, which is walked token by token.
    const BLOCK: usize = 256;
    let mut acc = 0.0f64;
    for (b, block) in probs.chunks(BLOCK).enumerate() {
        let mass = lane_sum(block, block, |p, _| if p > 0.0 { p as f64 } else { 0.0 });
        if acc + mass <= target {
            acc += mass;
            continue;
        }
        for (j, &p) in block.iter().enumerate() {
            if p > 0.0 {
                acc += p as f64;
                if acc > target {
                    return Some((b * BLOCK + j) as u32);
                }
            }
        }
    }
    probs.iter().rposition(|&p| p > 0.0).map(|i| i as u32)
}

/// The sum of `f` over `xs` and `ys` together, in eight interleaved lanes
/// so the loop vectorizes (a single running f64 sum is a chain of
/// dependent adds, 49k of them a row).
#[inline]
fn lane_sum(xs: &[f32], ys: &[f32], f: impl Fn(f32, f32) -> f64) -> f64 {
    let mut lanes = [0.0f64; 8];
    let (xc, yc) = (xs.chunks_exact(8), ys.chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (x, y) in xc.zip(yc) {
        for j in 0..8 {
            lanes[j] += f(x[j], y[j]);
        }
    }
    for (j, (&x, &y)) in xr.iter().zip(yr).enumerate() {
        lanes[j] += f(x, y);
    }
    lanes.iter().sum()
}

fn sum(xs: &[f32]) -> f64 {
    lane_sum(xs, xs, |x, _| x as f64)
}

/// e^x for the x <= 0 of a softmax, branch-free so a row's loop vectorizes
/// (libm's expf is a call per token): Cephes' expf (a degree-7 polynomial
/// on x reduced by multiples of ln 2), within 2 ulp of it. e^0 is exactly
/// 1, and below -87 (where e^x leaves f32's normal range) it is 0.
#[inline]
fn exp_nonpositive(x: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds to an integer.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.max(-87.0);
    let n = (xc * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = xc - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let poly =
        (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
            + 0.166_666_65)
            * r
            + 0.5)
            * r
            * r
            + r
            + 1.0;
    // SAFETY: n is an integer in [-126, 0], xc being in [-87, 0] (a NaN x
    // made it -87), so the conversion is exact. The checked `as` is what
    // kept the loop from vectorizing.
    let n = unsafe { n.to_int_unchecked::<i32>() };
    let scale = f32::from_bits(((n + 127) << 23) as u32);
    if x.is_nan() {
        x
    } else if x < -87.0 {
        0.0
    } else {
        poly * scale
    }
}

/// The first index of the largest logit, and its lead over the runner-up.
pub fn argmax_margin(logits: &[f32]) -> (u32, f32) {
    let (mut best, mut b1, mut b2) = (0usize, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &x) in logits.iter().enumerate() {
        if x > b1 {
            b2 = b1;
            b1 = x;
            best = i;
        } else if x > b2 {
            b2 = x;
        }
    }
    (best as u32, b1 - b2)
}

/// Applies the repeat, presence and frequency penalties to `logits` in place,
/// counting the last `repeat_last_n` tokens of `history` (llama.cpp's order:
/// the repeat penalty scales, then `count * frequency + presence` is
/// subtracted).
pub fn apply_penalties(logits: &mut [f32], params: &SamplingParams, history: &[u32]) {
    if !params.penalized() {
        return;
    }
    let start = history.len().saturating_sub(params.repeat_last_n);
    let mut counts = std::collections::HashMap::<u32, u32>::new();
    for &t in &history[start..] {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &n) in &counts {
        let Some(x) = logits.get_mut(t as usize) else {
            continue;
        };
        if params.repeat_penalty != 1.0 {
            *x = if *x > 0.0 {
                *x / params.repeat_penalty
            } else {
                *x * params.repeat_penalty
            };
        }
        *x -= n as f32 * params.frequency_penalty + params.presence_penalty;
    }
}

/// Applies every transform of `params` to one position's logits, with
/// `history` (prompt + generated so far) for the penalties.
pub fn distribution(logits: &[f32], params: &SamplingParams, history: &[u32]) -> Distribution {
    let mut l = logits.to_vec();
    apply_penalties(&mut l, params, history);
    let (argmax, margin) = argmax_margin(&l);
    if params.greedy() {
        let mut probs = vec![0.0; l.len()];
        probs[argmax as usize] = 1.0;
        return Distribution {
            argmax,
            probs,
            entropy: 0.0,
            margin,
        };
    }
    let inv_t = 1.0 / params.temperature;
    // Top-k: keep the k largest logits.
    if params.top_k > 0 && params.top_k < l.len() {
        let mut sorted: Vec<f32> = l.clone();
        let k = params.top_k;
        sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        let kth = sorted[k - 1];
        // Ties at the threshold are kept in index order up to k entries.
        let mut kept = 0;
        for x in l.iter_mut() {
            if *x > kth {
                kept += 1;
            }
        }
        let mut ties_left = k - kept;
        for x in l.iter_mut() {
            if *x < kth || (*x == kth && ties_left == 0) {
                *x = f32::NEG_INFINITY;
            } else if *x == kth {
                ties_left -= 1;
            }
        }
    }
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z = |x: f32| (x - max) * inv_t;
    let mut probs = vec![0.0f32; l.len()];
    for (p, &x) in probs.iter_mut().zip(&l) {
        *p = exp_nonpositive(z(x));
    }
    normalize(&mut probs);
    if params.top_p < 1.0 {
        let cut = top_p_cut(&probs, params.top_p);
        for &i in &cut {
            probs[i as usize] = 0.0;
        }
        normalize(&mut probs);
    }
    if params.min_p > 0.0 {
        let pmax = probs.iter().copied().fold(0.0f32, f32::max);
        let floor = params.min_p * pmax;
        for p in probs.iter_mut() {
            if *p < floor {
                *p = 0.0;
            }
        }
        normalize(&mut probs);
    }
    // Every kept p is e^z times the same factor, and the argmax's z is 0,
    // so ln p = z + ln p(argmax): the entropy without a log per token.
    let pz = lane_sum(&probs, &l, |p, x| {
        if p > 0.0 {
            p as f64 * z(x) as f64
        } else {
            0.0
        }
    });
    let top = probs[argmax as usize] as f64;
    let entropy = (-pz - top.ln() * sum(&probs)) as f32;
    Distribution {
        argmax,
        probs,
        entropy,
        margin,
    }
}

/// The tokens top-p drops: all but the shortest run of the most likely
/// (ties by id) whose mass, summed in that order, reaches `top_p`. The run
/// is sorted a growing prefix at a time, not the whole vocabulary: it is
/// usually tens to hundreds of tokens, and a full sort of 49k costs 2.5 ms
/// a row. Each prefix holds exactly the full sort's first entries, in its
/// order, so the sum and the cut are the full sort's.
fn top_p_cut(probs: &[f32], top_p: f32) -> Vec<u32> {
    let by_mass = |a: &u32, b: &u32| {
        probs[*b as usize]
            .total_cmp(&probs[*a as usize])
            .then(a.cmp(b))
    };
    let mut idx: Vec<u32> = (0..probs.len() as u32)
        .filter(|&i| probs[i as usize] > 0.0)
        .collect();
    let mut acc = 0.0f32;
    let mut sorted = 0;
    while sorted < idx.len() {
        let end = (sorted.max(16) * 4).min(idx.len());
        let rest = &mut idx[sorted..];
        let m = end - sorted;
        if m < rest.len() {
            rest.select_nth_unstable_by(m - 1, by_mass);
        }
        rest[..m].sort_unstable_by(by_mass);
        for n in sorted..end {
            acc += probs[idx[n] as usize];
            if acc >= top_p {
                idx.drain(..=n);
                return idx;
            }
        }
        sorted = end;
    }
    Vec::new()
}

/// One row for [`distributions`]: its logits, and the history its
/// penalties count.
pub struct RowTask<'a> {
    pub logits: &'a [f32],
    pub params: &'a SamplingParams,
    pub history: &'a [u32],
}

/// [`distribution`] of every task, in order, the tasks spread over up to
/// `threads` threads. A verify's rows, and a batched step's requests, are
/// independent, and at about 0.5 ms a row here the transforms of a step's
/// 8 sampled rows cost a tenth of its forward.
pub fn distributions(tasks: &[RowTask<'_>], threads: usize) -> Vec<Distribution> {
    let run = |c: &[RowTask<'_>]| {
        c.iter()
            .map(|t| distribution(t.logits, t.params, t.history))
            .collect::<Vec<_>>()
    };
    let threads = threads.clamp(1, tasks.len().max(1));
    if threads == 1 {
        return run(tasks);
    }
    let lanes: Vec<&[RowTask<'_>]> = tasks.chunks(tasks.len().div_ceil(threads)).collect();
    crate::spread::on_threads(lanes, run)
        .into_iter()
        .flatten()
        .collect()
}

fn normalize(p: &mut [f32]) {
    let s = sum(p);
    if s > 0.0 {
        let inv = (1.0 / s) as f32;
        p.iter_mut().for_each(|x| *x *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32) -> SamplingParams {
        SamplingParams {
            temperature: t,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_is_one_hot() {
        let d = distribution(&[0.1, 2.0, 1.9], &params(0.0), &[]);
        assert_eq!(d.argmax, 1);
        assert_eq!(d.probs, vec![0.0, 1.0, 0.0]);
        assert!((d.margin - 0.1).abs() < 1e-6);
    }

    #[test]
    fn filters_compose() {
        let logits = [3.0, 2.0, 1.0, 0.0];
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 2,
            ..Default::default()
        };
        let d = distribution(&logits, &p, &[]);
        assert_eq!(d.probs[2], 0.0);
        assert_eq!(d.probs[3], 0.0);
        assert!((d.probs[0] + d.probs[1] - 1.0).abs() < 1e-6);
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            ..Default::default()
        };
        let d = distribution(&logits, &p, &[]);
        assert_eq!(d.probs.iter().filter(|&&x| x > 0.0).count(), 1);
        let p = SamplingParams {
            temperature: 1.0,
            min_p: 0.3,
            ..Default::default()
        };
        let d = distribution(&logits, &p, &[]);
        // e^-1 = 0.37 >= 0.3 survives, e^-2 = 0.135 does not.
        assert_eq!(d.probs.iter().filter(|&&x| x > 0.0).count(), 2);
    }

    #[test]
    fn repeat_penalty_demotes_seen_tokens() {
        let p = SamplingParams {
            repeat_penalty: 2.0,
            ..Default::default()
        };
        let d = distribution(&[2.0, 1.5], &p, &[0]);
        assert_eq!(d.argmax, 1);
    }

    #[test]
    fn presence_and_frequency_penalties_subtract() {
        let p = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        let mut l = [1.0, 1.0, 1.0];
        apply_penalties(&mut l, &p, &[0, 1, 1, 1]);
        assert_eq!(l, [1.0 - 0.75, 1.0 - 1.25, 1.0]);
        // Only the window counts.
        let p = SamplingParams {
            repeat_last_n: 1,
            ..p
        };
        let mut l = [1.0, 1.0, 1.0];
        apply_penalties(&mut l, &p, &[0, 1, 1, 2]);
        assert_eq!(l, [1.0, 1.0, 0.25]);
        assert!(!p.plain_greedy());
        let bad = SamplingParams {
            presence_penalty: 2.5,
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("presence_penalty"));
    }

    #[test]
    fn validation_names_the_problem() {
        let bad = SamplingParams {
            temperature: -1.0,
            ..Default::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("temperature"));
        let bad = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("top_p"));
        let bad = SamplingParams {
            top_p: 1.5,
            ..Default::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn sampling_follows_probabilities() {
        let d = distribution(&[0.0, (3.0f32).ln()], &params(1.0), &[]);
        let mut rng = Rng::new(7);
        let n = 20000;
        let ones = (0..n).filter(|_| d.sample_with(rng.uniform()) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "{frac}");
    }

    /// The whole vocabulary sorted, as top-p once did it.
    fn top_p_cut_by_full_sort(probs: &[f32], top_p: f32) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..probs.len() as u32)
            .filter(|&i| probs[i as usize] > 0.0)
            .collect();
        idx.sort_unstable_by(|&a, &b| {
            probs[b as usize]
                .total_cmp(&probs[a as usize])
                .then(a.cmp(&b))
        });
        let mut acc = 0.0f32;
        for (n, &i) in idx.iter().enumerate() {
            acc += probs[i as usize];
            if acc >= top_p {
                return idx.split_off(n + 1);
            }
        }
        Vec::new()
    }

    /// The prefix sort drops exactly the tokens a full sort does, ties and
    /// zeros included, whether the kept run ends in the first prefix, in a
    /// later one, or never.
    #[test]
    fn top_p_drops_what_a_full_sort_drops() {
        let mut rng = Rng::new(11);
        for case in 0..400 {
            let n = [3, 17, 64, 300, 5000][case % 5];
            // Flat rows keep most tokens; peaked ones a few; coarse
            // levels make ties at the cut.
            let peak = [0.0f32, 2.0, 8.0][case / 5 % 3];
            let coarse = case % 2 == 0;
            let mut probs: Vec<f32> = (0..n)
                .map(|_| {
                    let x = (rng.uniform() * peak).exp() * rng.uniform();
                    if coarse {
                        (x * 4.0).round() / 4.0
                    } else {
                        x
                    }
                })
                .collect();
            normalize(&mut probs);
            for top_p in [0.05f32, 0.5, 0.9, 0.999, 0.99999] {
                let mut got = top_p_cut(&probs, top_p);
                let mut want = top_p_cut_by_full_sort(&probs, top_p);
                got.sort_unstable();
                want.sort_unstable();
                assert_eq!(got, want, "n {n} peak {peak} coarse {coarse} top_p {top_p}");
            }
        }
    }

    /// Spread over threads or not, the distributions are the same, in order.
    #[test]
    fn distributions_keep_their_order_over_threads() {
        let mut rng = Rng::new(5);
        let rows: Vec<Vec<f32>> = (0..7)
            .map(|_| (0..500).map(|_| rng.uniform() * 6.0).collect())
            .collect();
        let history: Vec<u32> = (0..40).map(|i| i * 7 % 500).collect();
        let p = SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            repeat_penalty: 1.3,
            ..Default::default()
        };
        let tasks: Vec<RowTask<'_>> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| RowTask {
                logits: r,
                params: &p,
                history: &history[..30 + i],
            })
            .collect();
        let one = distributions(&tasks, 1);
        for threads in [2, 3, 16] {
            let many = distributions(&tasks, threads);
            assert_eq!(many.len(), tasks.len());
            for (a, b) in one.iter().zip(&many) {
                assert_eq!(a.probs, b.probs);
                assert_eq!(a.entropy.to_bits(), b.entropy.to_bits());
            }
        }
        assert!(distributions(&[], 2).is_empty());
    }

    /// The vectorized e^x is libm's to 2 ulp over a softmax's range, 1 at 0,
    /// 0 below f32's normal range, and NaN for NaN.
    #[test]
    fn exp_nonpositive_is_expf_to_2_ulp() {
        let mut worst = 0.0f64;
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let (got, want) = (exp_nonpositive(x), x.exp());
            let ulp = (want.to_bits() as f64 - got.to_bits() as f64).abs();
            worst = worst.max(ulp);
            assert!(ulp <= 2.0, "e^{x}: {got} against {want}");
        }
        assert!(worst >= 1.0, "a few values round the other way: {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
        assert_eq!(exp_nonpositive(-88.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }

    /// The entropy without a log per token is the entropy with one, after
    /// every filter.
    #[test]
    fn entropy_is_minus_sum_p_ln_p() {
        let mut rng = Rng::new(9);
        let logits: Vec<f32> = (0..4000).map(|_| rng.uniform() * 12.0 - 6.0).collect();
        for p in [
            params(0.7),
            params(1.5),
            SamplingParams {
                temperature: 1.0,
                top_k: 50,
                ..Default::default()
            },
            SamplingParams {
                temperature: 0.9,
                top_p: 0.5,
                min_p: 0.05,
                ..Default::default()
            },
        ] {
            let d = distribution(&logits, &p, &[]);
            let want: f64 = -d
                .probs
                .iter()
                .filter(|&&p| p > 0.0)
                .map(|&p| p as f64 * (p as f64).ln())
                .sum::<f64>();
            assert!(
                (d.entropy as f64 - want).abs() < 1e-5 * want.max(1.0),
                "{p:?}: {} against {want}",
                d.entropy
            );
        }
        let one_hot = distribution(&[0.0, 50.0, 0.0], &params(0.5), &[]);
        assert!(one_hot.entropy.abs() < 1e-6, "{}", one_hot.entropy);
    }

    /// The blocked walk picks the token the running sum does, on either
    /// side of block edges and past zeros.
    #[test]
    fn sample_index_is_the_running_sums_pick() {
        let mut rng = Rng::new(13);
        let running = |probs: &[f32], u: f32| {
            let total: f64 = probs.iter().map(|&p| p as f64).sum();
            let target = u as f64 * total;
            let mut acc = 0.0f64;
            let mut last = None;
            for (i, &p) in probs.iter().enumerate() {
                if p > 0.0 {
                    acc += p as f64;
                    last = Some(i as u32);
                    if acc > target {
                        return last;
                    }
                }
            }
            last
        };
        for n in [1, 7, 256, 257, 1000, 5000] {
            let probs: Vec<f32> = (0..n)
                .map(|_| {
                    let u = rng.uniform();
                    if u < 0.3 {
                        0.0
                    } else {
                        u
                    }
                })
                .collect();
            for k in 0..200 {
                let u = if k == 0 { 0.0 } else { rng.uniform() };
                assert_eq!(sample_index(&probs, u), running(&probs, u), "n {n} u {u}");
            }
        }
        assert_eq!(sample_index(&[0.0, 0.0], 0.5), None);
        assert_eq!(sample_index(&[0.5, f32::NAN], 0.5), None);
        assert_eq!(sample_index(&[0.0, 1.0, 0.0], 0.999_999_9), Some(1));
    }
}
