//! Retirement: finished and failed requests are handed their outcome (a
//! finished one leaves its committed tokens in the prefix cache).
use super::{Scheduler, Waiting};
use anyhow::anyhow;

impl<'e> Scheduler<'e> {
    /// Ends every request with `why` (after a panic: their caches may be
    /// half updated).
    pub fn fail_all(&mut self, why: &str) {
        for mut a in self.active.drain(..) {
            if let Some(done) = a.done.take() {
                done(Err(anyhow!("{why}")));
            }
        }
        for w in self.waiting.drain(..) {
            match w {
                Waiting::Fresh(a) => (a.done)(Err(anyhow!("{why}"))),
                Waiting::Preempted(mut a) => {
                    if let Some(done) = a.done.take() {
                        done(Err(anyhow!("{why}")));
                    }
                }
            }
        }
    }

    /// Hands finished and failed requests their outcome.
    pub(super) fn retire(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            let a = &self.active[i];
            if !(a.seq.is_done() || a.failed.is_some()) {
                i += 1;
                continue;
            }
            let mut a = self.active.remove(i);
            let done = a.done.take().expect("done once");
            match a.failed.take() {
                Some(e) => done(Err(e)),
                None => {
                    let fin = a.seq.finish();
                    self.engine.keep_prefix(a.tenant.as_deref(), a.target, &fin);
                    done(Ok(fin));
                }
            }
        }
    }
}
