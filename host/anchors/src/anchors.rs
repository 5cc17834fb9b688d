//! `specd bench anchors`: our plain greedy decode and prefill speed next to
//! mlx-lm (on the weights `specd convert` writes) and llama.cpp (via
//! llama-cpp-python, on the same GGUF), measured in one run with the same
//! token ids, token count and thread count; plus our verify cost curve (one
//! forward over 1, 2, 4, 8, 16 new tokens, relative to 1).
//!
//! The anchors run in Python (`scripts/anchors.py`, compiled into the binary),
//! one process each, with the interpreter from `SPECD_PYTHON`, else the
//! checkout's `.venv`, else `python3`. A missing anchor package is installed
//! there with pip on first use (unless `--no-install`); one that still cannot
//! run is an error in the report, never a silent skip.
use anyhow::{bail, Context, Result};
use serde::Serialize;
use specd::cache::LayerCache;
use specd::engine::{Engine, Prompt};
use specd::model::llama::{ids, Outputs, Seq};
use specd::model::ranks::Pipeline;
use specd::model::{Logits, ModelFormat};
use specd::options::{DrafterSpec, SpecOptions};
use specd::sampling::SamplingParams;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use crate::options::{Decode, Options, Prefill};
use crate::python::{ensure, run_anchor};

/// Engine names, in the order they run.
pub const ENGINES: [&str; 3] = ["ours", "mlx-lm", "llama.cpp"];

/// New tokens per forward on the verify cost curve: every k a round of
/// speculation verifies up to 8 (a verify of k drafts is 1 + k rows), then
/// 16.
pub const VERIFY_TOKENS: [usize; 9] = [1, 2, 3, 4, 5, 6, 7, 8, 16];

/// The decode prompt (a chat turn where the model has a template, else raw
/// text; ~40 tokens with the default model's
/// template). It asks for a long answer, so greedy decoding runs the whole
/// token budget.
pub const DECODE_PROMPT: &str =
    "Write a long story about a lighthouse keeper who finds a message in a bottle.";

const WARMUP_TOKENS: usize = 8;

/// One engine's results, or why it could not run.
#[derive(Debug, Clone, Serialize, Default)]
pub struct EngineRun {
    pub engine: String,
    pub version: Option<String>,
    /// What it ran on (file or directory).
    pub model: String,
    /// Weights and backend, in words.
    pub backend: String,
    pub threads: usize,
    pub load_seconds: Option<f64>,
    pub prefill: Option<Prefill>,
    pub decode: Option<Decode>,
    /// Leading generated tokens equal to ours (greedy on the same weights:
    /// they should agree up to numerical near-ties).
    pub same_tokens_as_ours: Option<usize>,
    pub error: Option<String>,
    /// How to install the engine when it is missing.
    pub install: Option<String>,
    /// The share of all CPU time that other processes took while this
    /// engine ran (Linux).
    pub cpu_others: Option<f64>,
    #[serde(skip)]
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyPoint {
    pub tokens: usize,
    pub ms: f64,
    /// `ms` over the 1-token forward's.
    pub relative: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verify {
    pub context: usize,
    pub reps: usize,
    pub points: Vec<VerifyPoint>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub model: String,
    pub gguf: Option<String>,
    pub converted: Option<String>,
    pub threads: usize,
    pub max_tokens: usize,
    pub decode_prompt_tokens: usize,
    pub prefill_prompt_tokens: usize,
    pub python: String,
    /// The share of CPU time busy in the half second before the run
    /// (Linux): other work on the machine skews every number.
    pub cpu_busy_at_start: Option<f64>,
    /// The share of all CPU time during the run that went to other
    /// processes than this one and its anchors (Linux).
    pub cpu_others_during_run: Option<f64>,
    pub engines: Vec<EngineRun>,
    /// Ours over each anchor that ran: `{"decode": {"mlx-lm": x}, "prefill": {...}}`.
    pub ratios: BTreeMap<String, BTreeMap<String, f64>>,
    pub verify: Option<Verify>,
}

impl Report {
    pub fn failed(&self) -> Vec<&EngineRun> {
        self.engines.iter().filter(|e| e.error.is_some()).collect()
    }
}

/// The interpreter for the anchors: `SPECD_PYTHON`, else `.venv/bin/python`
/// of this checkout (as the Makefile makes it) or of the current directory,
/// else `python3` on PATH.
pub fn default_python() -> PathBuf {
    if let Some(p) = std::env::var_os("SPECD_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    // Never resolve the venv's symlink: the interpreter it points at is
    // outside the venv.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.parent().unwrap_or(manifest).to_path_buf();
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    for base in [root, cwd] {
        let p = base.join(".venv/bin/python");
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("python3")
}

/// The system's OpenBLAS shared library (what specd links), if installed.
pub fn system_openblas() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
    ]
    .iter()
    .map(|d| Path::new(d).join("libopenblas.so.0"))
    .find(|p| p.exists())
}

/// Threads when `--threads` is not given: `SPECD_THREADS`, else every core.
pub fn default_threads() -> usize {
    std::env::var("SPECD_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `n` prompt tokens of plain text (the bench's prompt suites, repeated).
fn long_prompt(e: &Engine, n: usize) -> Result<Vec<u32>> {
    let mut text = String::new();
    let mut ids = Vec::new();
    while ids.len() < n {
        for p in specd_tools::bench::GROUNDED
            .iter()
            .chain(specd_tools::bench::OPEN.iter())
        {
            text.push_str(p);
            text.push_str("\n\n");
        }
        ids = e.encode(&Prompt::Raw(text.clone()))?;
    }
    ids.truncate(n);
    Ok(ids)
}

/// One forward of `tokens` alone after what `caches` hold: the logits of
/// `which` rows.
fn forward(
    m: &Pipeline,
    tokens: &[u32],
    caches: &mut [Box<dyn LayerCache>],
    which: Logits,
) -> Result<specd_mlx::Array> {
    let mut seq = [Seq {
        caches,
        rows: tokens.len() as i32,
        logits: Some(which),
    }];
    let out = m.forward(
        &ids(tokens)?,
        m.layer_count(),
        &mut seq,
        &mut Outputs::none(),
    )?;
    Ok(out.logits()?)
}

/// Ours: the engine's plain greedy decode, a direct forward for prefill.
fn run_ours(e: &Engine, decode_ids: &[u32], long_ids: &[u32], o: &Options) -> Result<EngineRun> {
    let m = &e.model;
    // Prefill: the whole prompt to the last position's logits, one batch.
    let prefill_once = || -> Result<f64> {
        let mut caches = m.new_caches();
        let t = Instant::now();
        forward(m, long_ids, &mut caches, Logits::Last)?.eval()?;
        Ok(t.elapsed().as_secs_f64())
    };
    prefill_once()?;
    let times = (0..o.reps.max(1))
        .map(|_| prefill_once())
        .collect::<Result<Vec<_>>>()?;
    let prefill_s = median(times);

    // Decode: the pipeline with no drafter, as `specd generate` runs it.
    let params = SamplingParams::default();
    let none = SpecOptions {
        drafter: Some(DrafterSpec::None),
        ..Default::default()
    };
    let decode = |n: usize| {
        let settings = e.settings(params.clone(), Some(n), vec![]);
        e.generate(
            None,
            decode_ids,
            &settings,
            e.speculation(&none, &params)?,
            &mut |_| true,
        )
    };
    decode(WARMUP_TOKENS)?;
    let fin = decode(o.max_tokens)?;
    let weights = e.weights.name().to_string();
    Ok(EngineRun {
        engine: "ours".into(),
        version: Some(env!("CARGO_PKG_VERSION").into()),
        model: e.path.display().to_string(),
        backend: format!("specd, MLX CPU, weights {weights}"),
        threads: o.threads,
        prefill: Some(Prefill {
            prompt_tokens: long_ids.len(),
            seconds: prefill_s,
            tokens_per_second: long_ids.len() as f64 / prefill_s,
            reps: o.reps.max(1),
        }),
        decode: Some(Decode {
            prompt_tokens: decode_ids.len(),
            generated_tokens: fin.stats.generated_tokens,
            seconds: fin.stats.decode_seconds,
            tokens_per_second: fin.stats.decode_tps(),
        }),
        tokens: fin.emitted.clone(),
        ..Default::default()
    })
}

/// The verify cost curve: one forward over k new tokens after `context`
/// tokens, for k in [`VERIFY_TOKENS`]; the median of `reps` (the k's
/// interleaved within each rep), relative to k = 1.
pub fn verify_curve(e: &Engine, ids: &[u32], context: usize, reps: usize) -> Result<Verify> {
    let kmax = *VERIFY_TOKENS.iter().max().expect("non-empty");
    if ids.len() < context + kmax {
        bail!(
            "the verify curve needs {} prompt tokens, got {}",
            context + kmax,
            ids.len()
        );
    }
    let m = &e.model;
    let mut caches = m.new_caches();
    if context > 0 {
        forward(m, &ids[..context], &mut caches, Logits::Last)?.eval()?;
        let state: Vec<&specd_mlx::Array> = caches.iter().flat_map(|c| c.state()).collect();
        specd_mlx::eval(&state)?;
    }
    let new = &ids[context..context + kmax];
    let mut times = vec![Vec::new(); VERIFY_TOKENS.len()];
    // One untimed round warms every shape.
    for rep in 0..=reps.max(1) {
        for (i, &k) in VERIFY_TOKENS.iter().enumerate() {
            for c in caches.iter_mut() {
                c.rewind(context);
            }
            let t = Instant::now();
            forward(m, &new[..k], &mut caches, Logits::All)?.eval()?;
            if rep > 0 {
                times[i].push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let ms: Vec<f64> = times.into_iter().map(median).collect();
    let points = VERIFY_TOKENS
        .iter()
        .zip(&ms)
        .map(|(&k, &t)| VerifyPoint {
            tokens: k,
            ms: t,
            relative: if ms[0] > 0.0 { t / ms[0] } else { 0.0 },
        })
        .collect();
    Ok(Verify {
        context,
        reps: reps.max(1),
        points,
    })
}

/// `$SPECD_HOME/converted/<stem>-<sha256 prefix>`: `specd convert` of the GGUF,
/// made once (written next to it, then renamed into place).
pub fn converted_dir(gguf: &Path, progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let sha = specd::store::sha256_file(gguf)?;
    let stem = gguf
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let root = specd::store::home().join("converted");
    let dir = root.join(format!("{stem}-{}", &sha[..12]));
    if dir.join("config.json").exists() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let tmp = root.join(format!(".{stem}-{}.tmp{}", &sha[..12], std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    progress(&format!(
        "converting {} for mlx-lm into {} (once)",
        gguf.display(),
        dir.display()
    ));
    specd::model::convert::convert_gguf(gguf, &tmp)?;
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        let _ = std::fs::remove_dir_all(&tmp);
        if !dir.join("config.json").exists() {
            return Err(e).with_context(|| format!("moving the conversion to {}", dir.display()));
        }
    }
    Ok(dir)
}

/// Runs the selected engines and the verify curve (ours) in one run.
pub fn run(e: Engine, o: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    for name in &o.engines {
        if !ENGINES.contains(&name.as_str()) {
            bail!(
                "unknown engine {name:?} in --only: use {}",
                ENGINES.join(", ")
            );
        }
    }
    if o.max_tokens == 0 || o.prefill_tokens < 2 {
        bail!("--max-tokens must be at least 1 and --prefill-tokens at least 2");
    }
    let want = |n: &str| o.engines.iter().any(|x| x == n);
    let cpu_busy_at_start = cpu_busy(std::time::Duration::from_millis(500));
    let probe = CpuProbe::now();
    let decode_ids = e.encode(&specd_tools::bench::user_turn(&e, DECODE_PROMPT))?;
    let kmax = *VERIFY_TOKENS.iter().max().expect("non-empty");
    let long_ids = long_prompt(&e, o.prefill_tokens.max(o.verify_context + kmax))?;
    let prefill_ids = long_ids[..o.prefill_tokens].to_vec();
    let gguf = (e.format == ModelFormat::Gguf).then(|| e.path.clone());

    let mut engines = Vec::new();
    let mut verify = None;
    if want("ours") {
        progress(&format!(
            "ours: prefill {} tokens x{}, decode {} tokens",
            prefill_ids.len(),
            o.reps,
            o.max_tokens
        ));
        let p = CpuProbe::now();
        let mut r = run_ours(&e, &decode_ids, &prefill_ids, o)?;
        r.cpu_others = p.and_then(|p| p.others_share());
        engines.push(r);
        progress(&format!(
            "ours: verify curve after {} tokens, {} reps",
            o.verify_context, o.verify_reps
        ));
        verify = Some(verify_curve(
            &e,
            &long_ids,
            o.verify_context,
            o.verify_reps,
        )?);
    }
    let eos = e.tokenizer.eos_ids();
    let model_path = e.path.clone();
    let model_name = e.name.clone();
    // The anchors get the machine to themselves.
    drop(e);

    let cfg = serde_json::json!({
        "decode_prompt": decode_ids,
        "prefill_prompt": prefill_ids,
        "max_tokens": o.max_tokens,
        "eos": eos,
        "threads": o.threads,
        "reps": o.reps.max(1),
    });
    let mut converted: Option<PathBuf> = None;
    for engine in ["mlx-lm", "llama.cpp"] {
        if !want(engine) {
            continue;
        }
        let mut r = EngineRun {
            engine: engine.into(),
            threads: o.threads,
            backend: match engine {
                "mlx-lm" => format!(
                    "MLX CPU, float32 from specd convert, {}",
                    match &o.mlx_lm_blas {
                        Some(p) => format!("BLAS {} (LD_PRELOAD)", p.display()),
                        None => "the wheel's BLAS".into(),
                    }
                ),
                _ => "llama.cpp CPU, the GGUF's own quantization".into(),
            },
            ..Default::default()
        };
        // What the engine loads.
        let model: std::result::Result<PathBuf, String> = match (engine, &gguf) {
            ("mlx-lm", Some(g)) => match &converted {
                Some(d) => Ok(d.clone()),
                None => converted_dir(g, progress)
                    .inspect(|d| converted = Some(d.clone()))
                    .map_err(|err| format!("specd convert failed: {err:#}")),
            },
            ("mlx-lm", None) => Ok(model_path.clone()),
            (_, Some(g)) => Ok(g.clone()),
            (_, None) => Err(format!(
                "llama.cpp needs a GGUF file; {} is a directory",
                model_path.display()
            )),
        };
        let model = match model {
            Ok(m) => m,
            Err(err) => {
                r.error = Some(err);
                engines.push(r);
                continue;
            }
        };
        r.model = model.display().to_string();
        if let Err((err, hint)) = ensure(o, engine, progress) {
            r.error = Some(err);
            r.install = Some(hint);
            engines.push(r);
            continue;
        }
        progress(&format!(
            "{engine}: prefill {} tokens x{}, decode {} tokens",
            o.prefill_tokens, o.reps, o.max_tokens
        ));
        let p = CpuProbe::now();
        let ran = run_anchor(o, engine, &model, &cfg);
        r.cpu_others = p.and_then(|p| p.others_share());
        match ran {
            Ok(s) => {
                r.version = Some(s.version);
                r.load_seconds = Some(s.load_seconds);
                r.prefill = Some(s.prefill);
                r.decode = Some(s.decode);
                r.tokens = s.tokens;
                if let Some(note) = s.backend_note {
                    r.backend = format!("{}, {note}", r.backend);
                }
            }
            Err((err, hint)) => {
                r.error = Some(err);
                r.install = hint;
            }
        }
        engines.push(r);
    }

    // Agreement and ratios against ours.
    let mut ratios: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    if let Some(ours) = engines.iter().find(|r| r.engine == "ours").cloned() {
        for r in engines.iter_mut().filter(|r| r.engine != "ours") {
            if r.error.is_some() {
                continue;
            }
            r.same_tokens_as_ours = Some(
                r.tokens
                    .iter()
                    .zip(&ours.tokens)
                    .take_while(|(a, b)| a == b)
                    .count(),
            );
            let pairs = [
                (
                    "decode",
                    ours.decode.as_ref().map(|d| d.tokens_per_second),
                    r.decode.as_ref().map(|d| d.tokens_per_second),
                ),
                (
                    "prefill",
                    ours.prefill.as_ref().map(|d| d.tokens_per_second),
                    r.prefill.as_ref().map(|d| d.tokens_per_second),
                ),
            ];
            for (what, a, b) in pairs {
                if let (Some(a), Some(b)) = (a, b) {
                    if b > 0.0 {
                        ratios
                            .entry(what.into())
                            .or_default()
                            .insert(r.engine.clone(), a / b);
                    }
                }
            }
        }
    }
    Ok(Report {
        model: model_name,
        gguf: gguf.map(|p| p.display().to_string()),
        converted: converted.map(|p| p.display().to_string()),
        threads: o.threads,
        max_tokens: o.max_tokens,
        decode_prompt_tokens: decode_ids.len(),
        prefill_prompt_tokens: prefill_ids.len(),
        python: o.python.display().to_string(),
        cpu_busy_at_start,
        cpu_others_during_run: probe.and_then(|p| p.others_share()),
        engines,
        ratios,
        verify,
    })
}

/// The busy share of all CPUs over `window`, from /proc/stat.
fn cpu_busy(window: std::time::Duration) -> Option<f64> {
    let sample = || -> Option<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let v: Vec<u64> = text
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal ...
        let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
        Some((v.iter().take(8).sum(), idle))
    };
    let (t0, i0) = sample()?;
    std::thread::sleep(window);
    let (t1, i1) = sample()?;
    let dt = t1.checked_sub(t0).filter(|&d| d > 0)?;
    Some(1.0 - (i1.saturating_sub(i0)) as f64 / dt as f64)
}

/// CPU time of the whole machine and of this process with its waited-for
/// children, in clock ticks.
#[derive(Debug, Clone, Copy)]
struct CpuProbe {
    total: u64,
    busy: u64,
    own: u64,
}

impl CpuProbe {
    fn now() -> Option<CpuProbe> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let v: Vec<u64> = text
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .take(8)
            .filter_map(|x| x.parse().ok())
            .collect();
        let total: u64 = v.iter().sum();
        let busy = total - v.get(3)? - v.get(4).copied().unwrap_or(0);
        let me = std::fs::read_to_string("/proc/self/stat").ok()?;
        // After "pid (comm) ": state is field 0; utime stime cutime cstime are 11..=14.
        let f: Vec<&str> = me.rsplit_once(')')?.1.split_whitespace().collect();
        let own = (11..=14)
            .map(|i| f.get(i)?.parse::<i64>().ok())
            .sum::<Option<i64>>()?
            .max(0) as u64;
        Some(CpuProbe { total, busy, own })
    }

    /// Since `self`: the share of all CPU time spent busy outside this
    /// process tree.
    fn others_share(self) -> Option<f64> {
        let now = CpuProbe::now()?;
        let total = now.total.checked_sub(self.total).filter(|&t| t > 0)?;
        let busy = now.busy.saturating_sub(self.busy);
        let own = now.own.saturating_sub(self.own);
        Some(busy.saturating_sub(own) as f64 / total as f64)
    }
}

/// The report as a text table.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    if let Some(b) = r.cpu_busy_at_start.filter(|&b| b >= 0.2) {
        s += &format!(
            "warning: the CPUs were {:.0}% busy before the run: other work on this machine skews these numbers\n",
            b * 100.0
        );
    }
    if let Some(b) = r.cpu_others_during_run.filter(|&b| b >= 0.1) {
        s += &format!(
            "warning: other processes used {:.0}% of the CPUs during the run: these numbers are skewed\n",
            b * 100.0
        );
    }
    s += &format!(
        "bench anchors: {} | {} threads | greedy | decode: {}-token prompt (chat where the model has a template), up to {} tokens | prefill: {}-token prompt\n\n",
        r.model, r.threads, r.decode_prompt_tokens, r.max_tokens, r.prefill_prompt_tokens
    );
    s += &format!(
        "{:<10} {:<8} {:>13} {:>12} {:>7} {:>6} {:>7}  {}\n",
        "ENGINE",
        "VERSION",
        "PREFILL tok/s",
        "DECODE tok/s",
        "TOKENS",
        "=OURS",
        "OTHERS",
        "BACKEND"
    );
    for e in &r.engines {
        match &e.error {
            None => {
                s += &format!(
                    "{:<10} {:<8} {:>13.1} {:>12.1} {:>7} {:>6} {:>7}  {}\n",
                    e.engine,
                    e.version.as_deref().unwrap_or("-"),
                    e.prefill.as_ref().map_or(0.0, |p| p.tokens_per_second),
                    e.decode.as_ref().map_or(0.0, |d| d.tokens_per_second),
                    e.decode.as_ref().map_or(0, |d| d.generated_tokens),
                    e.same_tokens_as_ours
                        .map_or("-".to_string(), |n| n.to_string()),
                    e.cpu_others
                        .map_or("-".to_string(), |b| format!("{:.0}%", b * 100.0)),
                    e.backend
                );
            }
            Some(err) => {
                s += &format!("{:<10} ERROR: {err}\n", e.engine);
                if let Some(h) = &e.install {
                    s += &format!("{:<10} install: {h}\n", "");
                }
            }
        }
    }
    if !r.ratios.is_empty() {
        s += "\n";
        let anchors: Vec<&String> = r
            .engines
            .iter()
            .filter(|e| e.engine != "ours" && e.error.is_none())
            .map(|e| &e.engine)
            .collect();
        for a in anchors {
            let get = |what: &str| {
                r.ratios
                    .get(what)
                    .and_then(|m| m.get(a.as_str()))
                    .map_or("-".to_string(), |x| format!("{x:.2}x"))
            };
            s += &format!(
                "ours / {a:<10} decode {:>7}   prefill {:>7}\n",
                get("decode"),
                get("prefill")
            );
        }
    }
    if let Some(v) = &r.verify {
        s += &format!(
            "\nverify cost (ours): one forward over k new tokens after {} tokens, median of {}\n",
            v.context, v.reps
        );
        s += &format!("{:<10}", "k");
        for p in &v.points {
            s += &format!(" {:>8}", p.tokens);
        }
        s += &format!("\n{:<10}", "ms");
        for p in &v.points {
            s += &format!(" {:>8.2}", p.ms);
        }
        s += &format!("\n{:<10}", "relative");
        for p in &v.points {
            s += &format!(" {:>8.2}", p.relative);
        }
        s += "\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }

    #[test]
    fn script_knows_every_anchor() {
        for e in ENGINES.iter().filter(|e| **e != "ours") {
            assert!(
                crate::python::SCRIPT.contains(&format!("\"{e}\"")),
                "{e} missing from anchors.py"
            );
        }
    }
}
