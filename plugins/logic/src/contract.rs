//! The contract types: those of WIT `specd:policy@0.2.0` (`wit/0.2/policy.wit`
//! documents every field).  These are the one Rust form of them: the host's
//! policy traits, traces and native baselines use them as they are, and the
//! components convert the wit-bindgen types into them at their boundary.
//! Contract 0.1.0 (`wit/policy.wit`) is the same without the fields marked
//! "0.2": the host adapts 0.1 components into these types at one place
//! (`specd_policy`'s `wasm.rs`), where the 0.2 fields are dropped.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// Rounds of [`ScheduleInput::recent`] a schedule sees: the host passes at
/// most the last this many (the WIT promises a bounded window).
pub const RECENT_WINDOW: usize = 32;

/// One finished round (WIT `round-record`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    pub drafted: u32,
    pub accepted: u32,
    pub draft_seconds: f64,
    pub verify_seconds: f64,
}

/// What a schedule sees each round (WIT `schedule-input`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScheduleInput {
    /// Index of the round about to run (0 = first round of the request).
    pub round: u32,
    /// Tokens generated so far in this request.
    pub generated: u32,
    /// Tokens the request may still generate.
    pub budget_left: u32,
    /// Largest valid answer this round.
    pub max_draft: u32,
    /// Most recent rounds, oldest first; the last one is round `round - 1`.
    /// Only the last [`RECENT_WINDOW`] reach the policy.
    pub recent: Vec<RoundRecord>,
    /// P(draft i accepted | drafts 0..i accepted), estimated so far.
    pub position_acceptance: Vec<f64>,
    /// Measured drafter seconds per drafted token (0 = unknown).
    pub draft_seconds_per_token: f64,
    /// `[j]` = measured seconds of a target forward of j + 1 new tokens
    /// (j = 0 ..= max_draft); 0 = not measured yet.
    pub verify_seconds_by_len: Vec<f64>,
    /// 0.2: requests in this round's batched step, itself included (0 = not batched).
    #[serde(default)]
    pub batch_sequences: u32,
    /// 0.2: rows the step already holds when the schedule is asked (0 = not batched).
    #[serde(default)]
    pub batch_rows_planned: u32,
}

/// 0.2: one token a drafter drafting token by token just drafted (WIT
/// `draft-step`), handed to [`ScheduleLogic::continue_drafting`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DraftStep {
    /// Index in this round's draft (0 = first); asked only while index + 1 < k.
    pub index: u32,
    pub token: u32,
    /// Draft probability of `token` (the q acceptance sees).
    pub q: f32,
    /// Entropy (nats) of the draft distribution.
    pub entropy: f32,
    /// Largest probability of the draft distribution.
    pub top1: f32,
    /// This round's k (the upper bound).
    pub k: u32,
}

impl ScheduleInput {
    /// The rounds a policy is shown: the last [`RECENT_WINDOW`] of `recent`.
    pub fn recent_window(&self) -> &[RoundRecord] {
        &self.recent[self.recent.len().saturating_sub(RECENT_WINDOW)..]
    }
}

/// One drafted position (WIT `position`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Position {
    pub token: u32,
    /// Target probability of `token`.
    pub p: f32,
    /// Draft probability of `token` (1 for a point-mass drafter).
    pub q: f32,
    pub target_argmax: u32,
    /// Entropy (nats) of the target distribution here.
    pub entropy: f32,
    /// Host-drawn uniform in [0, 1).
    pub uniform: f32,
    /// 0.2: entropy (nats) of the draft distribution (none without one).
    #[serde(default)]
    pub draft_entropy: Option<f32>,
    /// 0.2: largest probability of the draft distribution (none without one).
    #[serde(default)]
    pub draft_top1: Option<f32>,
    /// 0.2: the drafter's own confidence (suffix drafter), none otherwise.
    #[serde(default)]
    pub confidence: Option<f32>,
}

/// What follows the accepted drafts when not all were accepted (WIT `correction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Correction {
    /// Sample norm(max(0, p - q)) at the first rejected position.
    Residual,
    /// Sample the target distribution at the first rejected position.
    TargetSample,
    /// Emit exactly this token (validated < vocab_size).
    Token(u32),
}

/// An acceptance answer (WIT `decision`).  After a full accept
/// (`accepted == positions.len()`) the host draws the bonus token itself and
/// ignores `correction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub accepted: u32,
    pub correction: Correction,
}

impl Decision {
    /// Accepts the drafts before the first position `rejects` refuses (all
    /// of them where it refuses none), with `correction` after them.
    pub fn until(
        positions: &[Position],
        correction: Correction,
        rejects: impl FnMut(&Position) -> bool,
    ) -> Decision {
        let accepted = positions
            .iter()
            .position(rejects)
            .unwrap_or(positions.len());
        Decision {
            accepted: accepted as u32,
            correction,
        }
    }
}

/// A draft-length schedule (one value per request).
pub trait ScheduleLogic: Sized {
    fn create(config: &str, carried: Option<&[u8]>) -> Result<Self, String>;
    fn next_draft_length(&mut self, input: &ScheduleInput) -> u32;
    /// 0.2: whether to draft the token after `step` (a schedule that does
    /// not stop early keeps the default, true).
    fn continue_drafting(&mut self, _step: &DraftStep) -> bool {
        true
    }
    fn carry(&self) -> Option<Vec<u8>> {
        None
    }
}

/// An acceptance rule (one value per request).
pub trait AcceptanceLogic: Sized {
    fn create(config: &str, vocab_size: u32) -> Result<Self, String>;
    fn decide(&mut self, positions: &[Position]) -> Decision;
}

/// Parses a JSON config object; empty text means `{}`. Unknown keys are errors.
pub fn parse_config<T: for<'de> Deserialize<'de>>(config: &str) -> Result<T, String> {
    let text = if config.trim().is_empty() {
        "{}"
    } else {
        config
    };
    if !text.trim_start().starts_with('{') {
        return Err(format!("bad config {config:?}: expected a JSON object"));
    }
    serde_json::from_str(text).map_err(|e| format!("bad config {config:?}: {e}"))
}
