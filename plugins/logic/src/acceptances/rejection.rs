use alloc::string::String;
use serde::Deserialize;

use crate::contract::{parse_config, AcceptanceLogic, Correction, Decision, Position};

/// `rejection`: speculative sampling (Leviathan et al. 2023, Chen et al.
/// 2023).  Draft i is accepted iff `uniform * q < p`, i.e. with probability
/// min(1, p/q) (always when q = 0 < p, never when p = 0); the first rejected
/// position is corrected from the residual norm(max(0, p - q)), which the host
/// samples.  Lossless: the output follows the target distribution.
#[derive(Clone, Debug)]
pub struct Rejection;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EmptyConfig {}

impl AcceptanceLogic for Rejection {
    fn create(config: &str, _vocab_size: u32) -> Result<Self, String> {
        let _: EmptyConfig = parse_config(config)?;
        Ok(Rejection)
    }
    fn decide(&mut self, positions: &[Position]) -> Decision {
        // Rejected where u >= p / q (the draft's own draw, `uniform`).
        Decision::until(positions, Correction::Residual, |p| p.uniform * p.q >= p.p)
    }
}
