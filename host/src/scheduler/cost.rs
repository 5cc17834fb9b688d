//! What a batched step costs, learnt from the steps run: the step-cost
//! line that splits a step's time among its requests ([`StepCurve`],
//! [`StepSplit`]), and what a prefill row costs the requests decoding
//! beside it ([`PrefillCost`]). The scheduler times each forward and asks
//! these how many prefill rows a step takes and what each round's verify
//! cost; nothing here changes a token.
/// What a scheduler learnt of its steps' cost ([`super::Scheduler::take_fit`]).
#[derive(Debug, Default, Clone)]
pub struct StepFit {
    pub(super) rounds: StepCurve,
    pub(super) prefill: PrefillCost,
}

/// What a step's prefill rows cost the requests decoding beside them,
/// learnt from the steps run: a step is taken as its decoding rows' step
/// alone plus a cost per prefill row. That cost grows with the prompt's
/// context (its rows attend to every row before them), so it is a running
/// average of the latest steps, not a fit over all of them.
#[derive(Debug, Default, Clone)]
pub(super) struct PrefillCost {
    /// The forward seconds of the latest step that carried no prefill.
    decode: Option<f64>,
    /// Forward seconds a prefill row adds.
    row: Option<f64>,
}

impl PrefillCost {
    pub(super) fn decode_step(&mut self, seconds: f64) {
        self.decode = Some(seconds);
    }

    /// A step of `seconds` with `rows` prefill rows, and decoding rows
    /// where `decoding`.
    pub(super) fn prefill_step(&mut self, seconds: f64, rows: usize, decoding: bool) {
        let per = match (decoding, self.decode, self.row) {
            (false, _, _) => seconds / rows as f64,
            (true, Some(d), _) => (seconds - d) / rows as f64,
            // The decoding rows' share unknown: the row cost stands, and
            // the rest of the step is theirs.
            (true, None, Some(r)) => {
                self.decode = Some((seconds - r * rows as f64).max(0.0));
                return;
            }
            (true, None, None) => return,
        };
        if per.is_finite() && per > 0.0 {
            self.row = Some(self.row.map_or(per, |r| 0.5 * r + 0.5 * per));
        }
    }

    /// Prefill rows for a step with requests `decoding` or not, within
    /// `cap` (`--step-tokens`): at least [`MIN_SHARED_PREFILL`] beside
    /// decoding, and [`UNFITTED_SHARED_PREFILL`] until both costs are known.
    pub(super) fn rows(&self, decoding: bool, cap: usize) -> usize {
        let cap = cap.max(1);
        if !decoding {
            return cap;
        }
        let rows = match (self.decode, self.row) {
            (Some(d), Some(r)) => ((STALL_STEPS - 1.0) * d / r).floor().min(cap as f64) as usize,
            _ => UNFITTED_SHARED_PREFILL,
        };
        rows.max(MIN_SHARED_PREFILL).min(cap)
    }
}

/// How many decode-only steps a step with a shared prefill chunk may cost
/// ([`super::Scheduler::prefill_budget`]).
const STALL_STEPS: f64 = 4.0;
/// The fewest prefill rows a step beside decoding requests takes.
const MIN_SHARED_PREFILL: usize = 16;
/// The prefill rows beside decoding requests before any step was timed.
const UNFITTED_SHARED_PREFILL: usize = 64;

/// The cost curve of a batched step, `seconds ≈ c + slope * rows`, fitted
/// online (exponentially decayed least squares over the steps run), so a
/// step's time can be split by what each request's rows added to it.
#[derive(Debug, Default, Clone)]
pub(super) struct StepCurve {
    /// Decayed sums: weight, rows, rows², seconds, rows * seconds.
    w: f64,
    r: f64,
    rr: f64,
    t: f64,
    rt: f64,
}

/// How much the newest step weighs against the fit so far.
const CURVE_DECAY: f64 = 0.95;

impl StepCurve {
    pub(super) fn add(&mut self, rows: usize, seconds: f64) {
        let (r, t) = (rows as f64, seconds);
        for (s, x) in [
            (&mut self.w, 1.0),
            (&mut self.r, r),
            (&mut self.rr, r * r),
            (&mut self.t, t),
            (&mut self.rt, r * t),
        ] {
            *s = *s * CURVE_DECAY + x;
        }
    }

    /// The fitted line's seconds at zero rows: the part of a step no row
    /// adds (`None` until the slope is known, or where the fit puts it at or
    /// below 0).
    fn intercept(&self) -> Option<f64> {
        let m = self.slope()?;
        Some((self.t - m * self.r) / self.w).filter(|c| c.is_finite() && *c > 0.0)
    }

    /// Seconds one more row adds, once steps of different sizes were seen.
    fn slope(&self) -> Option<f64> {
        if self.w < 2.0 {
            return None;
        }
        let (mr, mt) = (self.r / self.w, self.t / self.w);
        let var = self.rr / self.w - mr * mr;
        // Rows that barely varied say nothing about the slope.
        (var > 0.25)
            .then(|| (self.rt / self.w - mr * mt) / var)
            .filter(|m| m.is_finite() && *m > 0.0)
    }

    /// Splits a step of `seconds` over `rows` rows among its `rounds`
    /// decoding requests (prefill rows are the rest).
    pub(super) fn split(&self, seconds: f64, rows: usize, rounds: usize) -> StepSplit {
        let line = self.intercept().zip(self.slope());
        let slope = match self.slope() {
            // The marginal row never costs more than the step's average
            // row (the curve has a positive intercept), so every share
            // below stays positive.
            Some(m) if rounds > 0 && rows > 0 => m.min(seconds / rows as f64),
            // Nothing learnt yet: each request is charged the whole step,
            // as a request alone is.
            _ => {
                return StepSplit {
                    whole: seconds,
                    base: seconds,
                    slope: 0.0,
                    rows,
                    line,
                }
            }
        };
        StepSplit {
            whole: seconds,
            base: (seconds - slope * (rows - rounds) as f64) / rounds as f64,
            slope,
            rows,
            line,
        }
    }
}

/// A step's time as each request's rounds see it. Its stats count its
/// share ([`StepSplit::of`]): the step split with one row each, plus the
/// marginal cost of its other rows; alone (one request, no prefill) that
/// is the whole step, as before batching. Its schedule is told the lone
/// forward of its rows ([`StepSplit::lone`]) and reads what they cost in
/// this step from the batch context (`throughput`: its share of the step
/// plus what its draft rows add, so drafting pays in a small batch and
/// rarely in a large one); fixed-k schedules ignore timings and keep their
/// solo rounds.
#[derive(Debug, Clone, Copy)]
pub(super) struct StepSplit {
    whole: f64,
    base: f64,
    slope: f64,
    /// Rows of the whole step.
    rows: usize,
    /// The fitted step line (intercept, seconds per row), where known.
    line: Option<(f64, f64)>,
}

impl StepSplit {
    /// The verify seconds of a round of `rows` rows.
    pub(super) fn of(&self, rows: usize) -> f64 {
        if self.slope == 0.0 {
            return self.whole;
        }
        self.base + self.slope * rows.saturating_sub(1) as f64
    }

    /// What a forward of `rows` rows alone would have cost: the fitted line
    /// at `rows`, scaled by how this step ran against the line at its own
    /// rows (so a slow step reads slow). Before a line is known, the step
    /// in proportion to the rows (exact for a request alone; in a batch it
    /// leaves out the fixed part, so drafts read dear, the safe side).
    /// This is what schedules are told: alone and in batches of every size
    /// it is on one scale, and the batch context (contract 0.2) tells a
    /// schedule what the rows cost in this step.
    pub(super) fn lone(&self, rows: usize) -> f64 {
        let all = self.rows.max(1) as f64;
        match self.line {
            Some((c, m)) => (c + m * rows as f64) * self.whole / (c + m * all),
            None => self.whole * rows as f64 / all,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Alone a prompt takes whole `--step-tokens` chunks; beside decoding
    /// requests, what keeps the step within STALL_STEPS of theirs alone.
    #[test]
    fn a_prefill_chunk_beside_decoding_keeps_the_step_near_theirs() {
        let mut c = PrefillCost::default();
        assert_eq!(c.rows(false, 512), 512);
        assert_eq!(c.rows(true, 512), UNFITTED_SHARED_PREFILL);
        // A prompt alone: 512 rows in 1.2 s.
        c.prefill_step(1.2, 512, false);
        assert_eq!(
            c.rows(true, 512),
            UNFITTED_SHARED_PREFILL,
            "no decode step seen"
        );
        // Eight streams decode at 24 ms a step: (4 - 1) * 24 / 2.34 rows.
        c.decode_step(0.024);
        assert_eq!(c.rows(true, 512), 30);
        assert_eq!(c.rows(false, 512), 512);
        // A longer context makes rows dearer: 5 ms a row beside them.
        c.prefill_step(0.024 + 30.0 * 0.005, 30, true);
        let r = 0.5 * (1.2 / 512.0) + 0.5 * 0.005;
        assert_eq!(c.rows(true, 512), (3.0 * 0.024 / r) as usize);
        // One stream at 7 ms: 3 * 7 / 3.7 rows, raised to the floor.
        c.decode_step(0.007);
        assert_eq!(c.rows(true, 512), MIN_SHARED_PREFILL);
        // Never above `--step-tokens`, however small.
        assert_eq!(c.rows(true, 8), 8);
        assert_eq!(c.rows(true, 0), 1);
        // Where rows are nearly free (a GPU), whole chunks.
        let mut g = PrefillCost::default();
        g.prefill_step(0.02, 512, false);
        g.decode_step(0.01);
        assert_eq!(g.rows(true, 512), 512);
    }

    /// A first shared step, with no decode step timed yet, gives the
    /// decoding rows what the known row cost leaves of it.
    #[test]
    fn a_first_shared_step_learns_the_decoding_rows_share() {
        let mut c = PrefillCost::default();
        c.prefill_step(0.5, 200, false);
        c.prefill_step(0.007 + 64.0 * 0.0025, 64, true);
        assert!((c.decode.unwrap() - 0.007).abs() < 1e-12);
        assert_eq!(c.rows(true, 512), MIN_SHARED_PREFILL);
        // With nothing known, a shared step teaches nothing.
        let mut n = PrefillCost::default();
        n.prefill_step(0.2, 64, true);
        assert!(n.decode.is_none() && n.row.is_none());
    }

    /// Steps on the line `0.01 + 0.003 * rows`.
    fn learnt() -> StepCurve {
        let mut c = StepCurve::default();
        for rows in [1, 8, 3, 16, 2, 9, 12, 5] {
            c.add(rows, 0.01 + 0.003 * rows as f64);
        }
        c
    }

    #[test]
    fn the_slope_is_learnt_from_steps_of_different_sizes() {
        let m = learnt().slope().expect("rows varied");
        assert!((m - 0.003).abs() < 1e-9, "{m}");
        let mut flat = StepCurve::default();
        for _ in 0..10 {
            flat.add(8, 0.04);
        }
        assert_eq!(flat.slope(), None, "one size says nothing about the slope");
        assert_eq!(StepCurve::default().slope(), None);
    }

    #[test]
    fn the_split_adds_up_to_the_step_and_charges_draft_rows_their_margin() {
        let c = learnt();
        // 8 requests: six plain rounds, two with 4 drafts (5 rows each).
        let rows = [1, 1, 1, 1, 1, 1, 5, 5];
        let total: usize = rows.iter().sum();
        let step = 0.01 + 0.003 * total as f64;
        let s = c.split(step, total, rows.len());
        let sum: f64 = rows.iter().map(|&r| s.of(r)).sum();
        assert!((sum - step).abs() < 1e-12, "{sum} vs {step}");
        assert!((s.of(5) - s.of(1) - 4.0 * 0.003).abs() < 1e-12);
        assert!(
            s.of(1) < step / 2.0,
            "a plain round pays its share, not the step"
        );
        // Alone, a round is charged the whole step, whatever it drafted.
        let alone = c.split(0.022, 4, 1);
        assert!((alone.of(4) - 0.022).abs() < 1e-12);
        // Before anything is learnt, every round is charged the whole step.
        let fresh = StepCurve::default().split(0.05, 9, 3);
        assert_eq!((fresh.of(1), fresh.of(5)), (0.05, 0.05));
    }

    #[test]
    fn schedules_are_told_the_lone_forward_of_their_rows() {
        let c = learnt();
        let line = |rows: usize| 0.01 + 0.003 * rows as f64;
        // A step on the line: each round reads what its rows cost alone.
        let s = c.split(line(14), 14, 8);
        for r in [1, 5, 14] {
            assert!((s.lone(r) - line(r)).abs() < 1e-12, "{r}");
        }
        // A step twice as slow as the line reads twice as slow.
        let slow = c.split(2.0 * line(14), 14, 8);
        assert!((slow.lone(3) - 2.0 * line(3)).abs() < 1e-12);
        // Alone, the whole step, learnt or not.
        assert!((c.split(0.021, 4, 1).lone(4) - 0.021).abs() < 1e-12);
        assert!((StepCurve::default().split(0.021, 4, 1).lone(4) - 0.021).abs() < 1e-12);
        // Nothing learnt, in a batch: the step in proportion to the rows.
        let fresh = StepCurve::default().split(0.04, 8, 8);
        assert!((fresh.lone(1) - 0.005).abs() < 1e-12);
    }

    #[test]
    fn shares_stay_positive_when_the_slope_overshoots() {
        let mut c = StepCurve::default();
        for (rows, t) in [(1, 0.001), (20, 0.5), (2, 0.002), (21, 0.6)] {
            c.add(rows, t);
        }
        let s = c.split(0.05, 10, 2);
        assert!(s.of(1) > 0.0 && s.of(9) > 0.0);
        assert!((s.of(1) + s.of(9) - 0.05).abs() < 1e-12);
    }
}
