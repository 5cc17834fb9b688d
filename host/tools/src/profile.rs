//! `specd profile`: where the milliseconds of one decode step go. Each part
//! of a layer is evaluated on its own (forcing a sync), so the parts add up
//! to more than a fused step; the gap between the two is what per-op
//! dispatch and graph construction cost — the target of the decode-speed work.
use anyhow::Result;
use specd::cache::LayerCache;
use specd::model::llama::{ids, Outputs, Seq, Want};
use specd::model::{Linear, Llama};
use specd::sampling::{distribution, SamplingParams};
use specd_mlx::{kernels, Array};
use std::time::Instant;

#[derive(Debug, Default, Clone)]
pub struct Profile {
    /// Weight path and kernels, e.g. `quantized, batch-invariant, avx512 x2`.
    pub path: String,
    pub step_ms: f64,
    /// Of a whole step: building the lazy graph (host side, before eval).
    pub build_ms: f64,
    /// A whole step whose rows are reduced on the device to what a greedy
    /// light round reads (argmax and top-2, [`kernels::row_top2_list`]),
    /// with only those numbers copied back: what a verify costs a round.
    pub light_step_ms: f64,
    pub parts: Vec<(String, f64)>,
    /// CPU ms of the process per part, in `parts`' order (threads spinning
    /// for work included): on a shared machine wall time counts others'
    /// work too; with `SPECD_THREADS=1` this is the part's own work.
    pub cpu: Vec<f64>,
}

/// Adds `ms` (and `cpu_ms`) to part `name`, keeping parts in first-seen
/// order.
fn add_part(parts: &mut Vec<(String, f64)>, cpu: &mut Vec<f64>, name: &str, ms: f64, cpu_ms: f64) {
    match parts.iter().position(|(n, _)| n == name) {
        Some(i) => {
            parts[i].1 += ms;
            cpu[i] += cpu_ms;
        }
        None => {
            parts.push((name.to_string(), ms));
            cpu.push(cpu_ms);
        }
    }
}

/// CPU seconds this process's threads have run so far, all of them
/// (`CLOCK_PROCESS_CPUTIME_ID`); `None` where the clock is unavailable.
pub(crate) fn process_cpu_seconds() -> Option<f64> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) } != 0 {
        return None;
    }
    Some(t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9)
}

/// [`process_cpu_seconds`] in ms (0 where unknown).
fn cpu_ms() -> f64 {
    process_cpu_seconds().unwrap_or(0.0) * 1e3
}

/// `toks` of one sequence with these caches: a batch of one.
fn alone<'a>(caches: &'a mut [Box<dyn LayerCache>], toks: &[u32]) -> [Seq<'a>; 1] {
    [Seq {
        caches,
        rows: toks.len() as i32,
        logits: None,
    }]
}

/// Profiles `steps` forwards of `rows` new tokens each (1: a plain decode
/// step; more: a speculative verify, every row's logits) after a
/// `context`-token prefill.
pub fn profile(m: &Llama, context: usize, steps: usize, rows: usize) -> Result<Profile> {
    let prompt: Vec<u32> = (0..context as u32)
        .map(|i| 100 + (i * 37) % 20000)
        .collect();
    let mut caches = m.new_caches();
    let all = 0..m.layer_count();
    let x = m.embed(&ids(&prompt)?)?;
    m.layers(
        all.clone(),
        x,
        &mut alone(&mut caches, &prompt),
        &mut Outputs::none(),
    )?;
    let state: Vec<&Array> = caches.iter().flat_map(|c| c.state()).collect();
    specd_mlx::eval(&state)?;
    let params = SamplingParams::default();
    let toks: Vec<u32> = (0..rows.max(1) as u32).map(|i| 200 + i).collect();
    let which = if toks.len() > 1 {
        specd::model::Logits::All
    } else {
        specd::model::Logits::Last
    };
    let want = [Want {
        rows: toks.len() as i32,
        logits: Some(which),
    }];

    // Whole steps, each read back by `read`: the mean ms of a step and of
    // building its graph, after two warm-up steps.
    let rewind = |caches: &mut Vec<Box<dyn LayerCache>>| {
        for ch in caches.iter_mut() {
            ch.rewind(context);
        }
    };
    let mut whole_steps = |read: &dyn Fn(Array) -> Result<()>| -> Result<(f64, f64)> {
        let (mut step_ms, mut build_ms) = (0.0, 0.0);
        for i in 0..steps + 2 {
            rewind(&mut caches);
            let t = Instant::now();
            let mut out = Outputs::none();
            let x = m.embed(&ids(&toks)?)?;
            let x = m.layers(all.clone(), x, &mut alone(&mut caches, &toks), &mut out)?;
            let lazy = m.unembed(&x, &want, &mut out)?.logits()?;
            let built = t.elapsed().as_secs_f64() * 1e3;
            read(lazy)?;
            if i >= 2 {
                step_ms += t.elapsed().as_secs_f64() * 1e3;
                build_ms += built;
            }
        }
        Ok((step_ms / steps as f64, build_ms / steps as f64))
    };
    let (step_ms, build_ms) = whole_steps(&|lazy| {
        let l = lazy.to_vec_f32()?;
        for row in l.chunks(l.len() / toks.len().max(1)) {
            let _ = distribution(row, &params, &prompt);
        }
        Ok(())
    })?;
    let (light_step_ms, _) = whole_steps(&|lazy| {
        kernels::row_top2_list(&[&lazy])?.to_vec_f32()?;
        Ok(())
    })?;

    // Part by part: the model's own forward, evaluated and timed at every
    // part boundary it reports.
    let mut parts: Vec<(String, f64)> = Vec::new();
    let mut cpu: Vec<f64> = Vec::new();
    for _ in 0..steps {
        rewind(&mut caches);
        let (mut last, mut last_cpu) = (Instant::now(), cpu_ms());
        let mut probe = |name: &'static str, outs: &[&Array]| -> specd_mlx::Result<()> {
            specd_mlx::eval(outs)?;
            let (now, now_cpu) = (Instant::now(), cpu_ms());
            let ms = (now - last).as_secs_f64() * 1e3;
            add_part(&mut parts, &mut cpu, name, ms, now_cpu - last_cpu);
            (last, last_cpu) = (now, now_cpu);
            Ok(())
        };
        let x = m.embed(&ids(&toks)?)?;
        probe("embedding", &[&x])?;
        let mut out = Outputs::probed(&mut probe);
        let h = m.layers(all.clone(), x, &mut alone(&mut caches, &toks), &mut out)?;
        let logits = m.unembed(&h, &want, &mut out)?.logits()?;
        drop(out);
        let (t0, c0) = (Instant::now(), cpu_ms());
        let l = logits.to_vec_f32()?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        add_part(&mut parts, &mut cpu, "logits to host", ms, cpu_ms() - c0);
        let (t0, c0) = (Instant::now(), cpu_ms());
        for row in l.chunks(l.len() / toks.len().max(1)) {
            let _ = distribution(row, &params, &prompt);
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        add_part(&mut parts, &mut cpu, "sampling (host)", ms, cpu_ms() - c0);
    }
    for p in &mut parts {
        p.1 /= steps as f64;
    }
    for c in &mut cpu {
        *c /= steps as f64;
    }
    let quantized = m.layers.iter().any(|l| l.q.is_quantized());
    let int8 = m
        .layers
        .iter()
        .any(|l| matches!(&l.o, Linear::Quantized(q) if q.int8_activations));
    let path = format!(
        "{}{}, kernels {} x{} threads",
        match (quantized, int8) {
            (true, true) => "int8",
            (true, false) => "quantized",
            _ => "f32",
        },
        if m.batch_invariant() {
            ", batch-invariant"
        } else {
            ""
        },
        kernels::isa(),
        kernels::threads()
    );
    Ok(Profile {
        path,
        step_ms,
        build_ms,
        light_step_ms,
        parts,
        cpu,
    })
}

pub fn report(p: &Profile) -> String {
    let sum: f64 = p.parts.iter().map(|(_, v)| v).sum();
    let mut s = format!("weights: {}\n", p.path);
    let cpu_sum: f64 = p.cpu.iter().sum();
    s += &format!(
        "{:<28} {:>9} {:>7} {:>9}\n",
        "part (evaluated alone)", "ms/step", "share", "cpu ms"
    );
    for ((n, v), c) in p.parts.iter().zip(&p.cpu) {
        s += &format!(
            "{:<28} {:>9.3} {:>6.1}% {:>9.3}\n",
            n,
            v,
            100.0 * v / sum.max(1e-9),
            c
        );
    }
    s += &format!(
        "{:<28} {:>9.3} {:>7} {:>9.3}\n",
        "sum of parts", sum, "", cpu_sum
    );
    s += &format!(
        "{:<28} {:>9.3}   ({:.1} tok/s)\n",
        "one whole step",
        p.step_ms,
        1e3 / p.step_ms
    );
    s += &format!(
        "{:<28} {:>9.3}   (host side; plain greedy decoding overlaps it with the previous step)\n",
        "  of which graph building", p.build_ms
    );
    s += &format!(
        "{:<28} {:>9.3}   (rows' argmax and top-2 on the device, as a greedy light round reads them)\n",
        "one whole step, light", p.light_step_ms
    );
    let ratio = 100.0 * p.step_ms / sum.max(1e-9);
    s += &if ratio < 100.0 {
        format!("a whole step costs {ratio:.0}% of its parts run one by one: the rest of the parts' time is per-op sync and dispatch\n")
    } else {
        format!("a whole step costs {ratio:.0}% of its parts run one by one: the parts' own syncs cost less than dispatching the whole graph\n")
    };
    s
}
