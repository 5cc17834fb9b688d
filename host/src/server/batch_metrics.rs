//! The continuous-batching histograms of `/metrics`: requests per step,
//! step time, policy time per step, queue wait, time to first token and
//! inter-token latency.
use prometheus::{Histogram, HistogramOpts, IntCounter, Registry};

pub struct BatchMetrics {
    pub batch_size: Histogram,
    pub step_seconds: Histogram,
    pub step_policy_seconds: Histogram,
    pub queue_wait_seconds: Histogram,
    pub time_to_first_token_seconds: Histogram,
    pub inter_token_seconds: Histogram,
    pub preemptions: IntCounter,
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
        .expect("a valid histogram definition")
}

/// Seconds from 1 ms to about a minute.
fn seconds() -> Vec<f64> {
    prometheus::exponential_buckets(0.001, 2.0, 17).expect("valid buckets")
}

impl Default for BatchMetrics {
    fn default() -> Self {
        BatchMetrics {
            batch_size: histogram(
                "specd_batch_size",
                "Requests in one engine step.",
                vec![1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0],
            ),
            step_seconds: histogram(
                "specd_step_seconds",
                "Time of one engine step (plan, batched forward, decide).",
                seconds(),
            ),
            step_policy_seconds: histogram(
                "specd_step_policy_seconds",
                "Time the policies (schedule and acceptance calls) of one engine step's requests ran, summed.",
                // From 10 us (a fast policy call) to about 5 s (fuel runs out first).
                prometheus::exponential_buckets(1e-5, 2.0, 19).expect("valid buckets"),
            ),
            queue_wait_seconds: histogram(
                "specd_queue_wait_seconds",
                "Time from submission to admission into the batch.",
                seconds(),
            ),
            time_to_first_token_seconds: histogram(
                "specd_time_to_first_token_seconds",
                "Time from submission to the first streamed text.",
                seconds(),
            ),
            inter_token_seconds: histogram(
                "specd_inter_token_seconds",
                "Time between two streamed pieces of text of one request.",
                seconds(),
            ),
            preemptions: IntCounter::new(
                "specd_preemptions_total",
                "Requests whose KV cache was dropped to stay within the KV budget (resumed later).",
            )
            .expect("a valid counter"),
        }
    }
}

impl BatchMetrics {
    pub fn register(&self, r: &Registry) -> prometheus::Result<()> {
        for h in [
            &self.batch_size,
            &self.step_seconds,
            &self.step_policy_seconds,
            &self.queue_wait_seconds,
            &self.time_to_first_token_seconds,
            &self.inter_token_seconds,
        ] {
            r.register(Box::new(h.clone()))?;
        }
        r.register(Box::new(self.preemptions.clone()))?;
        Ok(())
    }
}
