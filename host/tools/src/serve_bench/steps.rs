//! `specd bench serve --steps-only`: the cost of one batched step by its
//! size, against one sequence verifying as many rows and as many lone steps.
use crate::bench::{GROUNDED, OPEN};
use crate::profile::process_cpu_seconds;
use anyhow::Result;
use serde::Serialize;
use specd::engine::{Engine, Prompt};
use std::time::Instant;

/// The cost of one batched step by its size: `n` requests with one row
/// each (plain decode steps, caches of `context` tokens), against one
/// request verifying `n` rows (the same rows, one sequence: what the step
/// would cost without any per-sequence work) and against `n` steps of one
/// request alone, interleaved `iters` times. Where the batched step costs
/// much less than `n` lone ones, batching pays; where it costs much more
/// than the one-sequence verify, per-sequence work (not FLOPs) is the cost.
#[derive(Debug, Clone, Serialize)]
pub struct StepCost {
    pub sequences: usize,
    /// Milliseconds of one batched step of `sequences` rows.
    pub batched_ms: f64,
    /// Milliseconds of one request verifying `sequences` rows.
    pub one_sequence_ms: f64,
    /// Milliseconds of `sequences` one-row forwards, one request at a time.
    pub alone_ms: f64,
    /// CPU milliseconds (all threads) of the same three, where the system
    /// reports them (Linux): on a loaded machine these move much less than
    /// wall time. `None` elsewhere.
    pub batched_cpu_ms: Option<f64>,
    pub one_sequence_cpu_ms: Option<f64>,
    pub alone_cpu_ms: Option<f64>,
    /// The batched step read light (what a plain greedy request's rows
    /// become: each row's argmax and margin, computed on the device in one
    /// `row_top2_list` op for the step), wall and CPU milliseconds.
    pub light_ms: f64,
    pub light_cpu_ms: Option<f64>,
}

/// Wall and CPU seconds of `f`.
fn timed(f: impl FnOnce() -> Result<()>) -> Result<(f64, Option<f64>)> {
    let (c, t) = (process_cpu_seconds(), Instant::now());
    f()?;
    let wall = t.elapsed().as_secs_f64();
    Ok((wall, process_cpu_seconds().zip(c).map(|(b, a)| b - a)))
}

pub fn step_costs(e: &Engine, ns: &[usize], context: usize, iters: usize) -> Result<Vec<StepCost>> {
    use specd::speculation::target::{forward_batch_verify, StepRows};
    use specd::speculation::{LlamaTarget, Target, VerifyMode};
    let text = format!("{}\n\n{}", GROUNDED.join("\n"), OPEN.join("\n"));
    let ids = e.encode(&Prompt::Raw(text))?;
    let max_n = ns.iter().copied().max().unwrap_or(1);
    anyhow::ensure!(ids.len() > max_n + 1, "the step prompt is too short");
    let ctx = context.clamp(1, ids.len() - 1 - max_n);
    let mut out = Vec::new();
    for &n in ns {
        let mut targets: Vec<LlamaTarget> = (0..n)
            .map(|_| {
                let mut t = LlamaTarget::new(e.model.clone());
                t.prefill(&ids[..ctx], None).map(|_| t)
            })
            .collect::<Result<_>>()?;
        // [wall, cpu] of: batched, one sequence, alone, batched light.
        let mut sum = [[0.0f64; 2]; 4];
        let (full, light) = (vec![VerifyMode::Rows; n], vec![VerifyMode::Argmax; n]);
        let mut cpu_known = true;
        for i in 0..iters + 1 {
            let tok = [ids[ctx]];
            // One batched step of every target's token (rows read as
            // `modes` says), then back to the context.
            let batched = |targets: &mut Vec<LlamaTarget>, modes: &[VerifyMode]| {
                let t = timed(|| {
                    let mut parts: Vec<StepRows<'_>> = targets
                        .iter_mut()
                        .map(|target| StepRows {
                            target,
                            tokens: &tok,
                            logits: Some(specd::model::Logits::Last),
                            taps: None,
                        })
                        .collect();
                    forward_batch_verify(&e.model, &mut parts, modes)?;
                    Ok(())
                })?;
                for target in targets.iter_mut() {
                    target.rewind(ctx)?;
                }
                anyhow::Ok(t)
            };
            let b = batched(&mut targets, &full)?;
            let v = timed(|| {
                targets[0].forward(&ids[ctx..ctx + n], true)?;
                Ok(())
            })?;
            targets[0].rewind(ctx)?;
            let a = timed(|| {
                for target in targets.iter_mut() {
                    target.forward(&tok, false)?;
                    target.rewind(ctx)?;
                }
                Ok(())
            })?;
            let l = batched(&mut targets, &light)?;
            // The first round warms up.
            if i > 0 {
                for (s, (wall, cpu)) in sum.iter_mut().zip([b, v, a, l]) {
                    s[0] += wall;
                    s[1] += cpu.unwrap_or(0.0);
                    cpu_known &= cpu.is_some();
                }
            }
        }
        let ms = |x: f64| 1e3 * x / iters as f64;
        let cpu = |k: usize| cpu_known.then(|| ms(sum[k][1]));
        out.push(StepCost {
            sequences: n,
            batched_ms: ms(sum[0][0]),
            one_sequence_ms: ms(sum[1][0]),
            alone_ms: ms(sum[2][0]),
            batched_cpu_ms: cpu(0),
            one_sequence_cpu_ms: cpu(1),
            alone_cpu_ms: cpu(2),
            light_ms: ms(sum[3][0]),
            light_cpu_ms: cpu(3),
        });
    }
    Ok(out)
}

/// The step costs as a table: wall milliseconds, then CPU milliseconds
/// where known. `gain`: N lone steps over one batched step; `per-seq`:
/// the batched step over one sequence verifying the same number of rows;
/// `light`: the batched step with light readback, and the full one over it.
pub fn step_table(costs: &[StepCost]) -> String {
    let mut s = format!(
        "{:>4} {:>11} {:>11} {:>11} {:>7} {:>8}   {:>8} {:>8} {:>8} {:>7} {:>8}   {:>8} {:>7} {:>8} {:>7}\n",
        "N",
        "batched ms",
        "1-seq ms",
        "alone ms",
        "gain",
        "per-seq",
        "b cpu",
        "1s cpu",
        "a cpu",
        "gain",
        "per-seq",
        "light ms",
        "x",
        "l cpu",
        "x"
    );
    let ratio = |a: f64, b: f64| a / b.max(1e-9);
    for c in costs {
        s += &format!(
            "{:>4} {:>11.2} {:>11.2} {:>11.2} {:>7.2} {:>8.2}",
            c.sequences,
            c.batched_ms,
            c.one_sequence_ms,
            c.alone_ms,
            ratio(c.alone_ms, c.batched_ms),
            ratio(c.batched_ms, c.one_sequence_ms),
        );
        if let (Some(b), Some(v), Some(a)) =
            (c.batched_cpu_ms, c.one_sequence_cpu_ms, c.alone_cpu_ms)
        {
            s += &format!(
                "   {:>8.2} {:>8.2} {:>8.2} {:>7.2} {:>8.2}",
                b,
                v,
                a,
                ratio(a, b),
                ratio(b, v)
            );
        }
        s += &format!(
            "   {:>8.2} {:>7.2}",
            c.light_ms,
            ratio(c.batched_ms, c.light_ms)
        );
        if let (Some(b), Some(l)) = (c.batched_cpu_ms, c.light_cpu_ms) {
            s += &format!(" {:>8.2} {:>7.2}", l, ratio(b, l));
        }
        s += "\n";
    }
    s
}
