//! The standard policies as plain Rust behind the same traits — baselines
//! for benchmarks (native vs WebAssembly) and references in tests.  The
//! server serves the WebAssembly components; these are never selected by a
//! request.  They share their logic with the built-in components
//! (`plugins/logic`).

use crate::{
    Acceptance, Correction, Decision, PolicyError, PolicyErrorKind, Position, RoundRecord,
    Schedule, ScheduleInput,
};
use specd_policy_logic as logic;
use specd_policy_logic::{AcceptanceLogic, ScheduleLogic};

/// Names of the native schedules.
pub const SCHEDULES: [&str; 4] = ["constant", "heuristic", "heuristic-transient", "throughput"];
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

fn to_logic_input(i: &ScheduleInput) -> logic::ScheduleInput {
    logic::ScheduleInput {
        round: i.round,
        generated: i.generated,
        budget_left: i.budget_left,
        max_draft: i.max_draft,
        recent: i.recent[i.recent.len().saturating_sub(crate::RECENT_WINDOW)..]
            .iter()
            .map(|r: &RoundRecord| logic::RoundRecord {
                drafted: r.drafted,
                accepted: r.accepted,
                draft_seconds: r.draft_seconds,
                verify_seconds: r.verify_seconds,
            })
            .collect(),
        position_acceptance: i.position_acceptance.clone(),
        draft_seconds_per_token: i.draft_seconds_per_token,
        verify_seconds_by_len: i.verify_seconds_by_len.clone(),
    }
}

impl<L: ScheduleLogic + Send> Schedule for Native<L> {
    fn name(&self) -> &str {
        &self.name
    }
    fn next_draft_length(&mut self, input: &ScheduleInput) -> Result<u32, PolicyError> {
        Ok(self
            .logic
            .next_draft_length(&to_logic_input(input))
            .min(input.max_draft))
    }
    fn finish(self: Box<Self>) {}
}

impl<L: AcceptanceLogic + Send> Acceptance for Native<L> {
    fn name(&self) -> &str {
        &self.name
    }
    fn decide(&mut self, positions: &[Position]) -> Result<Decision, PolicyError> {
        let ps: Vec<logic::Position> = positions
            .iter()
            .map(|p| logic::Position {
                token: p.token,
                p: p.p,
                q: p.q,
                target_argmax: p.target_argmax,
                entropy: p.entropy,
                uniform: p.uniform,
            })
            .collect();
        let d = self.logic.decide(&ps);
        let correction = match d.correction {
            logic::Correction::Residual => Correction::Residual,
            logic::Correction::TargetSample => Correction::TargetSample,
            logic::Correction::Token(t) => {
                Correction::Token(t.min(self.vocab_size.saturating_sub(1)))
            }
        };
        Ok(Decision {
            accepted: d.accepted.min(positions.len() as u32),
            correction,
        })
    }
}
