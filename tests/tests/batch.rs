//! Continuous batching on the real default model: a step over several
//! sequences gives each one bitwise the rows of its forward alone.
use specd::engine::Prompt;
use specd::model::Logits;
use specd::speculation::target::{forward_batch, StepRows};
use specd::speculation::{LlamaTarget, Target};
use specd_tests::engine;
use specd_text::ChatMessage;

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::user(text)])
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// The token after position `at`, or the first one past the end.
fn next_token(ids: &[u32], at: usize) -> u32 {
    *ids.get(at).unwrap_or(&ids[0])
}

#[test]
fn a_batched_step_gives_every_sequence_its_solo_rows_bitwise() {
    let e = engine();
    assert!(e.model.batch_invariant());
    let prompts = [
        "Name three colors of the rainbow.",
        "Write a haiku about the sea, then explain it in one sentence.",
        "2 + 2 =",
        "List the planets of the solar system in order from the sun.",
    ];
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| e.encode(&chat(p)).unwrap())
        .collect();
    // (cached before the step, rows in the step, logits): a decode step,
    // a verify of 5 rows, a fresh prefill chunk, a 3-row verify.
    let plan = [
        (ids[0].len() - 1, 1, Some(Logits::Last)),
        (ids[1].len() - 5, 5, Some(Logits::All)),
        (0, 9, None),
        (ids[3].len() - 3, 3, Some(Logits::All)),
    ];
    let fresh = |i: usize| {
        let mut t = LlamaTarget::new(e.model.clone());
        t.prefill(&ids[i][..plan[i].0]).unwrap();
        t
    };
    // Alone.
    let mut solo = Vec::new();
    let mut solo_next = Vec::new();
    for (i, &(c, n, which)) in plan.iter().enumerate() {
        let mut t = fresh(i);
        let toks = &ids[i][c..c + n];
        match which {
            Some(w) => solo.push(t.forward(toks, w == Logits::All).unwrap()),
            None => {
                t.prefill(toks).unwrap();
                solo.push(Vec::new());
            }
        }
        // The step after it reads what the step left in the caches.
        solo_next.push(t.forward(&[next_token(&ids[i], c + n)], false).unwrap());
    }
    // Together.
    let mut targets: Vec<LlamaTarget> = (0..plan.len()).map(fresh).collect();
    let mut parts: Vec<StepRows<'_>> = targets
        .iter_mut()
        .zip(&plan)
        .zip(&ids)
        .map(|((t, &(c, n, which)), ids)| StepRows {
            target: t,
            tokens: &ids[c..c + n],
            logits: which,
        })
        .collect();
    let batched = forward_batch(&e.model, &mut parts).unwrap();
    drop(parts);
    for (i, t) in targets.iter_mut().enumerate() {
        let (c, n, _) = plan[i];
        assert_eq!(
            t.offset(),
            c + n,
            "sequence {i}'s caches advanced by its rows"
        );
        assert_eq!(batched[i].len(), solo[i].len(), "sequence {i}'s row count");
        assert!(
            bits(&batched[i]) == bits(&solo[i]),
            "sequence {i}: batched rows differ from its solo rows"
        );
        let next = t.forward(&[next_token(&ids[i], c + n)], false).unwrap();
        assert!(
            bits(&next) == bits(&solo_next[i]),
            "sequence {i}: the caches a batched step left differ from its solo ones"
        );
    }
}
