//! A draft as data: the tokens a drafter proposes, with the probability
//! each was drawn with and the drafter's statistics. It flows from the
//! drafters ([`super::drafter`]) to the verify's row reading
//! ([`super::rows`]) and the acceptance; neither end needs the other.
use crate::sampling::{distribution, Distribution, Rng, SamplingParams};
use specd_policy::DraftStep;

/// The draft probability of a proposed token.
#[derive(Debug, Clone)]
pub enum DraftProb {
    /// A model-free proposal: q(x) = 1 for its token.
    PointMass,
    /// The draft model's final distribution at that position.
    Dist(Distribution),
}

impl DraftProb {
    pub fn q(&self, token: u32) -> f32 {
        match self {
            DraftProb::PointMass => 1.0,
            DraftProb::Dist(d) => d.p(token),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Draft {
    pub tokens: Vec<u32>,
    pub q: Vec<DraftProb>,
    /// The drafter's own confidence per token, where it has one (the suffix
    /// drafter's match statistics); empty otherwise. Not a probability
    /// acceptance uses: that is `q`.
    pub confidence: Vec<f32>,
    /// Entropy (nats) and largest probability of the draft distribution per
    /// token, for drafters that have one (model drafters); empty otherwise.
    /// Under greedy decoding, where the sampling distribution is one-hot,
    /// they describe the softmax of the draft logits at temperature 1
    /// (what early-stopping rules such as AdaEDL read).
    pub entropy: Vec<f32>,
    pub top1: Vec<f32>,
}

impl Draft {
    /// `tokens` proposed as certain (a lookup, not a distribution).
    pub fn point_mass(tokens: Vec<u32>) -> Draft {
        Draft {
            q: vec![DraftProb::PointMass; tokens.len()],
            tokens,
            ..Default::default()
        }
    }

    /// Keeps the first `n` tokens (and their statistics).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.q.truncate(n);
        self.confidence.truncate(n);
        self.entropy.truncate(n);
        self.top1.truncate(n);
    }
}

/// Asked after each draft token of a stepwise drafter while fewer than k
/// are drafted (the schedule's `continue-drafting`): true = draft on.
pub type DraftHook<'a> = &'a mut dyn FnMut(&DraftStep) -> bool;

/// Adds a drafted token with its draft probability and statistics
/// (entropy, top-1) to `draft`, then, unless it is the k-th, asks `hook`
/// (the schedule's `continue-drafting`) whether to draft on.
pub fn draft_on(
    draft: &mut Draft,
    token: u32,
    q: DraftProb,
    (entropy, top1): (f32, f32),
    k: usize,
    hook: DraftHook<'_>,
) -> bool {
    let step = DraftStep {
        index: draft.tokens.len() as u32,
        token,
        q: q.q(token),
        entropy,
        top1,
        k: k as u32,
    };
    draft.tokens.push(token);
    draft.q.push(q);
    draft.entropy.push(entropy);
    draft.top1.push(top1);
    draft.tokens.len() < k && hook(&step)
}

/// The step every model drafter (a draft model, an MTP head) takes per
/// draft token: the token drawn from `logits` as the request samples
/// (`history`: the tokens the penalties read), its draft probability, and
/// the statistics of [`Draft::entropy`]: under greedy decoding those of
/// `stats_row` at temperature 1 (the drafter's own row, which for a head
/// with a reduced vocabulary is narrower than `logits`).
pub fn draw(
    logits: &[f32],
    stats_row: &[f32],
    params: &SamplingParams,
    history: &[u32],
    rng: &mut Rng,
) -> (u32, DraftProb, (f32, f32)) {
    let d = distribution(logits, params, history);
    let tok = d.draw(params, rng);
    let stats = if params.greedy() {
        softmax_stats(stats_row)
    } else {
        (d.entropy, d.p(d.argmax))
    };
    (tok, DraftProb::Dist(d), stats)
}

/// [`draft_on`] for a drafter that draws its next token from its history
/// (a model drafter): `token` joins `history` too.
pub fn draw_on(
    draft: &mut Draft,
    history: &mut Vec<u32>,
    (token, q, stats): (u32, DraftProb, (f32, f32)),
    k: usize,
    hook: DraftHook<'_>,
) -> bool {
    history.push(token);
    draft_on(draft, token, q, stats, k, hook)
}

/// Entropy (nats) and largest probability of softmax(logits) at
/// temperature 1 (non-finite logits count as -inf).
pub fn softmax_stats(logits: &[f32]) -> (f32, f32) {
    let max = logits
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return (0.0, 1.0);
    }
    // With z = sum exp(x - max): H = ln z - sum p (x - max), top1 = 1 / z.
    let (mut z, mut weighted) = (0.0f64, 0.0f64);
    for &x in logits.iter().filter(|x| x.is_finite()) {
        let d = (x - max) as f64;
        let e = d.exp();
        z += e;
        weighted += e * d;
    }
    let entropy = (z.ln() - weighted / z).max(0.0);
    (entropy as f32, (1.0 / z) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_stats_of_uniform_and_peaked_logits() {
        let (h, top1) = softmax_stats(&[0.0; 4]);
        assert!((h - 4f32.ln()).abs() < 1e-5, "{h}");
        assert!((top1 - 0.25).abs() < 1e-6);
        let (h, top1) = softmax_stats(&[100.0, 0.0, 0.0]);
        assert!(h < 1e-6 && (top1 - 1.0).abs() < 1e-6, "{h} {top1}");
        assert_eq!(softmax_stats(&[f32::NEG_INFINITY]), (0.0, 1.0));
    }
}
