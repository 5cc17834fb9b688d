use alloc::string::String;
use serde::Deserialize;

use crate::contract::{parse_config, AcceptanceLogic, Correction, Decision, Position};

/// `typical`: Medusa's typical acceptance (Cai et al. 2024).  Draft i is
/// accepted iff p(x) > min(epsilon, delta * exp(-entropy)) (config
/// `{"epsilon": 0.09, "delta": 0.3}`, Medusa's posterior_threshold and
/// posterior_alpha); the first rejected position is corrected with a target
/// sample.  LOSSY: the output no longer follows the target distribution (it
/// favours plausible drafts); at temperature 0 (one-hot p) it equals greedy.
#[derive(Clone, Debug)]
pub struct Typical {
    pub epsilon: f32,
    pub delta: f32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TypicalConfig {
    #[serde(default = "default_epsilon")]
    epsilon: f32,
    #[serde(default = "default_delta")]
    delta: f32,
}

fn default_epsilon() -> f32 {
    0.09
}
fn default_delta() -> f32 {
    0.3
}

impl Typical {
    /// The acceptance threshold at a position with this target entropy.
    pub fn threshold(&self, entropy: f32) -> f32 {
        self.epsilon.min(self.delta * libm::expf(-entropy))
    }
}

impl AcceptanceLogic for Typical {
    fn create(config: &str, _vocab_size: u32) -> Result<Self, String> {
        let c: TypicalConfig = parse_config(config)?;
        if !(c.epsilon.is_finite() && c.delta.is_finite() && c.epsilon >= 0.0 && c.delta >= 0.0) {
            return Err("bad config: epsilon and delta must be finite and >= 0".into());
        }
        Ok(Typical {
            epsilon: c.epsilon,
            delta: c.delta,
        })
    }
    fn decide(&mut self, positions: &[Position]) -> Decision {
        Decision::until(positions, Correction::TargetSample, |p| {
            p.p <= self.threshold(p.entropy)
        })
    }
}
