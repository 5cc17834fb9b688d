//! The suffix drafter on the real default model: greedy speculation with it
//! gives plain decoding's tokens across prompts, budgets, stop strings and
//! cancellation, it learns from earlier requests of the same tenant only,
//! and its cross-request corpus stays under its bound.
use specd::cache::SuffixCorpus;
use specd::engine::{Engine, Prompt};
use specd::options::{DrafterSpec, SpecOptions};
use specd::sampling::SamplingParams;
use specd::sequence::{DoneReason, Finished};
use specd_tests::{engine, CODE_EDIT, GROUNDED, OPEN, REPETITIVE};
use specd_text::ChatMessage;

struct Run<'a> {
    tenant: &'a str,
    drafter: DrafterSpec,
    schedule: &'a str,
    max_tokens: usize,
    stop: Vec<String>,
    /// Cancel after this many streamed pieces.
    cancel_after: Option<usize>,
}

impl Run<'_> {
    fn plain(max_tokens: usize) -> Run<'static> {
        Run {
            tenant: "",
            drafter: DrafterSpec::None,
            schedule: "constant",
            max_tokens,
            stop: vec![],
            cancel_after: None,
        }
    }

    fn suffix<'a>(tenant: &'a str, schedule: &'a str, max_tokens: usize) -> Run<'a> {
        Run {
            tenant,
            drafter: DrafterSpec::Suffix,
            schedule,
            ..Run::plain(max_tokens)
        }
    }

    fn go(&self, e: &Engine, prompt: &str) -> Finished {
        let ids = e
            .encode(&Prompt::Chat(vec![ChatMessage::user(prompt)]))
            .unwrap();
        let params = SamplingParams::default();
        let opts = SpecOptions {
            drafter: Some(self.drafter.clone()),
            schedule: Some(self.schedule.into()),
            acceptance: Some("greedy".into()),
            ..Default::default()
        };
        let spec = e.speculation_in(self.tenant, &opts, &params).unwrap();
        let settings = e.settings(params, Some(self.max_tokens), self.stop.clone());
        let mut pieces = 0;
        let cancel_after = self.cancel_after;
        let mut sink = |piece: &str| {
            pieces += !piece.is_empty() as usize;
            cancel_after.is_none_or(|n| pieces < n)
        };
        let fin = e.generate(None, &ids, &settings, spec, &mut sink).unwrap();
        assert!(fin.stats.policy_failure.is_none());
        fin
    }
}

#[test]
fn suffix_drafting_is_lossless_and_learns_from_earlier_requests() {
    let e = engine();
    e.clear_caches();
    let prompts: Vec<&str> = GROUNDED
        .iter()
        .chain(&OPEN[..2])
        .chain(&CODE_EDIT[..2])
        .chain(&REPETITIVE[..3])
        .copied()
        .collect();
    let (mut drafted, mut accepted) = (0, 0);
    for (i, p) in prompts.iter().enumerate() {
        let budget = [48, 17, 64][i % 3];
        let plain = Run::plain(budget).go(&e, p);
        for schedule in ["constant", "throughput"] {
            let spec = Run::suffix("t", schedule, budget).go(&e, p);
            assert_eq!(spec.emitted, plain.emitted, "suffix/{schedule} on {p:?}");
            assert_eq!(spec.stats.drafter, "suffix");
            drafted += spec.stats.drafted;
            accepted += spec.stats.accepted;
        }
    }
    assert!(
        accepted > 0 && drafted > 0,
        "suffix drafted {drafted}, accepted {accepted}"
    );

    // The same request again: the tenant's corpus holds its output, so it
    // drafts far more and still gives the same tokens. Another tenant has
    // learned nothing from it.
    let p = REPETITIVE[3];
    let plain = Run::plain(48).go(&e, p);
    let first = Run::suffix("t", "constant", 48).go(&e, p);
    let again = Run::suffix("t", "constant", 48).go(&e, p);
    let stranger = Run::suffix("u", "constant", 48).go(&e, p);
    for f in [&first, &again, &stranger] {
        assert_eq!(f.emitted, plain.emitted);
    }
    assert!(
        again.stats.accepted > first.stats.accepted && again.stats.rounds < first.stats.rounds,
        "the corpus did not help: {} accepted in {} rounds, then {} in {}",
        first.stats.accepted,
        first.stats.rounds,
        again.stats.accepted,
        again.stats.rounds
    );
    assert!(
        stranger.stats.accepted < again.stats.accepted,
        "another tenant drafted from tenant t's output"
    );
    // Cleared with the prefix cache: tenant t starts over like a stranger.
    e.clear_caches();
    let cleared = Run::suffix("t", "constant", 48).go(&e, p);
    assert_eq!(
        (cleared.stats.drafted, cleared.stats.accepted),
        (stranger.stats.drafted, stranger.stats.accepted),
        "clear_caches kept the corpus"
    );
    e.clear_caches();
}

#[test]
fn suffix_drafting_keeps_stop_strings_and_cancellation() {
    let e = engine();
    e.clear_caches();
    let p = GROUNDED[0];
    let full = Run::plain(64).go(&e, p);
    let text = e.tokenizer.decode(&full.emitted);
    // A stop string from the middle of the plain output.
    let words: Vec<&str> = text.split_whitespace().collect();
    let stop = words[words.len() / 2].to_string();
    for tenant in ["s1", "s1"] {
        // The second time, the corpus has the output: rounds run long and
        // the stop string falls inside one.
        let run = |d: DrafterSpec, stop: Vec<String>, cancel_after: Option<usize>| {
            Run {
                stop,
                cancel_after,
                drafter: d,
                ..Run::suffix(tenant, "constant", 64)
            }
            .go(&e, p)
        };
        let with_stop = |d: DrafterSpec| run(d, vec![stop.clone()], None);
        let plain = with_stop(DrafterSpec::None);
        let spec = with_stop(DrafterSpec::Suffix);
        assert_eq!(spec.emitted, plain.emitted, "stop {stop:?}");
        assert_eq!(spec.stats.done_reason, plain.stats.done_reason);
        for n in [1, 3, 7] {
            let cancel = |d: DrafterSpec| run(d, vec![], Some(n));
            let plain = cancel(DrafterSpec::None);
            let spec = cancel(DrafterSpec::Suffix);
            assert_eq!(spec.emitted, plain.emitted, "cancelled after {n} pieces");
            assert_eq!(spec.stats.done_reason, DoneReason::Cancelled);
        }
    }
    e.clear_caches();
}

#[test]
fn the_cross_request_corpus_stays_under_its_bound() {
    let e = engine();
    // 48 KiB for the sequences on top of the keys, which count too.
    let keys = specd::speculation::suffix::space_keys(&e.tokenizer);
    let limit = 4 * keys.len() + 48 * 1024;
    let mut corpus = SuffixCorpus::new(limit);
    corpus.keys_or_init(|| keys);
    let before = std::mem::replace(&mut *e.suffix.lock().unwrap(), corpus);
    let mut most = 0;
    for p in GROUNDED.iter().chain(&REPETITIVE) {
        Run::suffix("bound", "constant", 48).go(&e, p);
        let c = e.suffix.lock().unwrap();
        assert!(
            c.bytes() <= limit,
            "{} bytes over the bound {limit}",
            c.bytes()
        );
        most = most.max(c.sequences());
    }
    let kept = e.suffix.lock().unwrap().sequences();
    assert!(
        most > 0 && kept < GROUNDED.len() + REPETITIVE.len(),
        "nothing was evicted"
    );
    *e.suffix.lock().unwrap() = before;
}

#[test]
fn a_word_matches_with_and_without_its_leading_space() {
    let e = engine();
    let keys = specd::speculation::suffix::space_keys(&e.tokenizer);
    let one = |text: &str| -> u32 {
        let ids = e.tokenizer.encode(text, false).unwrap();
        assert_eq!(ids.len(), 1, "{text:?} is one token: {ids:?}");
        ids[0]
    };
    let (the, space_the) = (one("The"), one(" The"));
    assert_ne!(the, space_the);
    assert_eq!(keys[space_the as usize], the);
    assert_eq!(keys[the as usize], the);
    // A lone space, and control tokens, match only themselves.
    let space = one(" ");
    assert_eq!(keys[space as usize], space);
    for eos in e.tokenizer.eos_ids() {
        assert_eq!(keys[eos as usize], eos);
    }
    assert_eq!(keys.len(), e.tokenizer.vocab_size());
}

#[test]
fn a_word_spelled_in_other_tokens_drafts_from_the_text() {
    use specd::speculation::suffix::TEXT_MATCH_P;
    use specd::speculation::SuffixDrafter;
    use std::sync::{Arc, Mutex};
    let e = engine();
    let tok = e.tokenizer.clone();
    let enc = |t: &str| tok.encode(t, false).unwrap();
    let prompt = enc(
        "Convert this record to JSON: Carla Diaz, 27 years old, lives in Madrid, carla.diaz@example.com.",
    );
    let corpus = || Arc::new(Mutex::new(SuffixCorpus::new(1 << 20)));
    let draft = |text: bool, answer: &str| {
        let mut log = prompt.clone();
        log.extend(enc(answer));
        let mut d = SuffixDrafter::new(corpus(), "");
        if text {
            d = d.with_text(tok.clone());
        }
        d.lookup(&log, 8)
    };
    // After `"` the answer spells the prompt's " Carla" as "Carl" + "a":
    // no token of it matches, its text does. The draft ends with the
    // prompt's clause (", 27 years old" is not what JSON goes on with).
    let name = "{\"name\": \"Carl";
    assert!(draft(false, name).tokens.is_empty(), "tokens alone match");
    let d = draft(true, name);
    assert_eq!(tok.decode(&d.tokens), "a Diaz");
    assert!(d.confidence.iter().all(|&c| c == TEXT_MATCH_P));
    // The e-mail, after `"`: "c" + "arl" against the prompt's " car" + "la".
    let email = "{\"name\": \"Carla Diaz\", \"email\": \"carl";
    assert!(draft(false, email).tokens.is_empty(), "tokens alone match");
    let d = draft(true, email);
    assert_eq!(d.tokens, enc("a.diaz@example.com")[..4].to_vec());
    // A word after a space is spelled as the prompt spells it: a short match
    // that ends inside a longer word is chance, and drafts nothing.
    assert!(draft(true, "The city is Mad").tokens.is_empty());
}
