//! Log-probabilities of committed tokens, for the APIs' `logprobs` fields.
//!
//! By default they are of the model's raw distribution: the log-softmax of
//! the logits before penalties, temperature and truncation, as vLLM reports
//! them and as evaluation harnesses need. `Processed` reports the final
//! sampling distribution instead (what the policies see). A speculatively
//! committed token's row comes from the target's verify forward, which on the
//! batch-invariant kernels is bitwise the row plain decoding computes, so the
//! numbers are the same with and without speculation.
use super::Distribution;
use serde::{Deserialize, Serialize};

/// The floor OpenAI uses for a token of probability 0 (JSON has no -inf).
pub const LOGPROB_FLOOR: f32 = -9999.0;

/// Which distribution logprobs describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogprobMode {
    /// log-softmax of the raw logits.
    #[default]
    Raw,
    /// The final sampling distribution (after penalties, temperature, top-k/p,
    /// min-p); one-hot when greedy.
    Processed,
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogprobRequest {
    /// How many alternatives to list per position (0: only the chosen token).
    pub top: usize,
    pub mode: LogprobMode,
}

/// The most alternatives a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One committed token's logprob and the top alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// Best first (ties by id), `top` entries.
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of `row` (f64 sums: 49k terms).
fn log_softmax(row: &[f32]) -> impl Fn(usize) -> f32 + '_ {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    move |i| (row[i] as f64 - lse) as f32
}

fn floor(x: f32) -> f32 {
    if x.is_finite() {
        x.max(LOGPROB_FLOOR)
    } else {
        LOGPROB_FLOOR
    }
}

/// The `n` best indices of `v` (by value, then index).
fn top_indices(v: &[f32], n: usize) -> Vec<usize> {
    let n = n.min(v.len());
    if n == 0 {
        return Vec::new();
    }
    let mut idx: Vec<usize> = (0..v.len()).collect();
    let cmp = |&a: &usize, &b: &usize| v[b].total_cmp(&v[a]).then(a.cmp(&b));
    idx.select_nth_unstable_by(n - 1, cmp);
    idx.truncate(n);
    idx.sort_unstable_by(cmp);
    idx
}

/// `token`'s logprob at the position whose raw logits are `row` and whose
/// final distribution is `dist`.
pub fn token_logprob(
    row: &[f32],
    dist: &Distribution,
    token: u32,
    req: &LogprobRequest,
) -> TokenLogprob {
    match req.mode {
        LogprobMode::Raw => {
            let lp = log_softmax(row);
            TokenLogprob {
                token,
                logprob: floor(lp(token as usize)),
                top: top_indices(row, req.top)
                    .into_iter()
                    .map(|i| (i as u32, floor(lp(i))))
                    .collect(),
            }
        }
        LogprobMode::Processed => TokenLogprob {
            token,
            logprob: floor(dist.p(token).ln()),
            top: top_indices(&dist.probs, req.top)
                .into_iter()
                .map(|i| (i as u32, floor(dist.probs[i].ln())))
                .collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{distribution, SamplingParams};

    #[test]
    fn raw_logprobs_are_the_log_softmax_and_ignore_the_transform() {
        let row = [1.0f32, 3.0, 2.0, 3.0];
        let p = SamplingParams {
            temperature: 0.5,
            top_k: 1,
            repeat_penalty: 2.0,
            ..Default::default()
        };
        let d = distribution(&row, &p, &[1]);
        let req = LogprobRequest {
            top: 3,
            mode: LogprobMode::Raw,
        };
        let t = token_logprob(&row, &d, 2, &req);
        let z: f32 = row.iter().map(|x| x.exp()).sum();
        assert!((t.logprob - (2.0f32.exp() / z).ln()).abs() < 1e-6);
        // best first, ties by id
        assert_eq!(t.top.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        let mass: f32 = t.top.iter().map(|x| x.1.exp()).sum();
        assert!(mass <= 1.0 + 1e-6);
        // processed: the final distribution (top-1 after the penalty: one-hot)
        let req = LogprobRequest {
            top: 2,
            mode: LogprobMode::Processed,
        };
        let t = token_logprob(&row, &d, 3, &req);
        assert_eq!(t.logprob, 0.0);
        assert_eq!(t.top[0], (3, 0.0));
        assert_eq!(t.top[1].1, LOGPROB_FLOOR);
    }
}
