//! `specd generate`.
use super::Load;
use super::{policy_host, ModelArg};
use crate::engine::{Engine, Prepared, Prompt};
use crate::options::SpecOptions;
use crate::ranks::Joined;
use crate::request::{RequestError, RequestOptions, ValidatedRequest};
use crate::sampling::SamplingParams;
use anyhow::{Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// The command line's sampling parameters: what the flags (the HTTP APIs'
/// fields, [`RequestOptions`]) set, greedy defaults (seed 0) for the rest,
/// checked as an HTTP request's are.
pub fn sampling_params(flags: &RequestOptions) -> Result<SamplingParams, RequestError> {
    flags.sampling(&SamplingParams::default(), false)
}

/// Speculation flags of `generate` and `bench`.
#[derive(Args, Clone, Debug, Default)]
pub struct SpecArgs {
    #[command(flatten)]
    pub options: SpecOptions,
    /// Extra policy components (*.wasm) to load.
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
}

impl SpecArgs {
    /// `model:PATH` (`mtp:PATH`) on the command line loads that draft model
    /// (head) under its path.
    pub fn register_draft_model(&self, engine: &mut Engine) -> Result<()> {
        if let Some(path) = self.options.draft_model() {
            let p = crate::store::Store::default().resolve(path, false)?;
            engine.add_draft_model(path, &p)?;
        }
        if let Some(path) = self.options.draft_head() {
            engine.add_draft_head(path, std::path::Path::new(path))?;
        }
        Ok(())
    }
}

#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message (with --chat).
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens to generate at most (default: until end of generation or the context limit).
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Stop at this text (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub sampling: RequestOptions,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Write the final stats as JSON here.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Record every round (what the policies saw and answered) as a JSONL trace.
    #[arg(long)]
    pub record: Option<PathBuf>,
    pub prompt: String,
}

/// The engine of `model` in this process alone.
pub fn load_engine(model: &str, spec: &SpecArgs, load: Load) -> Result<Engine> {
    load_engine_on(model, spec, load, None)
}

/// The engine of `model`, on rank 0 of `ranks` where given.
fn load_engine_on(
    model: &str,
    spec: &SpecArgs,
    load: Load,
    ranks: Option<Arc<Joined>>,
) -> Result<Engine> {
    let path = crate::store::Store::default().resolve(model, false)?;
    let policies = policy_host(spec.policy_dir.as_deref())?;
    let mut engine = Engine::load_on(model, &path, policies, load.weights, load.switches, ranks)?;
    spec.register_draft_model(&mut engine)?;
    Ok(engine)
}

pub fn prompt_of(chat: bool, system: Option<&str>, text: &str) -> Prompt {
    if chat {
        Prompt::user_turn(system.map(str::to_string), text.to_string())
    } else {
        Prompt::Raw(text.to_string())
    }
}

impl GenerateArgs {
    /// The request these flags make, through the checks an HTTP request's
    /// fields go through.
    pub fn request(&self) -> Result<ValidatedRequest, RequestError> {
        Ok(ValidatedRequest {
            prompt: prompt_of(self.chat, self.system.as_deref(), &self.prompt),
            params: sampling_params(&self.sampling)?,
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            spec: crate::request::checked(self.spec.options.clone())?,
            trace_rounds: false,
            tenant: String::new(),
            logprobs: None,
            format: None,
            prompt_logprobs: false,
            ends: Default::default(),
        })
    }
}

pub fn run(a: GenerateArgs, load: Load, ranks: Option<Arc<Joined>>) -> Result<()> {
    let req = a.request()?;
    let r = load_engine_on(&a.model.model, &a.spec, load, ranks.clone())
        .and_then(|engine| generate(&a, &req, &engine));
    // Pipeline ranks after 0 exit with this one.
    if let Some(j) = &ranks {
        j.finish();
    }
    r
}

fn generate(a: &GenerateArgs, req: &ValidatedRequest, engine: &Engine) -> Result<()> {
    let prompt = engine.encode(&req.prompt)?;
    let Prepared { mut settings, spec } = engine.prepare(req)?;
    settings.record = a.record.is_some();
    let mut out = std::io::stdout().lock();
    let mut sink = |s: &str| {
        if !s.is_empty() {
            // A closed stdout (e.g. `| head`) cancels generation.
            if out
                .write_all(s.as_bytes())
                .and_then(|_| out.flush())
                .is_err()
            {
                return false;
            }
        }
        true
    };
    let fin = engine.generate(Some(&req.tenant), &prompt, &settings, spec, &mut sink)?;
    let _ = writeln!(out);
    let s = &fin.stats;
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | decode: {} tokens, {:.1} tok/s ({}) | drafter {} schedule {} acceptance {}: {} rounds, acceptance {:.2}, {:.2} accepted/round",
        s.prompt_tokens,
        s.prompt_tps(),
        s.generated_tokens,
        s.decode_tps(),
        s.done_reason.as_str(),
        s.drafter,
        if s.schedule.is_empty() { "-" } else { &s.schedule },
        if s.acceptance.is_empty() { "-" } else { &s.acceptance },
        s.rounds,
        s.acceptance_rate,
        s.mean_accepted
    );
    if let Some(f) = &s.policy_failure {
        eprintln!("policy failure: {} ({}): {}", f.policy, f.kind, f.message);
    }
    if s.policy_output_dropped > 0 {
        eprintln!(
            "policy output: {} bytes past the log cap were dropped",
            s.policy_output_dropped
        );
    }
    if let Some(p) = &a.record {
        crate::trace::write(p, engine, &settings, &req.spec, &fin)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.stats_json {
        std::fs::write(p, serde_json::to_string_pretty(s)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
