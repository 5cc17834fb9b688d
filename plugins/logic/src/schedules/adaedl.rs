use alloc::string::String;
use serde::Deserialize;

use crate::contract::{parse_config, DraftStep, ScheduleInput, ScheduleLogic};

/// `adaedl` (contract 0.2): AdaEDL's early draft stopping (Agrawal et al.
/// 2024, "AdaEDL: Early Draft Stopping for Speculative Decoding of Large
/// Language Models via an Entropy-based Lower Bound on Token Acceptance
/// Probability").
///
/// Every round asks for k = min(`max`, max-draft) (config
/// `{"max": 8, "gamma": 1.0, "threshold": 0.4}`); while a model drafter
/// drafts, after each draft token with draft entropy H (nats) it estimates
/// a lower bound on that token's acceptance probability,
///
///     bound = 1 - sqrt(gamma * H)
///
/// and stops drafting when the bound falls below `threshold` (the token
/// itself is still verified).  With a drafter that is not asked token by
/// token (n-gram, suffix) it is `constant` with k = `max`.
#[derive(Clone, Debug)]
pub struct AdaEdl {
    pub max: u32,
    pub gamma: f32,
    pub threshold: f32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdaEdlConfig {
    #[serde(default = "default_adaedl_max")]
    max: u32,
    #[serde(default = "default_adaedl_gamma")]
    gamma: f32,
    #[serde(default = "default_adaedl_threshold")]
    threshold: f32,
}

fn default_adaedl_max() -> u32 {
    8
}
fn default_adaedl_gamma() -> f32 {
    1.0
}
fn default_adaedl_threshold() -> f32 {
    0.4
}

impl AdaEdl {
    /// The entropy-based lower bound on acceptance of a token drawn from a
    /// draft distribution of entropy `entropy` (nats).
    pub fn bound(&self, entropy: f32) -> f32 {
        if entropy.is_nan() {
            // Nothing known about the draft: no bound (stop drafting).
            return f32::NEG_INFINITY;
        }
        1.0 - libm::sqrtf(self.gamma * entropy.max(0.0))
    }
}

impl ScheduleLogic for AdaEdl {
    fn create(config: &str, _carried: Option<&[u8]>) -> Result<Self, String> {
        let c: AdaEdlConfig = parse_config(config)?;
        if c.max == 0 {
            return Err("bad config: max must be >= 1".into());
        }
        if !(c.gamma.is_finite() && c.gamma > 0.0) {
            return Err("bad config: gamma must be finite and > 0".into());
        }
        if !(0.0..=1.0).contains(&c.threshold) {
            return Err("bad config: threshold must be within [0, 1]".into());
        }
        Ok(AdaEdl {
            max: c.max,
            gamma: c.gamma,
            threshold: c.threshold,
        })
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        self.max.min(input.max_draft)
    }
    fn continue_drafting(&mut self, step: &DraftStep) -> bool {
        self.bound(step.entropy) >= self.threshold
    }
}
