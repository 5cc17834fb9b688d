//! Scripted rounds: a fake target with one-hot or fixed logits, scripted
//! drafters and policies, so every branch of the round is deterministic
//! (the seeds' approach). The real model is exercised in tests/.
use super::*;
use crate::sequence::{self, DoneReason, Settings};
use specd_policy::{native, Decision, PolicyErrorKind};
use specd_text::Tokenizer;
use std::sync::OnceLock;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let p = crate::store::default_model().expect("the default model (specd pull)");
        Tokenizer::from_gguf_file(&p)
            .unwrap_or_else(|e| panic!("reading the tokenizer of {}: {e:#}", p.display()))
    })
}

/// Word token ids: " a", " b", ...
fn words() -> Vec<u32> {
    tokenizer().encode(" a b c d e f g h", false).unwrap()
}

type Script = Box<dyn Fn(&[u32]) -> Vec<f32> + Send>;

/// One round alone through the round's surface, as a step of one runs it:
/// plan, verify on `target`, read, decide, apply.
fn round_alone(
    st: &mut SpecState,
    target: &mut dyn Target,
    mut req: RoundRequest<'_>,
) -> Result<RoundOutcome> {
    let mut plan = match st.plan(target, req.reborrow(), BatchContext::default())? {
        Plan::Ready(plan) => plan,
        Plan::Head(_) => anyhow::bail!("a head job from a drafter without a head"),
    };
    let t = Instant::now();
    let verified = target.verify(&plan.rows, st.mode, None)?;
    let rows = plan.verified(verified);
    let vt = t.elapsed().as_secs_f64();
    let masked = st.mask_rows(&plan, rows, req.log, req.params)?;
    let read = read_one(masked, row_threads());
    let decided = st.decide(plan, read, vt, req.params, req.rng)?;
    st.apply(decided, target, req.log)
}

/// A target whose logits are a function of the sequence so far. It cannot
/// rewind in place after a multi-token forward, only from a snapshot taken
/// at a prepared offset (like a rotating cache that wrapped).
struct FakeTarget {
    vocab: usize,
    seq: Vec<u32>,
    script: Script,
    pending: Vec<usize>,
    taken: Vec<usize>,
}

impl FakeTarget {
    fn new(script: Script) -> Self {
        FakeTarget {
            vocab: 49152,
            seq: Vec::new(),
            script,
            pending: Vec::new(),
            taken: Vec::new(),
        }
    }
}

impl Target for FakeTarget {
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn offset(&self) -> usize {
        self.seq.len()
    }
    fn forward(&mut self, tokens: &[u32], all: bool) -> Result<Vec<Vec<f32>>> {
        let start = self.seq.len();
        let mut rows = Vec::new();
        for &t in tokens {
            self.seq.push(t);
            rows.push((self.script)(&self.seq));
        }
        let end = self.seq.len();
        self.taken = self
            .pending
            .drain(..)
            .filter(|&o| o > start && o <= end)
            .collect();
        if !all {
            rows.drain(..rows.len() - 1);
        }
        Ok(rows)
    }
    fn prefill(&mut self, tokens: &[u32], _: Option<&[usize]>) -> Result<Option<HiddenRows>> {
        self.seq.extend_from_slice(tokens);
        Ok(None)
    }
    fn rewind(&mut self, offset: usize) -> Result<()> {
        let taken = std::mem::take(&mut self.taken);
        if offset < self.seq.len() && !taken.contains(&offset) {
            anyhow::bail!("no snapshot at {offset}");
        }
        self.seq.truncate(offset);
        Ok(())
    }
    fn prepare_snapshots(&mut self, offsets: &[usize]) {
        self.pending = offsets.to_vec();
    }
    fn snapshot_counts(&self) -> (usize, usize) {
        (self.taken.len(), self.pending.len())
    }
}

fn one_hot(vocab: usize, t: u32) -> Vec<f32> {
    let mut v = vec![-30.0; vocab];
    v[t as usize] = 10.0;
    v
}

/// Next token cycles through the words; an EOS (id 2) after `eos_after` tokens.
fn cycle_script(eos_after: Option<usize>) -> Script {
    let w = words();
    Box::new(move |seq: &[u32]| match eos_after {
        Some(n) if seq.len() >= n => one_hot(49152, 2),
        _ => one_hot(49152, w[seq.len() % w.len()]),
    })
}

/// Proposes the script's continuation, wrong from position `wrong_at` on.
struct ScriptedDrafter {
    wrong_at: usize,
    eos_after: Option<usize>,
}

impl Drafter for ScriptedDrafter {
    fn name(&self) -> String {
        "scripted".into()
    }
    fn draft_one(&mut self, req: &mut DraftReq<'_>) -> Result<()> {
        let (log, k) = (req.log, req.k);
        let w = words();
        let mut tokens = Vec::new();
        for i in 0..k {
            let pos = log.len() + i;
            let right = match self.eos_after {
                Some(n) if pos >= n => 2,
                _ => w[pos % w.len()],
            };
            tokens.push(if i >= self.wrong_at {
                w[(pos + 1) % w.len()]
            } else {
                right
            });
        }
        req.draft = Draft::point_mass(tokens);
        Ok(())
    }
    fn commit(&mut self, _: usize, _: usize, _: usize) -> Result<()> {
        Ok(())
    }
}

fn spec(
    drafter: Box<dyn Drafter>,
    schedule: &str,
    sched_cfg: &str,
    acceptance: &str,
) -> Speculation {
    Speculation {
        drafter,
        // Scripted drafters hold no KV, as model-free ones.
        drafter_spec: DrafterSpec::Suffix,
        schedule: native::schedule(schedule, sched_cfg, None).unwrap(),
        source_schedules: Vec::new(),
        acceptance: native::acceptance(acceptance, "{}", 49152).unwrap(),
        draft_max: 8,
    }
}

/// A drafter that is never wrong, k = 8, greedy acceptance.
fn always_right_k8() -> Speculation {
    right_k8_eos_after(None)
}

/// Always-right drafts of 8 that propose the script's EOS after `eos_after`.
fn right_k8_eos_after(eos_after: Option<usize>) -> Speculation {
    spec(
        Box::new(ScriptedDrafter {
            wrong_at: 99,
            eos_after,
        }),
        "constant",
        r#"{"k":8}"#,
        "greedy",
    )
}

fn settings(max_tokens: Option<usize>, stop: &[&str]) -> Settings {
    Settings {
        ends: Default::default(),
        params: SamplingParams::default(),
        max_tokens,
        stop: stop.iter().map(|s| s.to_string()).collect(),
        context_length: 8192,
        record: false,
        on_round: None,
        logprobs: None,
        prompt_logprobs: None,
        constraint: None,
        light_rounds: true,
    }
}

/// The scripted prompt through a sequence with speculation `s`.
fn run_scripted(
    t: &mut dyn Target,
    s: Speculation,
    max_tokens: usize,
    stop: &[&str],
    sink: &mut sequence::Sink<'_>,
) -> sequence::Finished {
    sequence::generate(
        t,
        tokenizer(),
        &prompt(),
        0,
        &settings(Some(max_tokens), stop),
        Some(s),
        sink,
    )
    .unwrap()
}

fn prompt() -> Vec<u32> {
    let w = words();
    (0..12).map(|i| w[i % w.len()]).collect()
}

#[test]
fn greedy_rounds_keep_the_scripted_sequence() {
    for wrong_at in [0, 1, 3, 8] {
        let mut t = FakeTarget::new(cycle_script(None));
        let s = spec(
            Box::new(ScriptedDrafter {
                wrong_at,
                eos_after: None,
            }),
            "constant",
            r#"{"k":4}"#,
            "greedy",
        );
        let fin = run_scripted(&mut t, s, 30, &[], &mut |_| true);
        let w = words();
        let want: Vec<u32> = (12..42).map(|i| w[i % w.len()]).collect();
        assert_eq!(fin.emitted, want, "wrong_at {wrong_at}");
        assert_eq!(fin.stats.done_reason, DoneReason::Length);
        let (a, d) = (fin.stats.accepted, fin.stats.drafted);
        match wrong_at {
            0 => assert_eq!(a, 0),
            w if w >= 4 => assert_eq!(a, d),
            _ => assert!(a > 0 && a < d),
        }
        assert_eq!(t.offset(), fin.log.len() - 1);
        assert_eq!(t.snapshot_counts(), (0, 0));
    }
}

#[test]
fn cancellation_at_every_point_keeps_caches_equal_to_the_log() {
    let mut calls_total = 0;
    for cancel_at in 1..60 {
        let mut t = FakeTarget::new(cycle_script(None));
        let s = spec(
            Box::new(ScriptedDrafter {
                wrong_at: 2,
                eos_after: None,
            }),
            "heuristic",
            "{}",
            "greedy",
        );
        let mut calls = 0;
        let mut sink = |_: &str| {
            calls += 1;
            calls < cancel_at
        };
        let fin = run_scripted(&mut t, s, 24, &[], &mut sink);
        calls_total = calls_total.max(calls);
        if fin.stats.done_reason == DoneReason::Cancelled {
            assert!(calls == cancel_at, "cancelled at the call that said so");
        }
        // Prefill cancels before the log grows; afterwards caches hold all but the last committed token.
        assert_eq!(t.offset(), fin.log.len() - 1, "cancel_at {cancel_at}");
        assert_eq!(
            t.snapshot_counts(),
            (0, 0),
            "cancel_at {cancel_at}: a snapshot leaked or stayed scheduled"
        );
        assert!(fin.emitted.len() <= 24);
    }
    assert!(calls_total > 20, "the sweep covered the whole run");
}

#[test]
fn budget_eos_and_stop_strings_hold_inside_accepted_runs() {
    let w = words();
    // EOS inside a fully accepted run: nothing at or after it is emitted.
    let mut t = FakeTarget::new(cycle_script(Some(17)));
    let s = right_k8_eos_after(Some(17));
    let fin = run_scripted(&mut t, s, 50, &[], &mut |_| true);
    assert_eq!(fin.stats.done_reason, DoneReason::Stop);
    assert_eq!(fin.emitted.len(), 17 - 12);
    assert!(!fin.emitted.contains(&2));
    assert!(
        fin.log.len() > 12 + fin.emitted.len(),
        "the run was accepted past EOS and recorded"
    );
    // What is handed back ends at the EOS, as plain decoding's log does.
    assert_eq!(fin.context(), &fin.log[..12 + fin.emitted.len() + 1]);
    assert_eq!(fin.context().last(), Some(&2));

    // The budget cuts a run short.
    for max in [1, 2, 5, 9] {
        let mut t = FakeTarget::new(cycle_script(None));
        let s = always_right_k8();
        let fin = run_scripted(&mut t, s, max, &[], &mut |_| true);
        assert_eq!(fin.emitted.len(), max);
        assert_eq!(fin.stats.done_reason, DoneReason::Length);
        assert_eq!(fin.context(), &fin.log[..12 + max]);
        assert_eq!(&fin.context()[12..], &fin.emitted[..]);
    }

    // A stop string in the middle of a run: the text ends before it.
    let mut t = FakeTarget::new(cycle_script(None));
    let s = always_right_k8();
    let mut text = String::new();
    let fin = run_scripted(&mut t, s, 40, &[" f g"], &mut |s| {
        text.push_str(s);
        true
    });
    assert_eq!(fin.stats.done_reason, DoneReason::Stop);
    assert_eq!(text, " e");
    // Up to the token that completed the stop string.
    assert_eq!(&fin.context()[12..], &fin.emitted[..]);
    assert!(fin.log.len() > fin.context().len());
    assert!(w.len() == 8);
}

#[test]
fn end_rules_hold_inside_accepted_runs() {
    let ends = |min_tokens, ignore_eos| sequence::EndRules {
        min_tokens,
        ignore_eos,
        ..Default::default()
    };
    let run = |s: Option<Speculation>, e: sequence::EndRules, max: usize| {
        let mut t = FakeTarget::new(cycle_script(Some(17)));
        let mut st = settings(Some(max), &[]);
        st.ends = e;
        sequence::generate(&mut t, tokenizer(), &prompt(), 0, &st, s, &mut |_| true).unwrap()
    };
    // The drafter proposes the script's EOS: the target's rows must not take it.
    let drafter = || right_k8_eos_after(Some(17));
    // min_tokens: EOS (both ids) masked in every verify row until 10 came,
    // plainly and speculatively alike; then the EOS ends it.
    let plain = run(None, ends(10, false), 50);
    let specd = run(Some(drafter()), ends(10, false), 50);
    assert_eq!(plain.emitted, specd.emitted);
    assert_eq!(plain.emitted.len(), 10);
    assert_eq!(plain.stats.done_reason, DoneReason::Stop);
    assert!(!plain.emitted.iter().any(|t| tokenizer().is_eos(*t)));
    assert!(specd.stats.drafted > 0);
    // ignore_eos: the EOS is an emitted token, to the budget.
    let plain = run(None, ends(0, true), 20);
    let specd = run(Some(drafter()), ends(0, true), 20);
    assert_eq!(plain.emitted, specd.emitted);
    assert_eq!(plain.emitted.len(), 20);
    assert_eq!(plain.stats.done_reason, DoneReason::Length);
    assert!(plain.emitted[5..].iter().all(|&t| t == 2));
    assert!(specd.stats.accepted > 0);
}

/// An acceptance policy that fails: the request goes on plainly.
struct Broken;
impl Acceptance for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    fn decide(&mut self, _: &[Position]) -> Result<Decision, PolicyError> {
        Err(PolicyError::new(
            "broken",
            PolicyErrorKind::Trap,
            "wasm trap: unreachable",
        ))
    }
}

#[test]
fn a_failing_policy_falls_back_to_plain_decoding() {
    let mut t = FakeTarget::new(cycle_script(None));
    let mut s = spec(
        Box::new(ScriptedDrafter {
            wrong_at: 99,
            eos_after: None,
        }),
        "constant",
        r#"{"k":4}"#,
        "greedy",
    );
    s.acceptance = Box::new(Broken);
    let fin = run_scripted(&mut t, s, 20, &[], &mut |_| true);
    let w = words();
    let want: Vec<u32> = (12..32).map(|i| w[i % w.len()]).collect();
    assert_eq!(fin.emitted, want);
    let f = fin.stats.policy_failure.expect("failure reported");
    assert_eq!((f.policy.as_str(), f.kind.as_str()), ("broken", "trap"));
    assert_eq!(fin.stats.accepted, 0);
    assert_eq!(t.snapshot_counts(), (0, 0));
}

/// Proposes tokens sampled from a fixed draft distribution q.
struct SampledDrafter {
    q: Distribution,
}
impl Drafter for SampledDrafter {
    fn name(&self) -> String {
        "sampled".into()
    }
    fn draft_one(&mut self, req: &mut DraftReq<'_>) -> Result<()> {
        let (k, rng) = (req.k, &mut *req.rng);
        let tokens: Vec<u32> = (0..k).map(|_| self.q.sample_with(rng.uniform())).collect();
        let q = tokens
            .iter()
            .map(|_| DraftProb::Dist(self.q.clone()))
            .collect();
        req.draft = Draft {
            tokens,
            q,
            ..Default::default()
        };
        Ok(())
    }
    fn commit(&mut self, _: usize, _: usize, _: usize) -> Result<()> {
        Ok(())
    }
}

fn chi_square(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .map(|(&c, &pi)| (c as f64 - n as f64 * pi).powi(2) / (n as f64 * pi))
        .sum()
}

#[test]
fn rejection_sampling_preserves_the_target_distribution() {
    let ids = [10u32, 11, 12, 13];
    let p = [0.1f64, 0.2, 0.3, 0.4];
    let qv = [0.4f32, 0.3, 0.2, 0.1];
    let vocab = 49152;
    let mut q_probs = vec![0.0f32; vocab];
    for (i, &t) in ids.iter().enumerate() {
        q_probs[t as usize] = qv[i];
    }
    let q = Distribution {
        argmax: ids[0],
        probs: q_probs,
        entropy: 0.0,
        margin: 0.0,
    };
    let logits: Vec<f32> = {
        let mut v = vec![f32::NEG_INFINITY; vocab];
        for (i, &t) in ids.iter().enumerate() {
            v[t as usize] = (p[i] as f32).ln();
        }
        v
    };
    let mut t = FakeTarget::new(Box::new(move |_: &[u32]| logits.clone()));
    let params = SamplingParams {
        temperature: 1.0,
        seed: 1234,
        ..Default::default()
    };
    let s = Speculation {
        drafter: Box::new(SampledDrafter { q }),
        drafter_spec: DrafterSpec::Suffix,
        schedule: native::schedule("constant", r#"{"k":3}"#, None).unwrap(),
        source_schedules: Vec::new(),
        acceptance: native::acceptance("rejection", "{}", vocab as u32).unwrap(),
        draft_max: 3,
    };
    let mut st = SpecState::new(Some(s));
    let mut rng = Rng::new(params.seed);
    let mut log = vec![ids[0]];
    let mut counts = [0u64; 4];
    let mut drafted_counts = [0u64; 4];
    let mut n = 0;
    while n < 24_000 {
        let out = round_alone(
            &mut st,
            &mut t,
            RoundRequest {
                log: &log,
                params: &params,
                rng: &mut rng,
                generated: n,
                budget_left: usize::MAX / 2,
                hidden: None,
            },
        )
        .unwrap();
        for &tok in &out.tokens {
            counts[ids
                .iter()
                .position(|&x| x == tok)
                .expect("only support tokens")] += 1;
        }
        n += out.tokens.len();
        log.extend_from_slice(&out.tokens);
        // Keep the fake's sequence short: the distribution ignores context.
        if log.len() > 64 {
            let keep = log.split_off(log.len() - 1);
            log = keep;
            t.seq = Vec::new();
        }
        let _ = &mut drafted_counts;
    }
    let c = st.counters.clone();
    assert!(
        c.drafted > 0 && c.accepted > 0 && c.accepted < c.drafted,
        "{c:?}"
    );
    let x2 = chi_square(&counts, &p);
    // df = 3: P(X2 > 16.27) = 0.001.
    assert!(x2 < 16.27, "chi-square {x2} for {counts:?} vs {p:?}");
    // And the draft distribution itself is far from p: the test can fail.
    let total: u64 = counts.iter().sum();
    let qcounts: Vec<u64> = qv
        .iter()
        .map(|&x| (x as f64 * total as f64) as u64)
        .collect();
    assert!(chi_square(&qcounts, &p) > 100.0);
}
