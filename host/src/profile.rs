//! `specd profile`: where the milliseconds of one decode step go. Each part
//! of a layer is evaluated on its own (forcing a sync), so the parts add up
//! to more than a fused step; the gap between the two is what per-op
//! dispatch and graph construction cost — the target of the decode-speed work.
use crate::cache::LayerCache;
use crate::model::Llama;
use crate::sampling::{distribution, SamplingParams};
use anyhow::Result;
use specd_mlx::{ops, Array};
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

fn timed(acc: &mut f64, f: impl FnOnce() -> specd_mlx::Result<Array>) -> Result<Array> {
    let t = Instant::now();
    let a = f()?;
    a.eval()?;
    *acc += t.elapsed().as_secs_f64() * 1e3;
    Ok(a)
}

/// Profiles `steps` decode steps after a `context`-token prefill.
pub fn profile(m: &Llama, context: usize, steps: usize) -> Result<Profile> {
    let c = &m.config;
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

    // Part by part.
    let names = [
        "embedding",
        "attn norm",
        "q/k/v matmuls",
        "rope + cache",
        "attention (sdpa)",
        "o matmul + residual",
        "ffn norm",
        "gate/up matmuls",
        "silu * up",
        "down matmul + residual",
        "final norm",
        "lm head",
        "logits to host",
        "sampling (host)",
    ];
    let mut acc = vec![0.0f64; names.len()];
    let (nh, nkv, hd) = (
        c.num_attention_heads as i32,
        c.num_key_value_heads as i32,
        c.head_dim as i32,
    );
    let d = c.hidden_size as i32;
    for _ in 0..steps {
        rewind(&mut caches);
        let ids = Array::from_u32(&[tok], &[1])?;
        let mut x = timed(&mut acc[0], || m.embed.rows(&ids)?.reshape(&[1, 1, d]))?;
        for (l, cache) in m.layers.iter().zip(caches.iter_mut()) {
            let h = timed(&mut acc[1], || m.rms_norm(&x, &l.attn_norm))?;
            let t0 = Instant::now();
            let q = l.q.forward(&h)?;
            let k = l.k.forward(&h)?;
            let v = l.v.forward(&h)?;
            specd_mlx::eval(&[&q, &k, &v])?;
            acc[2] += t0.elapsed().as_secs_f64() * 1e3;
            let t0 = Instant::now();
            let off = cache.offset() as i32;
            let q = m.rope_heads(&q, nh, off)?;
            let k = m.rope_heads(&k, nkv, off)?;
            let v = v.reshape(&[1, 1, nkv, hd])?.transpose(&[0, 2, 1, 3])?;
            let (k, v) = cache.update(&k, &v)?;
            specd_mlx::eval(&[&q, &k, &v])?;
            acc[3] += t0.elapsed().as_secs_f64() * 1e3;
            let o = timed(&mut acc[4], || m.attention(&q, &k, &v))?;
            x = timed(&mut acc[5], || ops::add(&x, &l.o.forward(&o)?))?;
            let h = timed(&mut acc[6], || m.rms_norm(&x, &l.ffn_norm))?;
            let t0 = Instant::now();
            let g = l.gate.forward(&h)?;
            let u = l.up.forward(&h)?;
            specd_mlx::eval(&[&g, &u])?;
            acc[7] += t0.elapsed().as_secs_f64() * 1e3;
            let gu = timed(&mut acc[8], || m.swiglu(&g, &u))?;
            x = timed(&mut acc[9], || ops::add(&x, &l.down.forward(&gu)?))?;
        }
        let h = timed(&mut acc[10], || m.rms_norm(&x.reshape(&[1, d])?, &m.norm))?;
        let logits = timed(&mut acc[11], || {
            m.lm_head.as_ref().unwrap_or(&m.embed).forward(&h)
        })?;
        let t0 = Instant::now();
        let l = logits.to_vec_f32()?;
        acc[12] += t0.elapsed().as_secs_f64() * 1e3;
        let t0 = Instant::now();
        let _ = distribution(&l, &params, &prompt);
        acc[13] += t0.elapsed().as_secs_f64() * 1e3;
    }
    let parts = names
        .iter()
        .zip(acc)
        .map(|(n, a)| (n.to_string(), a / steps as f64))
        .collect();
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
        "{:<26} {:>9.3}   (host side, overlaps nothing)\n",
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
