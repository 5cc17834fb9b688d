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
    /// Per drafter source ([`crate::speculation::Drafter::source`]) what
    /// its rounds showed: a combining drafter's sources are told apart.
    sources: Vec<SourceStats>,
    /// `[0]`: the plain step's smoothed seconds. `[j]`, j >= 1: a verify
    /// with j drafts as a smoothed ratio to the plain step's time when it
    /// ran (0 = not measured); seconds as measured while no plain step has
    /// run, turned into ratios by the first one (the nearest in time).
    /// A shared machine's speed drifts by tens of percent within seconds,
    /// and plain steps are measured far more often than any one draft
    /// length: absolute times from different moments made a draft row look
    /// as dear as a whole step after a slow spell (a 4-draft round at 25 ms
    /// beside later plain steps of 7.5 ms), and the schedule stopped
    /// drafting. So a length is reported at the plain step of now.
    verify_by_len: Vec<f64>,
}

/// One drafter source's rounds.
#[derive(Debug, Clone, Default)]
struct SourceStats {
    recent: Vec<RoundRecord>,
    /// Per draft position: rounds that reached it, and kept it.
    reached: Vec<u64>,
    kept: Vec<u64>,
    draft_seconds_per_token: f64,
}

impl ScheduleHistory {
    pub fn new(draft_max: usize) -> Self {
        ScheduleHistory {
            sources: Vec::new(),
            verify_by_len: vec![0.0; draft_max + 1],
        }
    }

    fn source(&mut self, i: usize) -> &mut SourceStats {
        if self.sources.len() <= i {
            self.sources.resize(i + 1, SourceStats::default());
        }
        &mut self.sources[i]
    }

    /// `verify_seconds_by_len` as the schedule sees it: seconds of a
    /// verify with 0 ..= max_draft drafts, at the plain step's speed.
    fn verify_seconds(&self, max_draft: usize) -> Vec<f64> {
        let plain = self.verify_by_len[0];
        let to_seconds = |(j, &v): (usize, &f64)| if j > 0 && plain > 0.0 { v * plain } else { v };
        self.verify_by_len
            .iter()
            .enumerate()
            .take(max_draft + 1)
            .map(to_seconds)
            .collect()
    }

    /// The schedule's input for the next round, drafted by `source`: the
    /// rounds, acceptance and drafting cost are that source's (each source
    /// has its own schedule instance); the verify timing is the request's.
    pub fn input(
        &self,
        round: u32,
        generated: usize,
        budget_left: usize,
        max_draft: usize,
        source: usize,
    ) -> ScheduleInput {
        let none = SourceStats::default();
        let src = self.sources.get(source).unwrap_or(&none);
        let position_acceptance = src
            .reached
            .iter()
            .zip(&src.kept)
            .take_while(|(r, _)| **r > 0)
            // Laplace-smoothed: one early rejection must not read as "never".
            .map(|(r, k)| (*k as f64 + 1.0) / (*r as f64 + 2.0))
            .collect();
        let start = src.recent.len().saturating_sub(RECENT_WINDOW);
        ScheduleInput {
            round,
            generated: generated as u32,
            budget_left: budget_left as u32,
            max_draft: max_draft as u32,
            recent: src.recent[start..].to_vec(),
            position_acceptance,
            draft_seconds_per_token: src.draft_seconds_per_token,
            verify_seconds_by_len: self.verify_seconds(max_draft),
            // The batch context is the caller's (`SpecState::plan`).
            batch_sequences: 0,
            batch_rows_planned: 0,
        }
    }

    /// A finished round: `drafted` proposed by `source`, `accepted` kept,
    /// `draft_seconds` drafting, `verify_seconds` the verify forward.
    pub fn push(
        &mut self,
        drafted: usize,
        accepted: usize,
        draft_seconds: f64,
        verify_seconds: f64,
        source: usize,
    ) {
        if drafted > 0 {
            let src = self.source(source);
            src.draft_seconds_per_token =
                ema(src.draft_seconds_per_token, draft_seconds / drafted as f64);
            for i in 0..drafted {
                if src.reached.len() <= i {
                    src.reached.push(0);
                    src.kept.push(0);
                }
                src.reached[i] += 1;
                if i < accepted {
                    src.kept[i] += 1;
                } else {
                    break;
                }
            }
        }
        if drafted < self.verify_by_len.len() {
            let plain = self.verify_by_len[0];
            let v = &mut self.verify_by_len;
            if drafted > 0 {
                let measured = if plain > 0.0 {
                    verify_seconds / plain
                } else {
                    verify_seconds
                };
                v[drafted] = ema(v[drafted], measured);
            } else {
                v[0] = ema(plain, verify_seconds);
                if plain == 0.0 && v[0] > 0.0 {
                    let first = v[0];
                    v[1..].iter_mut().for_each(|t| *t /= first);
                }
            }
        }
        let recent = &mut self.source(source).recent;
        recent.push(RoundRecord {
            drafted: drafted as u32,
            accepted: accepted as u32,
            draft_seconds,
            verify_seconds,
        });
        if recent.len() > 4 * RECENT_WINDOW {
            recent.drain(..recent.len() - RECENT_WINDOW);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verify(h: &ScheduleHistory) -> Vec<f64> {
        h.input(0, 0, 100, 4, 0).verify_seconds_by_len
    }

    #[test]
    fn each_source_is_told_its_own_rounds_acceptance_and_cost() {
        let mut h = ScheduleHistory::new(4);
        // Source 0 (suffix) keeps all 3 of its drafts; source 1 (a head)
        // loses its first one, at 10x the drafting cost per token.
        for _ in 0..4 {
            h.push(3, 3, 0.0003, 0.010, 0);
            h.push(2, 0, 0.002, 0.009, 1);
        }
        let (a, b) = (h.input(0, 0, 100, 4, 0), h.input(0, 0, 100, 4, 1));
        assert_eq!(a.position_acceptance, vec![5.0 / 6.0; 3]);
        assert_eq!(b.position_acceptance, vec![1.0 / 6.0]);
        assert!((a.draft_seconds_per_token - 0.0001).abs() < 1e-12);
        assert!((b.draft_seconds_per_token - 0.001).abs() < 1e-12);
        // Each is told its own rounds; the verify curve is the request's.
        assert_eq!(a.recent.len(), 4);
        assert!(a.recent.iter().all(|r| r.drafted == 3 && r.accepted == 3));
        assert!(b.recent.iter().all(|r| r.drafted == 2 && r.accepted == 0));
        assert_eq!(a.verify_seconds_by_len, b.verify_seconds_by_len);
        // A source never seen yet is unknown, not another's.
        let c = h.input(0, 0, 100, 4, 2);
        assert!(c.position_acceptance.is_empty() && c.draft_seconds_per_token == 0.0);
    }

    #[test]
    fn a_draft_length_is_reported_at_the_speed_of_the_latest_plain_steps() {
        let mut h = ScheduleHistory::new(4);
        h.push(0, 0, 0.0, 0.010, 0);
        h.push(2, 1, 0.0, 0.012, 0);
        assert!((verify(&h)[2] - 0.012).abs() < 1e-12);
        // The machine speeds up: plain steps go from 10 to 5 ms.
        for _ in 0..60 {
            h.push(0, 0, 0.0, 0.005, 0);
        }
        let v = verify(&h);
        assert!((v[0] - 0.005).abs() < 1e-6, "{v:?}");
        // 1.2 times the plain step, not the 12 ms of the slow spell.
        assert!((v[2] - 0.006).abs() < 1e-6, "{v:?}");
        assert_eq!(v[1], 0.0, "a length never measured stays unknown");
        assert_eq!(v.len(), 5);
    }

    #[test]
    fn a_length_measured_before_any_plain_step_is_taken_at_the_first_ones_speed() {
        let mut h = ScheduleHistory::new(4);
        h.push(4, 0, 0.0, 0.020, 0);
        assert_eq!(verify(&h)[4], 0.020);
        h.push(0, 0, 0.0, 0.008, 0);
        assert!((verify(&h)[4] - 0.020).abs() < 1e-12);
        for _ in 0..60 {
            h.push(0, 0, 0.0, 0.004, 0);
        }
        // 2.5 plain steps, at today's plain step.
        assert!((verify(&h)[4] - 0.010).abs() < 1e-6, "{:?}", verify(&h));
    }
}
