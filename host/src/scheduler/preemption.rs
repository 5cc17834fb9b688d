//! Preemption: when a step could pass the KV budget, the most recently
//! admitted requests leave it (never the last one running): their KV is
//! dropped and they wait at the front of the line to be re-prefilled from
//! their committed log (same tokens, later).
use super::kv::step_peak_bytes;
use super::{Active, Scheduler, Waiting};
use crate::sequence::PREFILL_CHUNK;
use crate::speculation::LlamaTarget;

impl<'e> Scheduler<'e> {
    /// Rows a request's next step forwards at most.
    fn step_rows(a: &Active<'_>) -> usize {
        match a.seq.prefill_left() {
            0 => a.seq.max_round_rows(),
            n => n.min(PREFILL_CHUNK),
        }
    }

    /// Preempts the most recently admitted requests while the next step
    /// could pass the budget (never the last one running).
    pub(super) fn preempt_for_step(&mut self) -> usize {
        if !self.kv.bounded() {
            return 0;
        }
        let mut n = 0;
        while self.active.len() > 1 {
            let peak: usize = (self.active.iter())
                .map(|a| step_peak_bytes(a.seq.kv_tokens(), Self::step_rows(a), a.per_token))
                .sum();
            if !self.kv.passed_by(peak) {
                break;
            }
            let newest = (0..self.active.len())
                .max_by_key(|&i| self.active[i].id)
                .expect("not empty");
            let mut a = self.active.remove(newest);
            a.seq.preempt();
            // Dropping the target frees its KV.
            a.target = LlamaTarget::new(self.engine.model.clone());
            self.waiting.push_front(Waiting::Preempted(a));
            n += 1;
        }
        n
    }
}
