//! Admission: requests in, at a step boundary, while the KV budget has
//! room for them ([`super::kv::KvBudget::to_start`]); a preempted request
//! resumes in its admission place before any new one starts.
use super::kv::drafter_of;
use super::{Active, Admitted, Scheduler, Waiting};
use crate::sequence::Sequence;
use crate::speculation::LlamaTarget;

impl<'e> Scheduler<'e> {
    /// Admits a request: it starts at the next step boundary where it fits.
    pub fn admit(&mut self, a: Admitted<'e>) {
        self.waiting.push_back(Waiting::Fresh(a));
        self.start_waiting();
    }

    /// Starts a request. One that cannot start gets its error through
    /// `done` at once.
    fn start(&mut self, a: Admitted<'e>) {
        let id = self.next_id;
        self.next_id += 1;
        let per_token = self.kv.rates.per_token(drafter_of(&a.spec));
        // A request asking for its prompt's logprobs builds them from its own
        // prefill's rows, so it skips the prefix-cache lookup and prefills
        // the whole prompt (what it leaves in the cache is kept as usual).
        let (mut target, cached) = if a.settings.prompt_logprobs.is_some() {
            (LlamaTarget::new(self.engine.model.clone()), 0)
        } else {
            self.engine.target_for(a.tenant.as_deref(), &a.prompt)
        };
        match Sequence::new(
            &mut target,
            &self.engine.tokenizer,
            &a.prompt,
            cached,
            &a.settings,
            a.spec,
            a.sink,
        ) {
            Ok(seq) => self.active.push(Active {
                id,
                per_token,
                seq,
                target,
                tenant: a.tenant,
                done: Some(a.done),
                failed: None,
            }),
            Err(e) => (a.done)(Err(e)),
        }
    }

    /// Starts or resumes waiting requests, in order, while they fit: each
    /// reserves its tokens, a share of the budget and one round's rows. The
    /// first always starts when nothing runs.
    pub(super) fn start_waiting(&mut self) {
        while self.active.len() < self.limits.max_sequences.max(1) {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let (tokens, per_token) = match front {
                Waiting::Fresh(a) => (a.prompt.len(), self.kv.rates.per_token(drafter_of(&a.spec))),
                Waiting::Preempted(a) => (a.seq.kv_tokens() + a.seq.max_round_rows(), a.per_token),
            };
            let need = self.kv.to_start(tokens, per_token);
            if !self.active.is_empty() && !self.kv.fits(self.kv_bytes(), need) {
                break;
            }
            match self.waiting.pop_front().expect("a front") {
                Waiting::Fresh(a) => self.start(a),
                Waiting::Preempted(a) => {
                    // Back in its admission place: schedules are asked in that order.
                    let at = self.active.partition_point(|x| x.id < a.id);
                    self.active.insert(at, a);
                }
            }
        }
    }
}
