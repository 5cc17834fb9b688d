use alloc::format;
use alloc::string::String;
use serde::Deserialize;

use crate::contract::{parse_config, AcceptanceLogic, Correction, Decision, Position};

/// `greedy`: accept drafts while each equals the target argmax (the
/// temperature-0 rule).  Correction at the first mismatch: the target argmax
/// as an explicit token (config `{"correction": "argmax"}`, the default), so
/// the output is exactly greedy decoding of the target whatever the sampling
/// settings; `{"correction": "sample"}` asks the host for a target sample
/// instead.
#[derive(Clone, Debug)]
pub struct Greedy {
    pub sample: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GreedyConfig {
    #[serde(default)]
    correction: Option<String>,
}

impl AcceptanceLogic for Greedy {
    fn create(config: &str, _vocab_size: u32) -> Result<Self, String> {
        let c: GreedyConfig = parse_config(config)?;
        let sample = match c.correction.as_deref() {
            None | Some("argmax") => false,
            Some("sample") => true,
            Some(other) => {
                return Err(format!(
                    "bad config: correction {other:?} (argmax or sample)"
                ))
            }
        };
        Ok(Greedy { sample })
    }
    fn decide(&mut self, positions: &[Position]) -> Decision {
        for (i, p) in positions.iter().enumerate() {
            if p.token != p.target_argmax {
                let correction = if self.sample {
                    Correction::TargetSample
                } else {
                    Correction::Token(p.target_argmax)
                };
                return Decision {
                    accepted: i as u32,
                    correction,
                };
            }
        }
        Decision {
            accepted: positions.len() as u32,
            correction: Correction::TargetSample,
        }
    }
}
