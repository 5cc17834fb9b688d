//! A draft as data: the tokens a drafter proposes, with the probability
//! each was drawn with and the drafter's statistics. It flows from the
//! drafters ([`super::drafter`]) to the verify's row reading
//! ([`super::rows`]) and the acceptance; neither end needs the other.
use crate::sampling::Distribution;

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
