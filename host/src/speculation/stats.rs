//! Speculation counters of one request (the stats keys of docs/architecture.md).
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyFailure {
    pub policy: String,
    pub kind: String,
    pub message: String,
}

impl From<&specd_policy::PolicyError> for PolicyFailure {
    fn from(e: &specd_policy::PolicyError) -> Self {
        PolicyFailure {
            policy: e.policy.clone(),
            kind: e.kind.as_str().to_string(),
            message: e.message.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SpecCounters {
    pub drafter: String,
    pub schedule: String,
    pub acceptance: String,
    /// Every round, plain steps included.
    pub rounds: u64,
    /// Rounds that verified at least one draft.
    pub spec_rounds: u64,
    pub drafted: u64,
    pub accepted: u64,
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    pub policy_seconds: f64,
    pub policy_failure: Option<PolicyFailure>,
    /// Bytes the policies printed past their output cap (dropped, not logged).
    pub policy_output_dropped: u64,
}
