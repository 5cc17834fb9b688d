//! The standard policies as plain Rust behind the same traits — baselines
//! for benchmarks (native vs WebAssembly) and references in tests.  The
//! server serves the WebAssembly components; these are never selected by a
//! request.  They share their logic with the built-in components
//! (`plugins/logic`).

use crate::{
    validate, Acceptance, Decision, DraftStep, PolicyError, PolicyErrorKind, Position, Schedule,
    ScheduleInput,
};
use specd_policy_logic as logic;
use specd_policy_logic::{AcceptanceLogic, ScheduleLogic};

/// Names of the native schedules.
pub const SCHEDULES: [&str; 6] = [
    "constant",
    "heuristic",
    "heuristic-transient",
    "throughput",
    "adaedl",
    "bandit",
];
/// Names of the native acceptance policies.
pub const ACCEPTANCES: [&str; 3] = ["greedy", "rejection", "typical"];

struct Native<L> {
    name: String,
    logic: L,
    vocab_size: u32,
}

fn config_error(name: &str, m: String) -> PolicyError {
    PolicyError::new(name, PolicyErrorKind::Config, m)
}

/// A native schedule by built-in name; `carried` as the component would get it.
pub fn schedule(
    name: &str,
    config_json: &str,
    carried: Option<&[u8]>,
) -> Result<Box<dyn Schedule>, PolicyError> {
    fn make<L: ScheduleLogic + Send + 'static>(
        name: &str,
        c: &str,
        carried: Option<&[u8]>,
    ) -> Result<Box<dyn Schedule>, PolicyError> {
        let logic = L::create(c, carried).map_err(|m| config_error(name, m))?;
        Ok(Box::new(Native {
            name: name.to_string(),
            logic,
            vocab_size: 0,
        }))
    }
    match name {
        "constant" => make::<logic::Constant>(name, config_json, carried),
        "heuristic" => make::<logic::Heuristic>(name, config_json, carried),
        "heuristic-transient" => make::<logic::HeuristicTransient>(name, config_json, carried),
        "throughput" => make::<logic::Throughput>(name, config_json, carried),
        "adaedl" => make::<logic::AdaEdl>(name, config_json, carried),
        "bandit" => make::<logic::Bandit>(name, config_json, carried),
        _ => Err(PolicyError::new(
            name,
            PolicyErrorKind::NotFound,
            "no native schedule by that name",
        )),
    }
}

/// A native acceptance policy by built-in name.
pub fn acceptance(
    name: &str,
    config_json: &str,
    vocab_size: u32,
) -> Result<Box<dyn Acceptance>, PolicyError> {
    fn make<L: AcceptanceLogic + Send + 'static>(
        name: &str,
        c: &str,
        vocab_size: u32,
    ) -> Result<Box<dyn Acceptance>, PolicyError> {
        let logic = L::create(c, vocab_size).map_err(|m| config_error(name, m))?;
        Ok(Box::new(Native {
            name: name.to_string(),
            logic,
            vocab_size,
        }))
    }
    match name {
        "greedy" => make::<logic::Greedy>(name, config_json, vocab_size),
        "rejection" => make::<logic::Rejection>(name, config_json, vocab_size),
        "typical" => make::<logic::Typical>(name, config_json, vocab_size),
        _ => Err(PolicyError::new(
            name,
            PolicyErrorKind::NotFound,
            "no native acceptance policy by that name",
        )),
    }
}

impl<L: ScheduleLogic + Send> Schedule for Native<L> {
    fn name(&self) -> &str {
        &self.name
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> Result<u32, PolicyError> {
        // The components see only the last RECENT_WINDOW rounds: so does this.
        let k = if input.recent.len() > crate::RECENT_WINDOW {
            let windowed = ScheduleInput {
                recent: input.recent_window().to_vec(),
                ..input.clone()
            };
            self.logic.next_draft_length(&windowed)
        } else {
            self.logic.next_draft_length(input)
        };
        validate::draft_length(&self.name, k, input)
    }
    fn has_draft_hook(&self) -> bool {
        true
    }
    fn continue_drafting(&mut self, step: &DraftStep) -> Result<bool, PolicyError> {
        Ok(self.logic.continue_drafting(step))
    }
    fn finish(self: Box<Self>) {}
}

impl<L: AcceptanceLogic + Send> Acceptance for Native<L> {
    fn name(&self) -> &str {
        &self.name
    }
    fn decide(&mut self, positions: &[Position]) -> Result<Decision, PolicyError> {
        let d = self.logic.decide(positions);
        validate::decision(&self.name, d, positions.len(), self.vocab_size)
    }
}
