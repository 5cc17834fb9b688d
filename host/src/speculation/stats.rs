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
    /// Where the rounds' time went (not a stats key).
    #[serde(skip)]
    pub phases: RoundPhases,
    /// Rounds that verified drafts, by how many they accepted (index:
    /// accepted); vLLM's `acceptance_histogram`. Not a stats key.
    #[serde(skip)]
    pub accepted_histogram: Vec<u64>,
    /// Most drafts a round may verify (0 without speculation). Not a stats key.
    #[serde(skip)]
    pub draft_max: usize,
}

/// Where a request's rounds spent their time, in seconds summed over its
/// rounds (`specd bench spec` prints it per round). Not a stats key: these
/// are for measuring the round, and the figures overlap where the target
/// overlaps its work (`build` runs while `device` already computes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RoundPhases {
    /// Rounds the figures cover.
    pub rounds: u64,
    /// Asking the schedule (its draft hook included).
    pub schedule: f64,
    /// The drafter, without the hook.
    pub draft: f64,
    /// Building the verify forward's graph (host side).
    pub build: f64,
    /// Waiting for the verify forward after it was built.
    pub device: f64,
    /// Copying the rows (or their argmax) to the host.
    pub readback: f64,
    /// The host's transforms per row (masks, penalties, temperature,
    /// top-k/p, min-p) into distributions.
    pub rows: f64,
    /// Asking the acceptance policy.
    pub accept: f64,
    /// Rolling the caches back, the grammar's and the drafter's commit.
    pub rollback: f64,
    /// Streaming the committed tokens: detokenizing, stop strings, the sink.
    pub emit: f64,
    /// What the schedule asked and what the drafter and acceptance made of it.
    pub drafts: DraftCounts,
}

/// Draft positions tracked by [`DraftCounts`]; later ones count in the last.
pub const COUNTED_POSITIONS: usize = 16;

/// Per round: the k the schedule asked, the tokens drafted, and per draft
/// position how often a round reached it (every draft before it kept) and
/// kept it. This splits a round that verified little into the schedule
/// (small k), the drafter (drafted < k) and acceptance (reached, not kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DraftCounts {
    pub asked: u64,
    pub drafted: u64,
    pub reached: [u64; COUNTED_POSITIONS],
    pub kept: [u64; COUNTED_POSITIONS],
}

impl DraftCounts {
    /// Counts one round: `k` asked, `drafted` proposed, the first
    /// `accepted` kept.
    pub fn round(&mut self, k: usize, drafted: usize, accepted: usize) {
        self.asked += k as u64;
        self.drafted += drafted as u64;
        for i in 0..drafted.min(COUNTED_POSITIONS) {
            self.reached[i] += 1;
            if i >= accepted {
                break;
            }
            self.kept[i] += 1;
        }
    }

    pub fn add(&mut self, o: &DraftCounts) {
        self.asked += o.asked;
        self.drafted += o.drafted;
        for i in 0..COUNTED_POSITIONS {
            self.reached[i] += o.reached[i];
            self.kept[i] += o.kept[i];
        }
    }

    /// Per position while any round reached it: (kept / reached, reached).
    pub fn acceptance(&self) -> Vec<(f64, u64)> {
        self.reached
            .iter()
            .zip(&self.kept)
            .take_while(|(r, _)| **r > 0)
            .map(|(&r, &k)| (k as f64 / r as f64, r))
            .collect()
    }
}

impl RoundPhases {
    /// Adds `o`'s figures to these.
    pub fn add(&mut self, o: &RoundPhases) {
        self.rounds += o.rounds;
        let mut o = *o;
        for ((_, a), (_, b)) in self.parts_mut().into_iter().zip(o.parts_mut()) {
            *a += *b;
        }
        self.drafts.add(&o.drafts);
    }

    /// The figures as (name, seconds), in a round's order.
    pub fn parts(&self) -> [(&'static str, f64); 9] {
        let mut c = *self;
        c.parts_mut().map(|(n, v)| (n, *v))
    }

    /// Each figure with its name, in a round's order: the one list of them.
    fn parts_mut(&mut self) -> [(&'static str, &mut f64); 9] {
        [
            ("schedule", &mut self.schedule),
            ("draft", &mut self.draft),
            ("build", &mut self.build),
            ("device", &mut self.device),
            ("readback", &mut self.readback),
            ("rows", &mut self.rows),
            ("accept", &mut self.accept),
            ("rollback", &mut self.rollback),
            ("emit", &mut self.emit),
        ]
    }
}

/// What one verify forward's time went to ([`super::Target::take_forward_times`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ForwardTimes {
    pub build: f64,
    pub device: f64,
    pub readback: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_counts_reach_a_position_only_past_kept_ones() {
        let mut c = DraftCounts::default();
        c.round(4, 3, 1); // kept the first, lost the second: the third unreached
        c.round(4, 0, 0); // the drafter had nothing
        c.round(2, 2, 2);
        assert_eq!((c.asked, c.drafted), (10, 5));
        assert_eq!(c.acceptance(), vec![(1.0, 2), (0.5, 2)]);
        let mut d = DraftCounts::default();
        d.round(20, 20, 20); // past the counted positions: no overflow
        c.add(&d);
        assert_eq!(c.reached[COUNTED_POSITIONS - 1], 1);
        assert_eq!(c.acceptance()[0], (1.0, 3));
    }
}
