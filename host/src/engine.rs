//! A loaded model with everything a request needs: tokenizer, chat
//! template, the policy host, draft models configured at start. It turns a
//! request's names (drafter, schedule, acceptance) into a [`Speculation`]
//! and runs the sequence.
use crate::cache::{PrefixCache, SuffixCorpus};
use crate::load::Switches;
use crate::model::mtp::MtpHead;
use crate::model::ranks::Pipeline;
use crate::model::{load_model_part, ModelFormat, WeightMode};
use crate::options::{
    DrafterSpec, SpecOptions, DEFAULT_DRAFT_MAX, DEFAULT_SCHEDULE, MAX_DRAFT_MAX,
};
use crate::sampling::SamplingParams;
use crate::sequence::{self, Finished, Settings, Sink};
use crate::speculation::{
    mtp::SuffixThenMtp, suffix::space_keys, LlamaTarget, ModelDrafter, MtpDrafter, NgramDrafter,
    Speculation, SuffixDrafter, Target,
};
use anyhow::{bail, Context, Result};
use specd_policy::{PolicyConfig, PolicyHost};
use specd_text::{ChatTemplate, Tokenizer};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ranks::Joined;
pub use crate::request::Prompt;
use crate::request::ValidatedRequest;

/// A request ready to run ([`Engine::prepare`]): a caller adds its hooks
/// (trace, logprobs, a format's constraint) to `settings`.
pub struct Prepared {
    pub settings: Settings,
    /// `None`: plain decoding.
    pub spec: Option<Speculation>,
}

pub struct Engine {
    /// The name requests use (a store name, or the path given).
    pub name: String,
    pub path: PathBuf,
    pub format: ModelFormat,
    pub model: Arc<Pipeline>,
    pub tokenizer: Arc<Tokenizer>,
    /// Shared with the server's validation before the queue.
    pub template: Arc<ChatTemplate>,
    pub policies: Arc<PolicyHost>,
    /// Draft models by name (`model:NAME`), configured at start.
    pub drafts: HashMap<String, Arc<Pipeline>>,
    /// MTP draft heads by name (`mtp:NAME`); `""` is the model's shipped
    /// head (`mtp`): a MiMo checkpoint's own MTP layer, or the head found
    /// beside the model ([`shipped_head_dir`]).
    pub heads: HashMap<String, Arc<MtpHead>>,
    /// KV states of earlier requests, by token prefix.
    pub prefix: Mutex<PrefixCache>,
    /// Earlier requests' outputs, for the `suffix` drafter; cleared with
    /// the prefix cache.
    pub suffix: Arc<Mutex<SuffixCorpus>>,
    /// How the weights are held (`--weights`).
    pub weights: WeightMode,
    /// Which of two implementations some steps take: given at load, the
    /// models' forward flags for their life ([`Switches::flags`]).
    pub switches: Switches,
    /// The pipeline group whose rank 0 this engine's model is, if any.
    pub ranks: Option<Arc<Joined>>,
}

/// Default bound of the prefix cache.
pub const PREFIX_CACHE_BYTES: usize = 1 << 30;
/// Default bound of the suffix drafter's cross-request corpus.
pub const SUFFIX_CORPUS_BYTES: usize = 64 << 20;

/// Configured names for an error: sorted, comma-separated, or `none`.
fn configured<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let mut known: Vec<&str> = names.map(String::as_str).collect();
    known.sort();
    if known.is_empty() {
        "none".into()
    } else {
        known.join(", ")
    }
}

/// Where a model's shipped MTP head lives: `NAME.mtp/` beside the model
/// file (or directory), as `specd pull` and `make` put it.
pub fn shipped_head_dir(model: &Path) -> PathBuf {
    let mut name = model.file_name().unwrap_or_default().to_os_string();
    name.push(".mtp");
    model.with_file_name(name)
}

pub fn load_tokenizer(path: &Path, format: ModelFormat) -> Result<Tokenizer> {
    match format {
        ModelFormat::Gguf => Tokenizer::from_gguf_file(path),
        ModelFormat::HfDir => Tokenizer::from_hf_dir(path),
    }
    .with_context(|| format!("loading the tokenizer of {}", path.display()))
}

impl Engine {
    /// Loads `path` in this process alone, its weights (and any draft
    /// model's) held as `weights`, its models running `switches`.
    pub fn load(
        name: &str,
        path: &Path,
        policies: Arc<PolicyHost>,
        weights: WeightMode,
        switches: Switches,
    ) -> Result<Engine> {
        Engine::load_on(name, path, policies, weights, switches, None)
    }

    /// [`Engine::load`] as rank 0 of `ranks` (when it shares the model
    /// with other ranks): its layers, and the link to the others.
    pub fn load_on(
        name: &str,
        path: &Path,
        policies: Arc<PolicyHost>,
        weights: WeightMode,
        switches: Switches,
        ranks: Option<Arc<Joined>>,
    ) -> Result<Engine> {
        let ranks = ranks.filter(|j| j.pipelined());
        let (model, format) = match &ranks {
            Some(j) => {
                let part = j.split.ranges[0].clone();
                let flags = switches.flags();
                let (m, f) = load_model_part(path, weights, Some(part), flags)?;
                (j.attach(m), f)
            }
            None => {
                let (m, f) = load_model_part(path, weights, None, switches.flags())?;
                (Pipeline::alone(m), f)
            }
        };
        let tokenizer = load_tokenizer(path, format)?;
        if tokenizer.vocab_size() > model.config.vocab_size {
            bail!(
                "tokenizer has {} tokens but the model's vocabulary is {}",
                tokenizer.vocab_size(),
                model.config.vocab_size
            );
        }
        let template = ChatTemplate::from_tokenizer(&tokenizer)?;
        let mut heads = HashMap::new();
        let shipped = shipped_head_dir(path);
        let inside = match format {
            ModelFormat::HfDir => MtpHead::from_mimo_checkpoint(path, &model)?,
            ModelFormat::Gguf => None,
        };
        if let Some(head) = inside {
            heads.insert(String::new(), Arc::new(head));
        } else if shipped.join("config.json").exists() {
            let head = MtpHead::load(&shipped, &model)
                .with_context(|| format!("loading the shipped MTP head {}", shipped.display()))?;
            heads.insert(String::new(), Arc::new(head));
        }
        Ok(Engine {
            name: name.to_string(),
            path: path.to_path_buf(),
            format,
            model: Arc::new(model),
            tokenizer: Arc::new(tokenizer),
            template: Arc::new(template),
            policies,
            drafts: HashMap::new(),
            heads,
            prefix: Mutex::new(PrefixCache::new(PREFIX_CACHE_BYTES)),
            suffix: Arc::new(Mutex::new(SuffixCorpus::new(SUFFIX_CORPUS_BYTES))),
            weights,
            switches,
            ranks,
        })
    }

    /// Registers a draft model (it must share the tokenizer's vocabulary).
    pub fn add_draft_model(&mut self, name: &str, path: &Path) -> Result<()> {
        let (m, _) = load_model_part(path, self.weights, None, self.switches.flags())
            .with_context(|| format!("loading draft model {name}"))?;
        if m.config.vocab_size != self.model.config.vocab_size {
            bail!(
                "draft model {name} has vocabulary {} but the target has {}",
                m.config.vocab_size,
                self.model.config.vocab_size
            );
        }
        self.drafts
            .insert(name.to_string(), Arc::new(Pipeline::alone(m)));
        Ok(())
    }

    /// The MTP head a drafter names: `None` the shipped one.
    fn head(&self, name: Option<&str>) -> Result<Arc<MtpHead>> {
        let key = name.unwrap_or("");
        let head = self.heads.get(key).with_context(|| match name {
            None => format!(
                "model {} has no shipped MTP head (looked in {}); train one with `specd drafter train` and serve it with --draft-head NAME=PATH",
                self.name,
                shipped_head_dir(&self.path).display()
            ),
            Some(n) => format!(
                "unknown MTP head {n:?} (configured: {})",
                configured(self.heads.keys().filter(|k| !k.is_empty()))
            ),
        })?;
        Ok(head.clone())
    }

    /// Registers an MTP draft head trained for this model (`mtp:NAME`).
    pub fn add_draft_head(&mut self, name: &str, dir: &Path) -> Result<()> {
        let head = MtpHead::load(dir, &self.model)
            .with_context(|| format!("loading MTP head {name} from {}", dir.display()))?;
        self.heads.insert(name.to_string(), Arc::new(head));
        Ok(())
    }

    /// Whether this engine's model is shared with other pipeline ranks.
    pub fn pipelined(&self) -> bool {
        self.ranks.is_some()
    }

    /// An idle moment (nothing to run): on rank 0 of a pipeline, a round
    /// trip around the ring, so a lost rank is found while idle too.
    pub fn idle_tick(&self) -> Result<()> {
        self.ranks.as_ref().map_or(Ok(()), |j| j.idle_tick())
    }

    pub fn context_length(&self) -> usize {
        self.model.config.max_position_embeddings
    }

    /// Prompt token ids: chat messages through the model's template.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        encode(&self.template, &self.tokenizer, prompt)
    }

    /// Builds the drafter and policies a request names; `None` when it asks
    /// for no speculation. Unknown names are errors (the request is refused).
    pub fn speculation(
        &self,
        opts: &SpecOptions,
        params: &SamplingParams,
    ) -> Result<Option<Speculation>> {
        self.speculation_in("", opts, params)
    }

    /// [`speculation`](Self::speculation) for `tenant`: a schedule's state
    /// carried across requests is kept per tenant (`""`: shared).
    pub fn speculation_in(
        &self,
        tenant: &str,
        opts: &SpecOptions,
        params: &SamplingParams,
    ) -> Result<Option<Speculation>> {
        let spec = opts.drafter_or_default();
        let draft_max = opts.draft_max.unwrap_or(DEFAULT_DRAFT_MAX);
        if draft_max > MAX_DRAFT_MAX {
            bail!("draft_max must be at most {MAX_DRAFT_MAX}, got {draft_max}");
        }
        let drafter: Box<dyn crate::speculation::Drafter> = match &spec {
            DrafterSpec::None => return Ok(None),
            DrafterSpec::Ngram { min, max } => Box::new(NgramDrafter {
                min_n: *min,
                max_n: *max,
                ..Default::default()
            }),
            DrafterSpec::Suffix => {
                // Keys made at the first suffix request (20 ms for a
                // vocabulary of 49k), not at load.
                Box::new(
                    SuffixDrafter::keyed(self.suffix.clone(), tenant, || {
                        space_keys(&self.tokenizer)
                    })
                    .with_text(self.tokenizer.clone()),
                )
            }
            DrafterSpec::SelfLayers(n) => {
                let layers = self.model.layer_count();
                if *n > layers {
                    bail!(
                        "bad drafter \"{spec}\": N must be in 1..={layers} (the target's layers)"
                    );
                }
                // A draft runs on rank 0's layers alone: its steps do not
                // go around the ring.
                let here = self.model.local_end();
                if self.model.downstream.is_some() && *n > here {
                    bail!(
                        "drafter \"{spec}\" needs layers rank 0 does not hold: with these ranks N must be in 1..={here} (rank 0 holds layers 0..{here}; --layers moves the split)"
                    );
                }
                Box::new(ModelDrafter::new(
                    spec.to_string(),
                    Box::new(LlamaTarget::first_layers(self.model.clone(), *n)),
                ))
            }
            DrafterSpec::Model(name) => {
                let m = self.drafts.get(name).with_context(|| {
                    format!(
                        "unknown draft model {name:?} (configured: {})",
                        configured(self.drafts.keys())
                    )
                })?;
                Box::new(ModelDrafter::new(
                    spec.to_string(),
                    Box::new(LlamaTarget::new(m.clone())),
                ))
            }
            DrafterSpec::Mtp(name) => {
                let name = name.as_deref();
                Box::new(MtpDrafter::new(spec.to_string(), self.head(name)?))
            }
            DrafterSpec::SuffixMtp(name) => {
                let name = name.as_deref();
                let mtp_name = name.map_or("mtp".to_string(), |n| format!("mtp:{n}"));
                Box::new(SuffixThenMtp::new(
                    SuffixDrafter::keyed(self.suffix.clone(), tenant, || {
                        space_keys(&self.tokenizer)
                    })
                    .with_text(self.tokenizer.clone()),
                    MtpDrafter::new(mtp_name, self.head(name)?),
                ))
            }
        };
        let schedule = opts.schedule.as_deref().unwrap_or(DEFAULT_SCHEDULE);
        let acceptance = opts.acceptance.as_deref().unwrap_or(if params.greedy() {
            "greedy"
        } else {
            "rejection"
        });
        // The request's JSON goes to the policy host as it is (no text round trip).
        fn config(v: &Option<serde_json::Value>) -> PolicyConfig<'_> {
            v.as_ref()
                .map_or(PolicyConfig::Text("{}"), PolicyConfig::Json)
        }
        // Carried state is kept per (policy, model key, config): the tenant
        // and the drafter go into the model key (what a schedule learns of
        // acceptance is the drafter's: n-gram and self:N differ widely).
        let model_key = if tenant.is_empty() {
            format!("{}#drafter={spec}", self.name)
        } else {
            format!("{}#drafter={spec}#tenant={tenant}", self.name)
        };
        // A drafter of several sources: a schedule instance per source,
        // each carrying what it learns under its own key.
        let mut schedules = (0..drafter.sources())
            .map(|s| {
                let key = match s {
                    0 => model_key.clone(),
                    s => format!("{model_key}#source={s}"),
                };
                self.policies
                    .schedule(schedule, config(&opts.schedule_config), &key)
                    .map_err(|e| anyhow::anyhow!("schedule {schedule:?}: {e}"))
            })
            .collect::<Result<Vec<_>>>()?;
        let schedule = schedules.remove(0);
        let acceptance = self
            .policies
            .acceptance(
                acceptance,
                config(&opts.acceptance_config),
                self.model.config.vocab_size as u32,
            )
            .map_err(|e| anyhow::anyhow!("acceptance {acceptance:?}: {e}"))?;
        Ok(Some(Speculation {
            drafter,
            drafter_spec: spec,
            schedule,
            source_schedules: schedules,
            acceptance,
            draft_max,
        }))
    }

    /// What `req` runs with: the drafter and policies it names, built for
    /// its tenant, and its settings. `req` was checked when it was built
    /// ([`crate::request`]); an error here is a name only the engine can
    /// resolve (a policy, a draft model), and refuses the request.
    pub fn prepare(&self, req: &ValidatedRequest) -> Result<Prepared> {
        let spec = self.speculation_in(&req.tenant, &req.spec, &req.params)?;
        let mut settings = self.settings(req.params.clone(), req.max_tokens, req.stop.clone());
        settings.record = req.trace_rounds;
        settings.ends = req.ends.clone();
        Ok(Prepared { settings, spec })
    }

    /// Runs a request. With a `tenant` (`""`: shared) it starts from the
    /// longest prefix of its prompt that tenant's earlier requests left in
    /// the prefix cache, and leaves its committed tokens there for the next;
    /// `None` runs without the prefix cache.
    pub fn generate(
        &self,
        tenant: Option<&str>,
        prompt: &[u32],
        settings: &Settings,
        spec: Option<Speculation>,
        sink: &mut Sink<'_>,
    ) -> Result<Finished> {
        let (mut target, cached) = self.target_for(tenant, prompt);
        let fin = sequence::generate(
            &mut target,
            &self.tokenizer,
            prompt,
            cached,
            settings,
            spec,
            sink,
        )?;
        self.keep_prefix(tenant, target, &fin);
        Ok(fin)
    }

    /// A target for `prompt` over the longest prefix `tenant`'s part of the
    /// prefix cache holds (`None`: no prefix cache), and that prefix's length.
    pub fn target_for(&self, tenant: Option<&str>, prompt: &[u32]) -> (LlamaTarget, usize) {
        let hit = tenant.and_then(|t| self.prefix_cache().lookup_in(t, prompt));
        match hit {
            Some(h) => (
                LlamaTarget::with_caches(self.model.clone(), h.caches),
                h.len,
            ),
            None => (LlamaTarget::new(self.model.clone()), 0),
        }
    }

    /// Hands a finished request's caches to the prefix cache: only what was
    /// emitted (committed and streamed), nothing past EOS, a stop string or
    /// the budget.
    pub fn keep_prefix(&self, tenant: Option<&str>, mut target: LlamaTarget, fin: &Finished) {
        let keep = target
            .offset()
            .min(fin.stats.prompt_tokens + fin.emitted.len());
        if let Some(t) = tenant {
            if keep > 0 && target.rewind(keep).is_ok() {
                let caches = std::mem::take(&mut target.caches);
                self.prefix_cache().store_in(t, &fin.log[..keep], caches);
            }
        }
    }

    /// The prefix cache. A panic while it was held may have left it half
    /// updated: it then starts over empty rather than fail every later request.
    fn prefix_cache(&self) -> MutexGuard<'_, PrefixCache> {
        self.prefix.lock().unwrap_or_else(|poisoned| {
            let mut cache = poisoned.into_inner();
            *cache = PrefixCache::new(cache.limit_bytes());
            self.prefix.clear_poison();
            cache
        })
    }

    /// Forgets what earlier requests left: the prefix cache's KV states and
    /// the suffix drafter's corpus.
    pub fn clear_caches(&self) {
        let limit = self.prefix_cache().limit_bytes();
        *self.prefix_cache() = PrefixCache::new(limit);
        self.suffix
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    pub fn settings(
        &self,
        params: SamplingParams,
        max_tokens: Option<usize>,
        stop: Vec<String>,
    ) -> Settings {
        Settings {
            params,
            ends: Default::default(),
            max_tokens,
            stop,
            context_length: self.context_length(),
            record: false,
            on_round: None,
            logprobs: None,
            prompt_logprobs: None,
            constraint: None,
            light_rounds: self.switches.light_rounds,
        }
    }
}

/// A prompt's token ids: chat messages through `template`, then
/// `tokenizer` (the engine's [`Engine::encode`], and the server's
/// validation before the queue).
pub fn encode(template: &ChatTemplate, tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>> {
    let text = match prompt {
        Prompt::Tokens(ids) => return Ok(ids.clone()),
        Prompt::Raw(t) => t.clone(),
        Prompt::Chat(m) => template.render(m, true)?,
        Prompt::ChatWithTools(m, tools) => template.render_with_tools(m, tools, true)?,
    };
    tokenizer.encode_prompt(&text)
}
