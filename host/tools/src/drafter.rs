//! `specd drafter train`: an MTP draft head for a model, from nothing but
//! the model.
//!
//! 1. Data by self-distillation: the target answers a prompt set (shipped
//!    in `host/tools/data/train_prompts.txt`, or `--prompts FILE`) through
//!    specd's batched scheduler; then one forward over each prompt + answer
//!    gives, per position, the last layer's output (the feature the head
//!    reads) and the target's own next token (what the head learns).
//!    No prompt of a bench suite is allowed in, and no sequence may contain
//!    one (checked; the counts go into the head's record).
//! 2. Training on MLX's autograd through the `mlx` Python package
//!    (`train_head.py`, embedded in this binary): specd's binding has no
//!    autograd, and the Python package is MLX's own and in the test venv.
//! 3. Output: `OUT/head.safetensors` + `OUT/config.json`, loadable as
//!    `--drafter mtp:OUT` or `serve --draft-head NAME=OUT`.
use crate::bench::{user_turn, SUITES};
use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use specd::engine::Engine;
use specd::model::llama::{self, Outputs, Seq, Want};
use specd::model::{load_model_with, Linear, Llama, Logits, WeightMode};
use specd::sampling::SamplingParams;
use specd::scheduler::{Admitted, BatchLimits, Scheduler};
use specd::sequence::Finished;
use specd_mlx::{io, ops, Array, Dtype};
use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::time::Instant;

/// The trainer, run by the `mlx` Python package.
const TRAIN_HEAD_PY: &str = include_str!("../python/train_head.py");
/// The prompt set a head for a chat model is trained on by default.
const TRAIN_PROMPTS: &str = include_str!("../data/train_prompts.txt");

#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// Where the head goes (created; `OUT/data` keeps the training data).
    #[arg(long)]
    pub out: PathBuf,
    /// One prompt per line (default: the shipped prompt set).
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Use at most this many prompts (the first N).
    #[arg(long)]
    pub max_prompts: Option<usize>,
    /// Answer length per prompt, in tokens.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature of the answers (0: greedy, the answers the head
    /// will be asked to predict under greedy serving).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Requests answered side by side.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Training steps.
    #[arg(long, default_value_t = 1000)]
    pub steps: usize,
    #[arg(long, default_value_t = 4096)]
    pub batch_tokens: usize,
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Draft vocabulary size (EAGLE-3's reduced vocabulary).
    #[arg(long, default_value_t = 8192)]
    pub draft_vocab: usize,
    /// Evaluate on held-back data every N steps.
    #[arg(long, default_value_t = 100)]
    pub eval_every: usize,
    /// Chained steps trained per position (2: training-time test).
    #[arg(long, default_value_t = 2)]
    pub unroll: usize,
    /// Continue: reuse OUT/data and the trainer's checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// Make the data only.
    #[arg(long)]
    pub data_only: bool,
    /// The Python with `mlx` (default: SPECD_PYTHON, else python3).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

/// Trains a head for the engine's model.
pub fn train(e: &Engine, a: &TrainArgs) -> Result<()> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let data = a.out.join("data");
    let have_data = data.join("data.safetensors").exists();
    let mut data_seconds = 0.0;
    if !(a.resume && have_data) {
        let t = Instant::now();
        let prompts = prompts(a)?;
        let (seqs, prompt_lens) = answers(e, &prompts, a)?;
        let check = bench_overlap(e, &seqs)?;
        ensure!(
            check == 0,
            "{check} training sequence(s) contain a bench suite's prompt"
        );
        write_data(e, &data, &seqs, &prompt_lens, a.temperature == 0.0)?;
        data_seconds = t.elapsed().as_secs_f64();
        eprintln!(
            "data: {} sequences, {} tokens in {:.0} s -> {}",
            seqs.len(),
            seqs.iter().map(Vec::len).sum::<usize>(),
            data_seconds,
            data.display()
        );
    }
    if a.data_only {
        return Ok(());
    }
    let script = a.out.join("train_head.py");
    std::fs::write(&script, TRAIN_HEAD_PY)?;
    let python = a
        .python
        .clone()
        .or_else(|| std::env::var_os("SPECD_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("python3"));
    let mut cmd = Command::new(&python);
    cmd.arg(&script)
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&a.out)
        .args(["--steps", &a.steps.to_string()])
        .args(["--batch-tokens", &a.batch_tokens.to_string()])
        .args(["--lr", &a.lr.to_string()])
        .args(["--seed", &a.seed.to_string()])
        .args(["--draft-vocab", &a.draft_vocab.to_string()])
        .args(["--eval-every", &a.eval_every.to_string()])
        .args(["--unroll", &a.unroll.to_string()]);
    if a.resume {
        cmd.arg("--resume");
    }
    let status = cmd.status().with_context(|| {
        format!(
            "running {} (a Python with the `mlx` package: --python or SPECD_PYTHON)",
            python.display()
        )
    })?;
    ensure!(status.success(), "the trainer failed ({status})");
    record(&a.out, a, data_seconds)
}

/// Adds what the data step knows to the head's record: the command line and
/// the data's wall time.
fn record(out: &Path, a: &TrainArgs, data_seconds: f64) -> Result<()> {
    let path = out.join("config.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("the trainer wrote no {}", path.display()))?;
    let mut cfg: serde_json::Value = serde_json::from_str(&text)?;
    // `specd drafter train ...` (specd runs this binary with its own
    // arguments), without the binary's path.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let t = &mut cfg["training"];
    t["command"] = serde_json::json!(format!("specd {}", args.join(" ")));
    if data_seconds > 0.0 {
        t["data_seconds"] = serde_json::json!(data_seconds);
        t["answer_tokens"] = serde_json::json!(a.max_tokens);
        t["answer_temperature"] = serde_json::json!(a.temperature);
    }
    std::fs::write(&path, serde_json::to_string_pretty(&cfg)? + "\n")?;
    eprintln!("head: {}", out.display());
    Ok(())
}

fn prompts(a: &TrainArgs) -> Result<Vec<String>> {
    let text = match &a.prompts {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        None => TRAIN_PROMPTS.to_string(),
    };
    let mut v: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    if let Some(n) = a.max_prompts {
        v.truncate(n);
    }
    ensure!(!v.is_empty(), "no prompts to train on");
    for p in &v {
        if SUITES.iter().any(|(_, s)| s.contains(&p.as_str())) {
            bail!("{p:?} is a bench suite's prompt: it may not be trained on");
        }
    }
    Ok(v)
}

/// Prompt + answer token ids, one per prompt, answered by the batched
/// scheduler.
fn answers(e: &Engine, prompts: &[String], a: &TrainArgs) -> Result<(Vec<Vec<u32>>, Vec<usize>)> {
    let limits = BatchLimits {
        max_sequences: a.batch.max(1),
        ..Default::default()
    };
    let mut sched = Scheduler::new(e, limits);
    type Slot = Option<Result<Finished>>;
    let done: Rc<RefCell<Vec<Slot>>> =
        Rc::new(RefCell::new(prompts.iter().map(|_| None).collect()));
    let mut lens = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let prompt = e.encode(&user_turn(e, p))?;
        lens.push(prompt.len());
        let params = SamplingParams {
            temperature: a.temperature,
            seed: a.seed.wrapping_add(i as u64),
            ..Default::default()
        };
        let d = done.clone();
        sched.admit(Admitted {
            tenant: None,
            prompt,
            settings: e.settings(params, Some(a.max_tokens), vec![]),
            spec: None,
            sink: Box::new(|_: &str| true),
            done: Box::new(move |r| d.borrow_mut()[i] = Some(r)),
        });
    }
    let t = Instant::now();
    let mut tokens = 0usize;
    let mut shown = Progress::default();
    while !sched.is_idle() {
        let s = sched.step(&mut || true);
        tokens += s.rows;
        shown.show(|| {
            let finished = done.borrow().iter().filter(|d| d.is_some()).count();
            format!(
                "answering: {finished}/{} prompts, {:.0} rows/s",
                prompts.len(),
                tokens as f64 / t.elapsed().as_secs_f64().max(1e-9)
            )
        });
    }
    eprintln!();
    let out = done
        .borrow_mut()
        .drain(..)
        .enumerate()
        .map(|(i, r)| {
            let fin = r.context("a request never finished")??;
            ensure!(
                fin.log.len() >= 2,
                "prompt {i} gave a sequence of one token"
            );
            Ok(fin.log)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((out, lens))
}

/// A progress line on stderr, redrawn at most twice a second.
#[derive(Default)]
struct Progress {
    last: Option<Instant>,
}

impl Progress {
    fn show(&mut self, line: impl FnOnce() -> String) {
        if self.last.is_some_and(|t| t.elapsed().as_secs_f64() < 0.5) {
            return;
        }
        self.last = Some(Instant::now());
        eprint!("\r{}   ", line());
    }
}

/// Sequences whose text contains a bench suite's prompt (0 is the only
/// acceptable answer: nothing the bench measures was trained on).
fn bench_overlap(e: &Engine, seqs: &[Vec<u32>]) -> Result<usize> {
    let mut n = 0;
    for s in seqs {
        let text = e.tokenizer.decode(s);
        if SUITES
            .iter()
            .flat_map(|(_, p)| p.iter())
            .any(|p| text.contains(p))
        {
            n += 1;
        }
    }
    Ok(n)
}

/// `OUT/data`: `data.safetensors` (tokens, features, the target's argmax,
/// sequence starts), `target.safetensors` (the embedding, the final norm
/// and the last layer, dequantized) and `target.json`.
fn write_data(
    e: &Engine,
    dir: &Path,
    seqs: &[Vec<u32>],
    prompt_lens: &[usize],
    greedy: bool,
) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    // The same weights dequantized (exactly) to float32: MLX's BLAS matmul
    // reads each weight once for a whole sequence, where the batch-invariant
    // kernels work row by row; the features differ from the served
    // model's only by float summation order.
    let (m, _) = load_model_with(&e.path, WeightMode::F32)
        .with_context(|| format!("loading {} as float32", e.path.display()))?;
    let m = &m;
    let (mut features, mut argmax, mut tokens, mut starts) =
        (Vec::new(), Vec::new(), Vec::new(), vec![0i32]);
    let t = Instant::now();
    let mut shown = Progress::default();
    let d = m.config.hidden_size as i32;
    for (i, (s, &p)) in seqs.iter().zip(prompt_lens).enumerate() {
        let mut caches = m.new_caches();
        let n = s.len() as i32;
        let mut seq = [Seq {
            caches: &mut caches,
            rows: n,
            logits: None,
        }];
        let x = m.embed(&llama::ids(s)?)?;
        let h = m.layers(0..m.layer_count(), x, &mut seq, &mut Outputs::none())?;
        let head = |rows: &Array| -> Result<Array> {
            let want = Want {
                rows: rows.dim(1),
                logits: Some(Logits::All),
            };
            Ok(m.unembed(rows, &[want], &mut Outputs::none())?.logits()?)
        };
        // A greedy answer's next tokens are the target's argmax already:
        // the head runs over the prompt's rows only (it costs about what
        // the layers do a row).
        let head_rows = if greedy {
            (p as i32 - 1).clamp(0, n)
        } else {
            n
        };
        let mut best = Vec::with_capacity(s.len());
        if head_rows > 0 {
            let rows = h.slice(&[0, 0, 0], &[1, head_rows, d])?;
            let logits = head(&rows)?;
            let a = ops::argmax(&logits, -1, false)?.as_type(Dtype::Int32)?;
            best = a.to_vec_i32()?;
        }
        best.extend(s[head_rows as usize + 1..].iter().map(|&x| x as i32));
        if best.len() < s.len() {
            // The last position's own next token: the end of the answer.
            let last = h.slice(&[0, n - 1, 0], &[1, n, d])?;
            let a = ops::argmax(&head(&last)?, -1, false)?;
            best.push(a.as_type(Dtype::Int32)?.to_vec_i32()?[0]);
        }
        let h = h.reshape(&[n, d])?.as_type(Dtype::Float16)?;
        specd_mlx::eval(&[&h])?;
        features.push(h);
        argmax.extend(best);
        tokens.extend(s.iter().map(|&x| x as i32));
        starts.push(tokens.len() as i32);
        shown.show(|| {
            format!(
                "features: {}/{} sequences, {:.0} tokens/s",
                i + 1,
                seqs.len(),
                tokens.len() as f64 / t.elapsed().as_secs_f64().max(1e-9)
            )
        });
    }
    eprintln!();
    let n = tokens.len() as i32;
    let features = ops::concatenate(&features.iter().collect::<Vec<_>>(), 0)?;
    io::save_safetensors(
        &dir.join("data.safetensors"),
        &[
            ("tokens".into(), Array::from_i32(&tokens, &[n])?),
            ("features".into(), features),
            ("argmax".into(), Array::from_i32(&argmax, &[n])?),
            (
                "starts".into(),
                Array::from_i32(&starts, &[starts.len() as i32])?,
            ),
        ],
        &[],
    )?;
    write_target(e, m, dir)
}

/// The target's parts the trainer needs, as float16 (norms float32), from
/// the float32 load (every weight there as a matrix).
fn write_target(e: &Engine, m: &Llama, dir: &Path) -> Result<()> {
    let dense = |l: &Linear| -> Result<Array> {
        match l {
            Linear::Dense(w) => Ok(w.as_type(Dtype::Float16)?),
            Linear::Quantized(_) => bail!("a float32 load left a quantized weight"),
        }
    };
    let last = m.layers.last().context("a model with no layers")?;
    let mut t: Vec<(String, Array)> = vec![
        ("embed".into(), dense(&m.embed)?),
        ("norm".into(), m.norm.as_type(Dtype::Float32)?),
        (
            "init.attn_norm".into(),
            last.attn_norm.as_type(Dtype::Float32)?,
        ),
        (
            "init.ffn_norm".into(),
            last.ffn_norm.as_type(Dtype::Float32)?,
        ),
    ];
    if let Some(h) = &m.lm_head {
        t.push(("lm_head".into(), dense(h)?));
    }
    for (name, l) in [
        ("q", &last.q),
        ("k", &last.k),
        ("v", &last.v),
        ("o", &last.o),
        ("gate", &last.gate),
        ("up", &last.up),
        ("down", &last.down),
    ] {
        t.push((format!("init.{name}"), dense(l)?));
    }
    io::save_safetensors(&dir.join("target.safetensors"), &t, &[])?;
    let c = &m.config;
    ensure!(
        matches!(c.arch, specd::model::Arch::Llama) && !c.qkv_bias && !c.qk_norm && !c.o_bias,
        "MTP heads are trained for plain llama-family models (no biases or q/k norms) for now"
    );
    let cfg = serde_json::json!({
        "hidden_size": c.hidden_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_traditional": c.rope_traditional,
        "vocab_size": c.vocab_size,
        "arch": "llama",
        "model": e.name,
    });
    let mut f = std::fs::File::create(dir.join("target.json"))?;
    writeln!(f, "{}", serde_json::to_string_pretty(&cfg)?)?;
    Ok(())
}
