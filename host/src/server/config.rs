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
pub const DEFAULT_QUEUE: usize = 16;

#[derive(Args, Clone, Debug, Default)]
pub struct ServeArgs {
    /// Address to listen on [default: 127.0.0.1].
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on (0: any free port) [default: 11435].
    #[arg(long)]
    pub port: Option<u16>,
    /// The served model: a store name, a GGUF file or a Hugging Face
    /// directory [default: smollm2:135m].
    #[arg(long, short)]
    pub model: Option<String>,
    /// Directory of user policies (*.wasm), loaded at start; HTTP uploads
    /// are persisted here [default: $SPECD_HOME/policies].
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
    /// A JSON config file: {host, port, model, policy_dir, queue,
    /// draft_models: {NAME: PATH}, defaults: {drafter, schedule, acceptance,
    /// draft_max, schedule_config, acceptance_config}, policy_limits: {...}}.
    /// Flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A draft model requests can pick as `drafter: "model:NAME"` (repeatable).
    #[arg(long = "draft-model", value_name = "NAME=PATH")]
    pub draft_models: Vec<String>,
    /// Requests that may wait behind the running one; past it: 503 [default: 16].
    #[arg(long)]
    pub queue: Option<usize>,
    /// Append every request's rounds (what the policies saw and answered)
    /// to this JSONL trace file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Defaults for what a request leaves open.
    #[command(flatten)]
    pub defaults: SpecOptions,
}

/// The config file's shape.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    host: Option<String>,
    port: Option<u16>,
    model: Option<String>,
    policy_dir: Option<PathBuf>,
    queue: Option<usize>,
    #[serde(default)]
    draft_models: BTreeMap<String, String>,
    #[serde(default)]
    defaults: SpecOptions,
    /// Overrides of the policy host's limits (HostConfig fields).
    policy_limits: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Everything `serve` needs, resolved.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    pub model: String,
    pub policy_dir: PathBuf,
    pub queue: usize,
    pub draft_models: BTreeMap<String, String>,
    pub defaults: SpecOptions,
    pub policy_limits: HostConfig,
    /// Trace file every request's rounds are appended to.
    pub record: Option<PathBuf>,
    /// How the model's weights are held (the global `--weights`).
    pub weights: crate::model::WeightMode,
}

impl ServerConfig {
    pub fn from_args(a: &ServeArgs) -> Result<ServerConfig> {
        let file: FileConfig = match &a.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("reading config {}", p.display()))?;
                serde_json::from_str(&text)
                    .with_context(|| format!("config {} is not valid", p.display()))?
            }
            None => FileConfig::default(),
        };
        let mut draft_models = file.draft_models;
        for d in &a.draft_models {
            let Some((name, path)) = d.split_once('=') else {
                bail!("--draft-model wants NAME=PATH, got {d:?}");
            };
            if name.is_empty() || path.is_empty() {
                bail!("--draft-model wants NAME=PATH, got {d:?}");
            }
            draft_models.insert(name.to_string(), path.to_string());
        }
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
            draft_models,
            defaults: a.defaults.or(&file.defaults),
            policy_limits,
            record: a.record.clone(),
            weights: crate::model::WeightMode::default(),
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
}
