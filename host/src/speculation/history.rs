//! What a schedule is told about past rounds, kept the same way live (the
//! round) and offline (`specd replay`), so a replay with the recorded
//! policies sees exactly what they saw.
use specd_policy::{RoundRecord, ScheduleInput, RECENT_WINDOW};

fn ema(old: f64, new: f64) -> f64 {
    if old == 0.0 {
        new
    } else {
        0.8 * old + 0.2 * new
    }
}

#[derive(Debug, Clone)]
pub struct ScheduleHistory {
    recent: Vec<RoundRecord>,
    /// Per draft position: rounds that reached it, and kept it.
    reached: Vec<u64>,
    kept: Vec<u64>,
    draft_seconds_per_token: f64,
    /// `[j]`: smoothed time of a verify with j drafts.
    verify_seconds_by_len: Vec<f64>,
}

impl ScheduleHistory {
    pub fn new(draft_max: usize) -> Self {
        ScheduleHistory {
            recent: Vec::new(),
            reached: Vec::new(),
            kept: Vec::new(),
            draft_seconds_per_token: 0.0,
            verify_seconds_by_len: vec![0.0; draft_max + 1],
        }
    }

    /// The schedule's input for the next round.
    pub fn input(
        &self,
        round: u32,
        generated: usize,
        budget_left: usize,
        max_draft: usize,
    ) -> ScheduleInput {
        let position_acceptance = self
            .reached
            .iter()
            .zip(&self.kept)
            .take_while(|(r, _)| **r > 0)
            // Laplace-smoothed: one early rejection must not read as "never".
            .map(|(r, k)| (*k as f64 + 1.0) / (*r as f64 + 2.0))
            .collect();
        let start = self.recent.len().saturating_sub(RECENT_WINDOW);
        ScheduleInput {
            round,
            generated: generated as u32,
            budget_left: budget_left as u32,
            max_draft: max_draft as u32,
            recent: self.recent[start..].to_vec(),
            position_acceptance,
            draft_seconds_per_token: self.draft_seconds_per_token,
            verify_seconds_by_len: self.verify_seconds_by_len
                [..=max_draft.min(self.verify_seconds_by_len.len() - 1)]
                .to_vec(),
            // The batch context is the caller's (`SpecState::plan`).
            batch_sequences: 0,
            batch_rows_planned: 0,
        }
    }

    /// A finished round: `drafted` proposed, `accepted` kept, `draft_seconds`
    /// drafting, `verify_seconds` the verify forward.
    pub fn push(
        &mut self,
        drafted: usize,
        accepted: usize,
        draft_seconds: f64,
        verify_seconds: f64,
    ) {
        if drafted > 0 {
            self.draft_seconds_per_token =
                ema(self.draft_seconds_per_token, draft_seconds / drafted as f64);
            for i in 0..drafted {
                if self.reached.len() <= i {
                    self.reached.push(0);
                    self.kept.push(0);
                }
                self.reached[i] += 1;
                if i < accepted {
                    self.kept[i] += 1;
                } else {
                    break;
                }
            }
        }
        if drafted < self.verify_seconds_by_len.len() {
            self.verify_seconds_by_len[drafted] =
                ema(self.verify_seconds_by_len[drafted], verify_seconds);
        }
        self.recent.push(RoundRecord {
            drafted: drafted as u32,
            accepted: accepted as u32,
            draft_seconds,
            verify_seconds,
        });
        if self.recent.len() > 4 * RECENT_WINDOW {
            self.recent.drain(..self.recent.len() - RECENT_WINDOW);
        }
    }
}
