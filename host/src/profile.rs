//! `specd profile`: where the milliseconds of one decode step go. Each part
//! of a layer is evaluated on its own (forcing a sync), so the parts add up
//! to more than a fused step; the gap between the two is what per-op
//! dispatch and graph construction cost — the target of the decode-speed work.
use crate::cache::LayerCache;
use crate::model::Llama;
use crate::sampling::{distribution, SamplingParams};
use anyhow::Result;
use specd_mlx::Array;
use std::time::Instant;

#[derive(Debug, Default, Clone)]
pub struct Profile {
    /// Weight path and kernels, e.g. `quantized, batch-invariant, avx512 x2`.
    pub path: String,
    pub step_ms: f64,
    /// Of a whole step: building the lazy graph (host side, before eval).
    pub build_ms: f64,
    pub parts: Vec<(String, f64)>,
}

/// Adds `ms` to part `name`, keeping parts in first-seen order.
fn add_part(parts: &mut Vec<(String, f64)>, name: &str, ms: f64) {
    match parts.iter_mut().find(|(n, _)| n == name) {
        Some(p) => p.1 += ms,
        None => parts.push((name.to_string(), ms)),
    }
}

/// Profiles `steps` decode steps after a `context`-token prefill.
pub fn profile(m: &Llama, context: usize, steps: usize) -> Result<Profile> {
    let prompt: Vec<u32> = (0..context as u32)
        .map(|i| 100 + (i * 37) % 20000)
        .collect();
    let mut caches = m.new_caches();
    let _ = m.hidden(&prompt, &mut caches, m.layers.len())?;
    let state: Vec<&Array> = caches.iter().flat_map(|c| c.state()).collect();
    specd_mlx::eval(&state)?;
    let params = SamplingParams::default();
    let tok = 200u32;

    // Whole steps.
    let rewind = |caches: &mut Vec<Box<dyn LayerCache>>| {
        for ch in caches.iter_mut() {
            ch.rewind(context);
        }
    };
    let (mut step_ms, mut build_ms) = (0.0, 0.0);
    for i in 0..steps + 2 {
        rewind(&mut caches);
        let t = Instant::now();
        let lazy = m.forward(&[tok], &mut caches, crate::model::Logits::Last)?;
        let built = t.elapsed().as_secs_f64() * 1e3;
        let l = lazy.to_vec_f32()?;
        let _ = distribution(&l, &params, &prompt);
        if i >= 2 {
            step_ms += t.elapsed().as_secs_f64() * 1e3;
            build_ms += built;
        }
    }
    step_ms /= steps as f64;
    build_ms /= steps as f64;

    // Part by part: the model's own forward, evaluated and timed at every
    // part boundary it reports.
    let mut parts: Vec<(String, f64)> = Vec::new();
    for _ in 0..steps {
        rewind(&mut caches);
        let mut last = Instant::now();
        let mut probe = |name: &'static str, outs: &[&Array]| -> specd_mlx::Result<()> {
            specd_mlx::eval(outs)?;
            let now = Instant::now();
            add_part(&mut parts, name, (now - last).as_secs_f64() * 1e3);
            last = now;
            Ok(())
        };
        let h = m.hidden_probed(&[tok], &mut caches, m.layers.len(), &mut probe)?;
        let logits = m.head_probed(&h, crate::model::Logits::Last, &mut probe)?;
        let t0 = Instant::now();
        let l = logits.to_vec_f32()?;
        add_part(
            &mut parts,
            "logits to host",
            t0.elapsed().as_secs_f64() * 1e3,
        );
        let t0 = Instant::now();
        let _ = distribution(&l, &params, &prompt);
        add_part(
            &mut parts,
            "sampling (host)",
            t0.elapsed().as_secs_f64() * 1e3,
        );
    }
    for p in &mut parts {
        p.1 /= steps as f64;
    }
    let quantized = m.layers.iter().any(|l| l.q.is_quantized());
    let path = format!(
        "{}{}, kernels {} x{} threads",
        if quantized { "quantized" } else { "f32" },
        if m.batch_invariant() {
            ", batch-invariant"
        } else {
            ""
        },
        specd_mlx::kernels::isa(),
        specd_mlx::kernels::threads()
    );
    Ok(Profile {
        path,
        step_ms,
        build_ms,
        parts,
    })
}

pub fn report(p: &Profile) -> String {
    let sum: f64 = p.parts.iter().map(|(_, v)| v).sum();
    let mut s = format!("weights: {}\n", p.path);
    s += &format!(
        "{:<26} {:>9} {:>7}\n",
        "part (evaluated alone)", "ms/step", "share"
    );
    for (n, v) in &p.parts {
        s += &format!("{:<26} {:>9.3} {:>6.1}%\n", n, v, 100.0 * v / sum.max(1e-9));
    }
    s += &format!("{:<26} {:>9.3}\n", "sum of parts", sum);
    s += &format!(
        "{:<26} {:>9.3}   ({:.1} tok/s)\n",
        "one whole step",
        p.step_ms,
        1e3 / p.step_ms
    );
    s += &format!(
        "{:<26} {:>9.3}   (host side; plain greedy decoding overlaps it with the previous step)\n",
        "  of which graph building", p.build_ms
    );
    let ratio = 100.0 * p.step_ms / sum.max(1e-9);
    s += &if ratio < 100.0 {
        format!("a whole step costs {ratio:.0}% of its parts run one by one: the rest of the parts' time is per-op sync and dispatch\n")
    } else {
        format!("a whole step costs {ratio:.0}% of its parts run one by one: the parts' own syncs cost less than dispatching the whole graph\n")
    };
    s
}
