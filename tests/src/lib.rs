//! Shared helpers of the end-to-end tests: the real default model, loaded
//! once per test process (tests take turns through a mutex; MLX runs one
//! graph at a time).
use specd::engine::Engine;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The default model file, where `specd pull` puts it (fetched when
/// missing); tests fail, never skip, when it cannot be had.
pub fn default_model_path() -> PathBuf {
    specd::store::default_model().expect("the default model (specd pull)")
}

pub fn engine() -> MutexGuard<'static, Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    default_model_engine(&E, specd::model::WeightMode::default())
}

/// The default model with 8-bit activations (`--weights int8`).
pub fn int8_engine() -> MutexGuard<'static, Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    default_model_engine(&E, specd::model::WeightMode::Int8)
}

/// The default model with 16-bit KV caches (`--kv-f16 on`).
pub fn f16_kv_engine() -> MutexGuard<'static, Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    let switches = specd::load::Switches {
        kv_f16: true,
        ..Default::default()
    };
    let m = E.get_or_init(|| Mutex::new(load_default(Default::default(), switches)));
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The default model, its weights held as `mode`, running `switches`.
pub fn load_default(mode: specd::model::WeightMode, switches: specd::load::Switches) -> Engine {
    let policies = specd::cli::policy_host(None).expect("policy host");
    Engine::load(
        "smollm2:135m",
        &default_model_path(),
        policies,
        mode,
        switches,
    )
    .expect("load the default model")
}

fn default_model_engine(
    cell: &'static OnceLock<Mutex<Engine>>,
    mode: specd::model::WeightMode,
) -> MutexGuard<'static, Engine> {
    let m = cell.get_or_init(|| Mutex::new(load_default(mode, Default::default())));
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Gemma 3 270M (the second model family: K-quants, sliding-window layers),
/// fetched like the default model; loaded once per test process.
pub fn gemma_engine() -> MutexGuard<'static, Engine> {
    static E: OnceLock<Mutex<Engine>> = OnceLock::new();
    let m = E.get_or_init(|| {
        let path =
            specd::store::known_model(specd::store::GEMMA_MODEL).expect("gemma3:270m (specd pull)");
        let policies = specd::cli::policy_host(None).expect("policy host");
        Mutex::new(
            Engine::load(
                specd::store::GEMMA_MODEL,
                &path,
                policies,
                specd::model::WeightMode::default(),
                specd::load::Switches::default(),
            )
            .expect("load gemma3:270m"),
        )
    });
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The prompt suites of `specd bench spec`: input-grounded (repeat, edit,
/// summarize a given text), open-ended chat, code editing, and one task
/// type over several requests.
pub use specd_tools::bench::{CODE_EDIT, GROUNDED, OPEN, REPETITIVE};

/// Logits rows as their bit patterns (compared exactly).
pub fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// What sequence `i` of a batched step must show against its solo run:
/// caches advanced to `offset`, bitwise its solo rows, and caches from
/// which the next step (`next_token`) reads bitwise as after the solo run
/// (`solo_next`).
pub fn assert_step_as_solo(
    i: usize,
    t: &mut specd::speculation::LlamaTarget,
    offset: usize,
    batched: &[Vec<f32>],
    solo: &[Vec<f32>],
    next_token: u32,
    solo_next: &[Vec<f32>],
) {
    use specd::speculation::Target;
    assert_eq!(
        t.offset(),
        offset,
        "sequence {i}'s caches advanced by its rows"
    );
    assert_eq!(batched.len(), solo.len(), "sequence {i}'s row count");
    assert!(
        bits(batched) == bits(solo),
        "sequence {i}: batched rows differ from its solo rows"
    );
    let next = t.forward(&[next_token], false).unwrap();
    assert!(
        bits(&next) == bits(solo_next),
        "sequence {i}: the caches a batched step left differ from its solo ones"
    );
}

/// A batched step planned per sequence as (tokens cached before it, rows
/// in it, logits wanted), sequence `i` reading `ids` from `start(i)`: each
/// gets bitwise the rows and caches of its solo run
/// ([`assert_step_as_solo`]). A plan without logits is a prefill.
pub fn assert_batch_as_solo(
    model: &std::sync::Arc<specd::model::ranks::Pipeline>,
    ids: &[u32],
    plan: &[(usize, usize, Option<specd::model::Logits>)],
    start: impl Fn(usize) -> usize,
) {
    use specd::model::Logits;
    use specd::speculation::target::{forward_batch, StepRows};
    use specd::speculation::{LlamaTarget, Target};
    let seq = |i: usize| &ids[start(i)..];
    let fresh = |i: usize| {
        let mut t = LlamaTarget::new(model.clone());
        if plan[i].0 > 0 {
            t.prefill(&seq(i)[..plan[i].0], None).unwrap();
        }
        t
    };
    let rows = |i: usize| &seq(i)[plan[i].0..plan[i].0 + plan[i].1];
    let next = |i: usize| seq(i)[plan[i].0 + plan[i].1];
    let (mut solo, mut solo_next) = (Vec::new(), Vec::new());
    for (i, &(_, _, which)) in plan.iter().enumerate() {
        let mut t = fresh(i);
        match which {
            Some(w) => solo.push(t.forward(rows(i), w == Logits::All).unwrap()),
            None => {
                t.prefill(rows(i), None).unwrap();
                solo.push(Vec::new());
            }
        }
        solo_next.push(t.forward(&[next(i)], false).unwrap());
    }
    let mut targets: Vec<LlamaTarget> = (0..plan.len()).map(fresh).collect();
    let mut parts: Vec<StepRows<'_>> = targets
        .iter_mut()
        .enumerate()
        .map(|(i, t)| StepRows {
            target: t,
            tokens: rows(i),
            logits: plan[i].2,
            taps: None,
        })
        .collect();
    let batched = forward_batch(model, &mut parts).unwrap();
    drop(parts);
    for (i, t) in targets.iter_mut().enumerate() {
        let (c, n, _) = plan[i];
        assert_step_as_solo(i, t, c + n, &batched[i], &solo[i], next(i), &solo_next[i]);
    }
}

/// The chi-square statistic of a 2 x C table (two samples' counts over the
/// same categories) and its degrees of freedom. Categories are the tokens
/// both samples together drew at least `min` times; the rest are pooled.
pub fn chi_square(a: &[u32], b: &[u32], min: usize) -> (f64, usize) {
    use std::collections::BTreeMap;
    let mut counts: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    for &t in a {
        counts.entry(t).or_default().0 += 1.0;
    }
    for &t in b {
        counts.entry(t).or_default().1 += 1.0;
    }
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut rest = (0.0, 0.0);
    for (_, (x, y)) in counts {
        if x + y >= min as f64 {
            cells.push((x, y));
        } else {
            rest.0 += x;
            rest.1 += y;
        }
    }
    if rest.0 + rest.1 > 0.0 {
        cells.push(rest);
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let n = na + nb;
    let stat = cells
        .iter()
        .map(|&(x, y)| {
            let col = x + y;
            let (ea, eb) = (col * na / n, col * nb / n);
            (x - ea).powi(2) / ea + (y - eb).powi(2) / eb
        })
        .sum();
    (stat, cells.len().saturating_sub(1))
}

/// The chi-square critical value at significance 0.001 (Wilson-Hilferty:
/// within 3% of the exact quantile for df >= 2, above it at small df).
pub fn chi_square_critical_001(df: usize) -> f64 {
    let d = df.max(1) as f64;
    let z = 3.090; // standard normal quantile of 0.999
    let c = 2.0 / (9.0 * d);
    d * (1.0 - c + z * c.sqrt()).powi(3)
}

/// One forward of `toks` alone after what `caches` hold, through every
/// layer (a batch of one: embed, layers, unembed): the `which` rows'
/// logits.
pub fn forward(
    m: &specd::model::Llama,
    toks: &[u32],
    caches: &mut [Box<dyn specd::cache::LayerCache>],
    which: specd::model::Logits,
) -> specd_mlx::Array {
    let mut out = specd::model::Outputs::none();
    let h = hidden(m, toks, caches, &mut out);
    let want = specd::model::Want {
        rows: toks.len() as i32,
        logits: Some(which),
    };
    m.unembed(&h, &[want], &mut out)
        .and_then(|u| u.logits())
        .expect("unembed")
}

/// The last layer's rows `[1, T, hidden]` of `toks` alone after what
/// `caches` hold, with `out`'s taps and probe.
pub fn hidden(
    m: &specd::model::Llama,
    toks: &[u32],
    caches: &mut [Box<dyn specd::cache::LayerCache>],
    out: &mut specd::model::Outputs<'_>,
) -> specd_mlx::Array {
    let mut seq = [specd::model::Seq {
        caches,
        rows: toks.len() as i32,
        logits: None,
    }];
    let x = specd::model::llama::ids(toks)
        .and_then(|ids| m.embed(&ids))
        .expect("embed");
    m.layers(0..m.layer_count(), x, &mut seq, out)
        .expect("layers")
}
