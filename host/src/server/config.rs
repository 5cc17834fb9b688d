//! `specd serve` flags and the optional JSON config file (flags win).
use crate::options::SpecOptions;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Deserialize;
use specd_policy::HostConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;

pub const DEFAULT_HOST: &str = "127.0.0.1";
pub const DEFAULT_PORT: u16 = 11435;
/// Requests a burst may queue: what a server of this size serves within
/// seconds to a minute, where a queue of 16 turned most of a 64-client
/// burst away. A queued request holds only its parsed body.
pub const DEFAULT_QUEUE: usize = 512;
/// Uploaded (user) policies held at once.
pub const DEFAULT_REGISTRY_MAX_POLICIES: usize = 16;
/// Their component bytes together.
pub const DEFAULT_REGISTRY_MAX_BYTES: u64 = 256 << 20;
/// The body limit of every route but the policy upload (which takes
/// `policy_limits.max_component_bytes`).
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;
/// Policy uploads read and compiled at once (compiling takes seconds of CPU).
pub const DEFAULT_MAX_CONCURRENT_UPLOADS: usize = 2;

#[derive(Args, Clone, Debug, Default)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on (0: any free port) [default: 11435].
    #[arg(long)]
    pub port: Option<u16>,
    /// The served model: a store name, `ollama:NAME[:TAG]`,
    /// `hf:ORG/NAME[@REVISION][:FILE]`, a GGUF file or a Hugging Face
    /// directory [default: smollm2:135m]; clients name it as given here
    /// (or `default`).
    #[arg(long, short)]
    pub model: Option<String>,
    /// Directory of user policies (*.wasm), loaded at start; HTTP uploads
    /// are persisted here [default: $SPECD_HOME/policies].
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
    /// A JSON config file: {host, port, model, policy_dir, policy_store, queue, drain_seconds,
    /// max_sequences, step_tokens, kv_budget,
    /// draft_models: {NAME: PATH}, draft_heads: {NAME: PATH}, defaults: {drafter, schedule, acceptance,
    /// draft_max, schedule_config, acceptance_config}, policy_limits: {...},
    /// api_keys: [KEY...], admin_key, metrics_key_required,
    /// registry_max_policies, registry_max_bytes, max_body_bytes,
    /// max_concurrent_uploads, max_prompt_tokens, max_tokens,
    /// require_lossless}. Flags (then
    /// SPECD_API_KEYS / SPECD_ADMIN_KEY) override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A draft model requests can pick as `drafter: "model:NAME"` (repeatable).
    #[arg(long = "draft-model", value_name = "NAME=PATH")]
    pub draft_models: Vec<String>,
    /// An MTP draft head (a directory `specd drafter train` wrote) requests
    /// can pick as `drafter: "mtp:NAME"` (repeatable); `mtp` alone is the
    /// model's shipped head.
    #[arg(long = "draft-head", value_name = "NAME=PATH")]
    pub draft_heads: Vec<String>,
    /// Requests that may wait to be admitted; past it: 503 + Retry-After
    /// [default: 512].
    #[arg(long)]
    pub queue: Option<usize>,
    /// A policy registry replicas share (a directory on a shared
    /// filesystem): uploads and deletes on any replica reach every other
    /// within seconds; requests may pin `NAME@sha256:HEX`.
    #[arg(long, value_name = "DIR")]
    pub policy_store: Option<PathBuf>,
    /// On SIGTERM: admit nothing new (503), let running requests finish
    /// for up to this many seconds, end the rest with an error, exit 0
    /// [default: 60].
    #[arg(long, value_name = "N")]
    pub drain_seconds: Option<u64>,
    /// Requests decoding at once, their rows batched into one forward per
    /// step; more wait in the queue [default: 16].
    #[arg(long, value_name = "N")]
    pub max_sequences: Option<usize>,
    /// Prefill rows one step takes at most besides the decode rows
    /// [default: 512]. Beside requests already streaming, a step takes
    /// fewer: what keeps it within about 4 of their steps alone (at least
    /// 16 rows), so a long prompt never stalls them.
    #[arg(long, value_name = "N")]
    pub step_tokens: Option<usize>,
    /// Bytes of KV cache the running requests may hold together; past it
    /// the most recently admitted is preempted (and later resumed) [default:
    /// a quarter of the machine's memory].
    #[arg(long, value_name = "BYTES")]
    pub kv_budget: Option<usize>,
    /// Append every request's rounds (what the policies saw and answered)
    /// to this JSONL trace file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// An API key for inference (repeatable; env SPECD_API_KEYS,
    /// comma-separated). With keys, every /api and /v1 route needs
    /// `Authorization: Bearer KEY`.
    #[arg(long = "api-key", value_name = "KEY")]
    pub api_keys: Vec<String>,
    /// The key that may upload and delete policies (env SPECD_ADMIN_KEY).
    /// With any key configured and no admin key, or on a non-loopback
    /// address without one, the policy registry is read-only.
    #[arg(long, value_name = "KEY")]
    pub admin_key: Option<String>,
    /// /metrics needs a key too (an API key or the admin key).
    #[arg(long)]
    pub metrics_key_required: bool,
    /// Uploaded policies held at once; past it uploads get 507 [default: 16].
    #[arg(long, value_name = "N")]
    pub registry_max_policies: Option<usize>,
    /// Bytes of uploaded policies together; past it uploads get 507
    /// [default: 268435456 (256 MiB)].
    #[arg(long, value_name = "BYTES")]
    pub registry_max_bytes: Option<u64>,
    /// Largest request body of every route but the policy upload; past it:
    /// 413 [default: 4194304 (4 MiB)].
    #[arg(long, value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Policy uploads handled at once; past it: 429 + Retry-After [default: 2].
    #[arg(long, value_name = "N")]
    pub max_concurrent_uploads: Option<usize>,
    /// Most prompt tokens a request may have; past it: 400 [default: the
    /// model's context length].
    #[arg(long, value_name = "N")]
    pub max_prompt_tokens: Option<usize>,
    /// Most tokens a request may ask to generate (max_tokens, num_predict);
    /// more: 400; a request that sets none gets this many at most [default:
    /// until the end of generation or the context limit].
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Serve only acceptance policies verified lossless: a request naming
    /// one that has not passed the conformance harness on its exact hash
    /// (run once, at its first use, when it never was) gets a 400 that says
    /// why; `greedy` only for greedy (temperature 0) requests.
    #[arg(long)]
    pub require_lossless: bool,
    /// A request that sets no temperature decodes greedily (no penalties,
    /// seed 0) instead of getting its API's documented sampling defaults
    /// (OpenAI: temperature 1; Ollama: temperature 0.8, top_k 40, top_p 0.9,
    /// repeat_penalty 1.1) with a fresh seed.
    #[arg(long)]
    pub greedy_default: bool,
    /// Which distribution `logprobs` describe: `raw` (the log-softmax of the
    /// logits, before penalties and temperature; the default) or `processed`
    /// (the final sampling distribution).
    #[arg(long, value_enum, value_name = "MODE")]
    pub logprobs_mode: Option<crate::sampling::LogprobMode>,
    /// Responses (`/v1/responses` with `store`) kept in memory per API key
    /// for `previous_response_id`; past it the oldest is evicted; 0 keeps
    /// none [default: 100].
    #[arg(long, value_name = "N")]
    pub responses_history: Option<usize>,
    /// Defaults for what a request leaves open.
    #[command(flatten)]
    pub defaults: SpecOptions,
}

/// Stored responses per API key (`--responses-history`).
pub const DEFAULT_RESPONSES_HISTORY: usize = 100;

/// The config file's shape.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    host: Option<String>,
    port: Option<u16>,
    model: Option<String>,
    policy_dir: Option<PathBuf>,
    queue: Option<usize>,
    drain_seconds: Option<u64>,
    policy_store: Option<PathBuf>,
    max_sequences: Option<usize>,
    step_tokens: Option<usize>,
    kv_budget: Option<usize>,
    #[serde(default)]
    draft_models: BTreeMap<String, String>,
    #[serde(default)]
    draft_heads: BTreeMap<String, String>,
    #[serde(default)]
    defaults: SpecOptions,
    /// Overrides of the policy host's limits (HostConfig fields).
    policy_limits: Option<serde_json::Map<String, serde_json::Value>>,
    api_keys: Option<Vec<String>>,
    admin_key: Option<String>,
    metrics_key_required: Option<bool>,
    registry_max_policies: Option<usize>,
    registry_max_bytes: Option<u64>,
    max_body_bytes: Option<usize>,
    max_concurrent_uploads: Option<usize>,
    max_prompt_tokens: Option<usize>,
    max_tokens: Option<usize>,
    require_lossless: Option<bool>,
    greedy_default: Option<bool>,
    logprobs_mode: Option<crate::sampling::LogprobMode>,
    responses_history: Option<usize>,
}

/// A key: shown as `***` by `Debug`, so configs can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// Who may do what, and how much.
#[derive(Debug, Clone, Default)]
pub struct AccessConfig {
    /// Keys for inference (`/api/*`, `/v1/*`); empty: open.
    pub api_keys: Vec<Secret>,
    /// The key for policy upload and delete.
    pub admin_key: Option<Secret>,
    pub metrics_key_required: bool,
}

/// Quotas and per-request limits.
#[derive(Debug, Clone)]
pub struct Limits {
    pub registry_max_policies: usize,
    pub registry_max_bytes: u64,
    pub max_body_bytes: usize,
    pub max_concurrent_uploads: usize,
    /// `None`: the context length decides.
    pub max_prompt_tokens: Option<usize>,
    /// `None`: until the end of generation or the context limit.
    pub max_tokens: Option<usize>,
    /// Only acceptance policies the conformance harness verified lossless.
    pub require_lossless: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            registry_max_policies: DEFAULT_REGISTRY_MAX_POLICIES,
            registry_max_bytes: DEFAULT_REGISTRY_MAX_BYTES,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_concurrent_uploads: DEFAULT_MAX_CONCURRENT_UPLOADS,
            max_prompt_tokens: None,
            max_tokens: None,
            require_lossless: false,
        }
    }
}

/// A key must fit an HTTP header as `Bearer KEY`: visible ASCII, no spaces.
fn check_key(k: &str, what: &str) -> Result<Secret> {
    if k.is_empty() {
        bail!("{what}: a key must not be empty");
    }
    if !k.bytes().all(|b| b.is_ascii_graphic()) {
        bail!("{what}: a key must be visible ASCII without spaces (it travels as `Authorization: Bearer KEY`)");
    }
    Ok(Secret(k.to_string()))
}

/// Keys from flags, else the environment, else the config file.
fn access_config(
    a: &ServeArgs,
    file: &FileConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<AccessConfig> {
    let api: Vec<String> = if !a.api_keys.is_empty() {
        a.api_keys.clone()
    } else if let Some(v) = env("SPECD_API_KEYS").filter(|v| !v.trim().is_empty()) {
        v.split(',')
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect()
    } else {
        file.api_keys.clone().unwrap_or_default()
    };
    let api_keys = api
        .iter()
        .map(|k| check_key(k, "API key"))
        .collect::<Result<Vec<_>>>()?;
    let admin = a
        .admin_key
        .clone()
        .or_else(|| env("SPECD_ADMIN_KEY").filter(|v| !v.trim().is_empty()))
        .or_else(|| file.admin_key.clone());
    let admin_key = admin
        .map(|k| check_key(k.trim(), "admin key"))
        .transpose()?;
    if let Some(adm) = &admin_key {
        if api_keys.contains(adm) {
            bail!("the admin key must differ from every API key");
        }
    }
    Ok(AccessConfig {
        api_keys,
        admin_key,
        metrics_key_required: a.metrics_key_required || file.metrics_key_required.unwrap_or(false),
    })
}

/// Everything `serve` needs, resolved.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    pub model: String,
    pub policy_dir: PathBuf,
    pub queue: usize,
    /// `--drain-seconds`.
    pub drain_seconds: u64,
    /// `--policy-store`.
    pub policy_store: Option<PathBuf>,
    pub draft_models: BTreeMap<String, String>,
    /// `--draft-head NAME=PATH` (and the file's `draft_heads`).
    pub draft_heads: BTreeMap<String, String>,
    pub defaults: SpecOptions,
    pub policy_limits: HostConfig,
    /// Trace file every request's rounds are appended to.
    pub record: Option<PathBuf>,
    /// How the model's weights are held (the global `--weights`).
    pub weights: crate::model::WeightMode,
    /// The global `--kv-rows`, `--light-rounds`.
    pub switches: crate::load::Switches,
    /// The pipeline group this process is rank 0 of (`None`: one process).
    pub ranks: Option<std::sync::Arc<crate::ranks::Joined>>,
    pub access: AccessConfig,
    pub limits: Limits,
    /// Continuous batching: requests at once, prefill rows per step.
    pub batch: crate::scheduler::BatchLimits,
    /// `--greedy-default`: greedy sampling defaults for every API.
    pub greedy_default: bool,
    /// `--logprobs-mode`.
    pub logprobs_mode: crate::sampling::LogprobMode,
    /// `--responses-history`: stored responses per API key.
    pub responses_history: usize,
}

impl ServerConfig {
    /// From the flags, the config file they name and the process environment.
    pub fn from_args(a: &ServeArgs) -> Result<ServerConfig> {
        Self::from_args_env(a, &|k| std::env::var(k).ok())
    }

    /// [`from_args`](Self::from_args) with `env` for the environment.
    pub fn from_args_env(
        a: &ServeArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ServerConfig> {
        let file: FileConfig = match &a.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading config {}", p.display()))?;
                serde_json::from_str(&text)
                    .with_context(|| format!("config {} is not valid", p.display()))?
            }
            None => FileConfig::default(),
        };
        let access = access_config(a, &file, env)?;
        let d = Limits::default();
        let limits = Limits {
            registry_max_policies: a
                .registry_max_policies
                .or(file.registry_max_policies)
                .unwrap_or(d.registry_max_policies),
            registry_max_bytes: a
                .registry_max_bytes
                .or(file.registry_max_bytes)
                .unwrap_or(d.registry_max_bytes),
            max_body_bytes: a
                .max_body_bytes
                .or(file.max_body_bytes)
                .unwrap_or(d.max_body_bytes),
            max_concurrent_uploads: a
                .max_concurrent_uploads
                .or(file.max_concurrent_uploads)
                .unwrap_or(d.max_concurrent_uploads),
            max_prompt_tokens: a.max_prompt_tokens.or(file.max_prompt_tokens),
            max_tokens: a.max_tokens.or(file.max_tokens),
            require_lossless: a.require_lossless || file.require_lossless.unwrap_or(false),
        };
        let batch = crate::scheduler::BatchLimits {
            max_sequences: a
                .max_sequences
                .or(file.max_sequences)
                .unwrap_or(crate::scheduler::DEFAULT_MAX_SEQUENCES),
            step_tokens: a
                .step_tokens
                .or(file.step_tokens)
                .unwrap_or(crate::scheduler::DEFAULT_STEP_TOKENS),
            kv_budget: Some(
                a.kv_budget
                    .or(file.kv_budget)
                    .unwrap_or_else(crate::scheduler::default_kv_budget),
            ),
        };
        for (v, name) in [
            (batch.max_sequences, "max_sequences"),
            (batch.step_tokens, "step_tokens"),
            (batch.kv_budget.unwrap_or(1), "kv_budget"),
            (limits.max_body_bytes, "max_body_bytes"),
            (limits.max_concurrent_uploads, "max_concurrent_uploads"),
            (limits.max_prompt_tokens.unwrap_or(1), "max_prompt_tokens"),
            (limits.max_tokens.unwrap_or(1), "max_tokens"),
        ] {
            if v == 0 {
                bail!("{name} must be at least 1");
            }
        }
        let named = |flag: &str, into: &mut BTreeMap<String, String>, args: &[String]| {
            for d in args {
                match d.split_once('=') {
                    Some((name, path)) if !name.is_empty() && !path.is_empty() => {
                        into.insert(name.to_string(), path.to_string());
                    }
                    _ => bail!("{flag} wants NAME=PATH, got {d:?}"),
                }
            }
            Ok(())
        };
        let mut draft_models = file.draft_models;
        named("--draft-model", &mut draft_models, &a.draft_models)?;
        let mut draft_heads = file.draft_heads;
        named("--draft-head", &mut draft_heads, &a.draft_heads)?;
        let mut policy_limits = HostConfig::default();
        if let Some(over) = file.policy_limits {
            let mut v = serde_json::to_value(&policy_limits)?;
            let obj = v.as_object_mut().expect("HostConfig is an object");
            for (k, x) in over {
                if !obj.contains_key(&k) {
                    bail!(
                        "unknown policy_limits key {k:?} (known: {})",
                        obj.keys().cloned().collect::<Vec<_>>().join(", ")
                    );
                }
                obj.insert(k, x);
            }
            policy_limits = serde_json::from_value(v).context("policy_limits")?;
        }
        let mut model = a
            .model
            .clone()
            .or(file.model)
            .unwrap_or_else(|| crate::store::DEFAULT_MODEL.to_string());
        if model == "default" {
            model = crate::store::DEFAULT_MODEL.to_string();
        }
        Ok(ServerConfig {
            host: a
                .host
                .clone()
                .or(file.host)
                .unwrap_or_else(|| DEFAULT_HOST.to_string()),
            port: a.port.or(file.port).unwrap_or(DEFAULT_PORT),
            model,
            policy_dir: a
                .policy_dir
                .clone()
                .or(file.policy_dir)
                .unwrap_or_else(|| crate::store::home().join("policies")),
            queue: a.queue.or(file.queue).unwrap_or(DEFAULT_QUEUE),
            policy_store: a.policy_store.clone().or(file.policy_store),
            drain_seconds: a
                .drain_seconds
                .or(file.drain_seconds)
                .unwrap_or(super::lifecycle::DEFAULT_DRAIN_SECONDS),
            draft_models,
            draft_heads,
            defaults: a.defaults.or(&file.defaults),
            policy_limits,
            record: a.record.clone(),
            weights: crate::model::WeightMode::default(),
            switches: Default::default(),
            ranks: None,
            access,
            limits,
            batch,
            greedy_default: a.greedy_default || file.greedy_default.unwrap_or(false),
            logprobs_mode: a.logprobs_mode.or(file.logprobs_mode).unwrap_or_default(),
            responses_history: a
                .responses_history
                .or(file.responses_history)
                .unwrap_or(DEFAULT_RESPONSES_HISTORY),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_config_file() {
        let dir = std::env::temp_dir().join(format!("specd-serve-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.json");
        std::fs::write(
            &file,
            r#"{"port": 9999, "queue": 3, "draft_models": {"tiny": "/x.gguf"},
                "defaults": {"schedule": "heuristic", "draft_max": 8},
                "policy_limits": {"fuel_per_call": 1000}}"#,
        )
        .unwrap();
        let a = ServeArgs {
            config: Some(file.clone()),
            port: Some(1234),
            defaults: SpecOptions {
                draft_max: Some(4),
                ..Default::default()
            },
            draft_models: vec!["small=/y.gguf".into()],
            ..Default::default()
        };
        let c = ServerConfig::from_args(&a).unwrap();
        assert_eq!(c.port, 1234);
        assert_eq!(c.queue, 3);
        assert_eq!(c.host, DEFAULT_HOST);
        assert_eq!(c.model, crate::store::DEFAULT_MODEL);
        assert_eq!(c.defaults.schedule.as_deref(), Some("heuristic"));
        assert_eq!(c.defaults.draft_max, Some(4));
        assert_eq!(c.draft_models.len(), 2);
        assert_eq!(c.policy_limits.fuel_per_call, 1000);

        std::fs::write(&file, r#"{"policy_limits": {"fuel": 1}}"#).unwrap();
        let e = ServerConfig::from_args(&a).unwrap_err();
        assert!(format!("{e:#}").contains("fuel"), "{e:#}");
        std::fs::write(&file, r#"{"prot": 1}"#).unwrap();
        assert!(ServerConfig::from_args(&a).is_err());
        let bad = ServeArgs {
            draft_models: vec!["noequals".into()],
            ..Default::default()
        };
        assert!(ServerConfig::from_args(&bad).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn keys_come_from_flags_then_env_then_the_file() {
        let dir = std::env::temp_dir().join(format!("specd-serve-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("serve.json");
        std::fs::write(
            &file,
            r#"{"api_keys": ["file-a", "file-b"], "admin_key": "file-admin",
                "metrics_key_required": true, "registry_max_policies": 3,
                "max_tokens": 100}"#,
        )
        .unwrap();
        let no_env = |_: &str| None;
        let env = |k: &str| match k {
            "SPECD_API_KEYS" => Some(" env-a, env-b ,,".to_string()),
            "SPECD_ADMIN_KEY" => Some("env-admin".to_string()),
            _ => None,
        };
        let a = ServeArgs {
            config: Some(file.clone()),
            ..Default::default()
        };
        let keys = |c: &ServerConfig| -> Vec<String> {
            c.access.api_keys.iter().map(|k| k.0.clone()).collect()
        };
        let c = ServerConfig::from_args_env(&a, &no_env).unwrap();
        assert_eq!(keys(&c), ["file-a", "file-b"]);
        assert_eq!(c.access.admin_key, Some(Secret("file-admin".into())));
        assert!(c.access.metrics_key_required);
        assert_eq!(c.limits.registry_max_policies, 3);
        assert_eq!(c.limits.registry_max_bytes, DEFAULT_REGISTRY_MAX_BYTES);
        assert_eq!(c.limits.max_tokens, Some(100));
        assert_eq!(c.limits.max_prompt_tokens, None);
        let c = ServerConfig::from_args_env(&a, &env).unwrap();
        assert_eq!(keys(&c), ["env-a", "env-b"]);
        assert_eq!(c.access.admin_key, Some(Secret("env-admin".into())));
        let flags = ServeArgs {
            api_keys: vec!["flag-a".into()],
            admin_key: Some("flag-admin".into()),
            max_tokens: Some(7),
            ..a.clone()
        };
        let c = ServerConfig::from_args_env(&flags, &env).unwrap();
        assert_eq!(keys(&c), ["flag-a"]);
        assert_eq!(c.access.admin_key, Some(Secret("flag-admin".into())));
        assert_eq!(c.limits.max_tokens, Some(7));
        // keys never show in Debug
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("flag-a") && !dbg.contains("flag-admin"),
            "{dbg}"
        );

        let bad = |f: ServeArgs| ServerConfig::from_args_env(&f, &no_env).unwrap_err();
        let e = bad(ServeArgs {
            api_keys: vec!["has space".into()],
            ..Default::default()
        });
        assert!(format!("{e:#}").contains("visible ASCII"), "{e:#}");
        let e = bad(ServeArgs {
            api_keys: vec!["same".into()],
            admin_key: Some("same".into()),
            ..Default::default()
        });
        assert!(format!("{e:#}").contains("differ"), "{e:#}");
        let e = bad(ServeArgs {
            max_tokens: Some(0),
            ..Default::default()
        });
        assert!(format!("{e:#}").contains("max_tokens"), "{e:#}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
