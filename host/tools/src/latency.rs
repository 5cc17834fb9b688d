//! The latency summary of concurrent streamed requests (one batch, or a
//! closed loop of clients). One
//! type for both sides of `bench serve --anchor`: `bench serve` reports
//! specd's batches with it, `specd-anchors --serve` reports mlx-lm's server
//! with it and reads specd's rows back as they were written.
use serde::{Deserialize, Serialize};

/// `n` concurrent requests (or clients): how many tokens came back, how
/// fast, and when their pieces arrived.
/// Read back, a field it lacks defaults (the anchor reads what it needs).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Latency {
    pub concurrency: usize,
    pub tokens: usize,
    pub seconds: f64,
    /// Aggregate, from submission to the last token.
    pub tokens_per_second: f64,
    /// Aggregate while decoding: streamed pieces after each request's
    /// first, from the first first piece to the last piece.
    pub decode_tokens_per_second: f64,
    pub ttft_p50: f64,
    pub ttft_p99: f64,
    pub itl_p50: f64,
    pub itl_p99: f64,
}

impl Latency {
    /// The summary of `streams`, each request's non-empty pieces as seconds
    /// since the batch was submitted, over `seconds` of wall time.
    pub fn of(concurrency: usize, tokens: usize, seconds: f64, streams: &[Vec<f64>]) -> Latency {
        Latency::submitted_at(
            concurrency,
            tokens,
            seconds,
            streams,
            &vec![0.0; streams.len()],
        )
    }

    /// [`Latency::of`] for requests submitted at different times (a closed
    /// loop of clients): `streams` and `submitted` on one clock, request
    /// i's time to first token counted from `submitted[i]`.
    pub fn submitted_at(
        concurrency: usize,
        tokens: usize,
        seconds: f64,
        streams: &[Vec<f64>],
        submitted: &[f64],
    ) -> Latency {
        let mut l = Latency::rates(concurrency, tokens, seconds, streams);
        l.set_percentiles(&Gaps::of(streams, submitted));
        l
    }

    /// The throughputs of `streams` (as [`Latency::of`]), without the
    /// percentiles ([`Latency::set_percentiles`] sets them).
    pub fn rates(concurrency: usize, tokens: usize, seconds: f64, streams: &[Vec<f64>]) -> Latency {
        let first = streams
            .iter()
            .filter_map(|s| s.first())
            .copied()
            .fold(f64::INFINITY, f64::min);
        let last = streams
            .iter()
            .filter_map(|s| s.last())
            .copied()
            .fold(0.0, f64::max);
        let after_first: usize = streams.iter().map(|s| s.len().saturating_sub(1)).sum();
        Latency {
            concurrency,
            tokens,
            seconds,
            tokens_per_second: tokens as f64 / seconds.max(1e-9),
            decode_tokens_per_second: if last > first {
                after_first as f64 / (last - first)
            } else {
                0.0
            },
            ..Default::default()
        }
    }

    /// The percentiles of `gaps` (one run's, or several runs' pooled).
    pub fn set_percentiles(&mut self, gaps: &Gaps) {
        let (mut ttft, mut itl) = (gaps.ttft.clone(), gaps.itl.clone());
        self.ttft_p50 = percentile(&mut ttft, 0.5);
        self.ttft_p99 = percentile(&mut ttft, 0.99);
        self.itl_p50 = percentile(&mut itl, 0.5);
        self.itl_p99 = percentile(&mut itl, 0.99);
    }
}

/// The samples behind [`Latency`]'s percentiles, in seconds: per request
/// its time to first token, and every gap between its pieces.
#[derive(Debug, Clone, Default)]
pub struct Gaps {
    pub ttft: Vec<f64>,
    pub itl: Vec<f64>,
}

impl Gaps {
    /// As [`Latency::submitted_at`] takes them.
    pub fn of(streams: &[Vec<f64>], submitted: &[f64]) -> Gaps {
        Gaps {
            ttft: streams
                .iter()
                .zip(submitted)
                .filter_map(|(s, t)| s.first().map(|f| f - t))
                .collect(),
            itl: streams
                .iter()
                .flat_map(|s| s.windows(2).map(|w| w[1] - w[0]))
                .collect(),
        }
    }

    pub fn extend(&mut self, other: &Gaps) {
        self.ttft.extend_from_slice(&other.ttft);
        self.itl.extend_from_slice(&other.itl);
    }
}

/// The value at rank `p` (0..=1, nearest rank) of `v`; 0 when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_sorted_and_empty() {
        assert_eq!(percentile(&mut [3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(percentile(&mut [], 0.99), 0.0);
    }

    #[test]
    fn decode_rate_counts_pieces_after_each_first() {
        // Two requests: first pieces at 1.0 and 1.5, the last at 3.0; three
        // pieces after the firsts over 2 seconds.
        let l = Latency::of(2, 5, 4.0, &[vec![1.0, 2.0, 3.0], vec![1.5, 2.5]]);
        assert_eq!(l.decode_tokens_per_second, 1.5);
        assert_eq!(l.tokens_per_second, 1.25);
        assert_eq!((l.ttft_p50, l.ttft_p99), (1.5, 1.5));
        assert_eq!((l.itl_p50, l.itl_p99), (1.0, 1.0));
        assert_eq!(
            Latency::of(1, 0, 1.0, &[vec![]]).decode_tokens_per_second,
            0.0
        );
    }

    #[test]
    fn time_to_first_token_counts_from_each_submission() {
        // The second request was submitted at 2.0, after the first ended:
        // its first piece 0.5 s later.
        let l = Latency::submitted_at(
            1,
            5,
            4.0,
            &[vec![1.0, 1.5, 2.0], vec![2.5, 3.0]],
            &[0.0, 2.0],
        );
        // Counted from 0, its 2.5 would be the tail.
        assert_eq!((l.ttft_p50, l.ttft_p99), (1.0, 1.0));
        // Pieces after each first (3) over the first first to the last.
        assert_eq!(l.decode_tokens_per_second, 1.5);
        assert_eq!((l.itl_p50, l.itl_p99), (0.5, 0.5));
    }
}
