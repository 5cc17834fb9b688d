use alloc::string::String;
use serde::Deserialize;

use super::default_initial;
use crate::contract::{parse_config, ScheduleInput, ScheduleLogic};

/// `constant`: always k (config `{"k": 4}`), clipped to `max-draft`.
#[derive(Clone, Debug)]
pub struct Constant {
    pub k: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConstantConfig {
    #[serde(default = "default_initial")]
    k: u32,
}

impl ScheduleLogic for Constant {
    fn create(config: &str, _carried: Option<&[u8]>) -> Result<Self, String> {
        let c: ConstantConfig = parse_config(config)?;
        Ok(Constant { k: c.k })
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32 {
        self.k.min(input.max_draft)
    }
}
