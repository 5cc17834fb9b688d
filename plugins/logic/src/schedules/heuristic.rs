use alloc::string::String;
use alloc::vec::Vec;
use serde::Deserialize;

use super::default_initial;
use crate::contract::{parse_config, ScheduleInput, ScheduleLogic};

/// `heuristic` / `heuristic-transient`: Hugging Face transformers'
/// `num_assistant_tokens_schedule = "heuristic"`.
///
/// k starts at `initial` (config `{"initial": 4}`).  Before every round but the
/// first, the previous round (the last element of `recent`) updates it: +2
/// when every drafted token was accepted, -1 otherwise (never below 1); a
/// round that drafted nothing changes nothing.  k is kept within
/// [1, max-draft] and the answer is k (0 only when max-draft is 0).
///
/// `heuristic` carries k across requests (4 bytes, little-endian u32, handed
/// back by `carry` and read by the next request's `create`), as HF keeps it on
/// the assistant model; `heuristic-transient` starts every request at
/// `initial`.
#[derive(Clone, Debug)]
pub struct Heuristic {
    pub k: u32,
    pub transient: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeuristicConfig {
    #[serde(default = "default_initial")]
    initial: u32,
}

impl Heuristic {
    pub fn new(config: &str, carried: Option<&[u8]>, transient: bool) -> Result<Self, String> {
        let c: HeuristicConfig = parse_config(config)?;
        if c.initial == 0 {
            return Err("bad config: initial must be >= 1".into());
        }
        let mut k = c.initial;
        if !transient {
            if let Some(&[a, b, c, d]) = carried {
                k = u32::from_le_bytes([a, b, c, d]).max(1);
            }
        }
        Ok(Heuristic { k, transient })
    }
}

impl ScheduleLogic for Heuristic {
    fn create(config: &str, carried: Option<&[u8]>) -> Result<Self, String> {
        Heuristic::new(config, carried, false)
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        if input.round > 0 {
            if let Some(last) = input.recent.last() {
                if last.drafted > 0 {
                    if last.accepted >= last.drafted {
                        self.k = self.k.saturating_add(2);
                    } else {
                        self.k = self.k.saturating_sub(1).max(1);
                    }
                }
            }
        }
        if input.max_draft == 0 {
            return 0;
        }
        self.k = self.k.clamp(1, input.max_draft);
        self.k
    }
    fn carry(&self) -> Option<Vec<u8>> {
        (!self.transient).then(|| self.k.to_le_bytes().to_vec())
    }
}

/// The transient variant as its own type (for the component shims).
#[derive(Clone, Debug)]
pub struct HeuristicTransient(pub Heuristic);

impl ScheduleLogic for HeuristicTransient {
    fn create(config: &str, carried: Option<&[u8]>) -> Result<Self, String> {
        Heuristic::new(config, carried, true).map(HeuristicTransient)
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        self.0.next_draft_length(input)
    }
}
