//! What a light round's reduction costs, measured where it runs: the same
//! k-row verify forward of the default model (int8), then each row's argmax
//! and margin taken three ways, alternated so that load on the machine hits
//! all three alike:
//! - `host`: every row copied back, `argmax_margin` on the host (what full
//!   rounds read);
//! - `row_top2`: the one-pass kernel, four floats a row copied back (what
//!   light rounds do);
//! - `ops`: MLX's argmax, max and masked maxes (the light round before the
//!   kernel).
//!
//! A `whole` sample runs from building the forward to dropping its arrays;
//! a `reduction` sample evaluates the forward first, untimed, then times the
//! rest (robust to the forward's noise on a busy machine, but one sync more
//! for the device ways). Prints, per row count, the paired median of each
//! way minus `host`, both kinds.
//! `cargo run --release -p specd-tests --example light_reduction [iters]`
use specd::engine::Prompt;
use specd::model::Logits;
use specd::sampling::argmax_margin;
use specd::speculation::{LlamaTarget, Target};
use specd_mlx::{kernels, ops, Array, Dtype};
use specd_tests::{int8_engine, GROUNDED};
use specd_text::ChatMessage;
use std::time::Instant;

/// The light round's former statistics: 8 MLX ops, each a pass.
fn by_ops(logits: &Array) -> specd_mlx::Result<Array> {
    let (n, vocab) = (logits.dim(0), logits.dim(1));
    let argmax = ops::argmax(logits, -1, false)?.reshape(&[n, 1])?;
    let at = ops::equal(&Array::arange(0, vocab)?.reshape(&[1, vocab])?, &argmax)?;
    let ninf = Array::scalar(f32::NEG_INFINITY)?;
    let top = ops::max(logits, -1, true)?;
    let second = ops::max(&ops::r#where(&at, &ninf, logits)?, -1, true)?;
    let own = ops::max(&ops::r#where(&at, logits, &ninf)?, -1, true)?;
    let index = argmax.as_type(Dtype::Float32)?;
    ops::concatenate(&[&index, &top, &second, &own], 1)
}

/// One sample of `way`: milliseconds and each row's argmax.
fn sample(
    t: &mut LlamaTarget,
    rows: &[u32],
    way: usize,
    reduction: bool,
) -> anyhow::Result<(f64, Vec<u32>)> {
    let mut start = Instant::now();
    let l = specd_tests::forward(&t.model, rows, &mut t.caches, Logits::All);
    if reduction {
        l.eval()?;
        start = Instant::now();
    }
    let vocab = l.dim(1) as usize;
    let argmax = if way == 0 {
        l.eval()?;
        l.to_vec_f32()?
            .chunks(vocab)
            .map(|r| argmax_margin(r).0)
            .collect()
    } else {
        let s = if way == 1 {
            kernels::row_top2(&l)?
        } else {
            by_ops(&l)?
        };
        specd_mlx::eval(&[&s, &l])?;
        s.to_vec_f32()?.chunks(4).map(|r| r[0] as u32).collect()
    };
    drop(l);
    Ok((start.elapsed().as_secs_f64() * 1e3, argmax))
}

fn main() -> anyhow::Result<()> {
    let iters: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(100);
    let (model, ids) = {
        let e = int8_engine();
        let ids = e.encode(&Prompt::Chat(vec![ChatMessage::user(GROUNDED[1])]))?;
        (e.model.clone(), ids)
    };
    println!("(paired medians of {iters})");
    println!("sample      rows   host ms   row_top2 - host   ops - host");
    for (k, reduction) in [2usize, 5, 9]
        .into_iter()
        .flat_map(|k| [(k, false), (k, true)])
    {
        let (head, rows) = ids.split_at(ids.len() - k);
        let mut t = LlamaTarget::new(model.clone());
        t.prefill(head, None)?;
        let base = t.offset();
        let mut ms = [vec![], vec![], vec![]];
        for i in 0..iters {
            let mut argmax = Vec::new();
            for j in 0..3 {
                let way = (i + j) % 3;
                let (m, a) = sample(&mut t, rows, way, reduction)?;
                t.rewind(base)?;
                ms[way].push(m);
                argmax.push(a);
            }
            anyhow::ensure!(
                argmax.windows(2).all(|w| w[0] == w[1]),
                "the three ways disagree"
            );
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let minus = |w: usize| median(ms[w].iter().zip(&ms[0]).map(|(a, b)| a - b).collect());
        println!(
            "{:<10} {k:>5} {:>9.3} {:>+17.3} {:>+12.3}",
            if reduction { "reduction" } else { "whole" },
            median(ms[0].clone()),
            minus(1),
            minus(2)
        );
    }
    Ok(())
}
