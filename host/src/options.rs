//! What a request asks of speculation: one type for the CLI flags, the
//! server's defaults (flags and config file) and the HTTP fields, with the
//! drafter parsed once into a [`DrafterSpec`].
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The defaults (docs/architecture.md, "Defaults").
/// `ngram` matches at least 2 tokens: a one-token match drafts mostly
/// chance continuations: on the bench suites `ngram:2-4` did better than
/// `ngram:1-4` on grounded, code and open chat, and as well on repetitive.
pub const DEFAULT_DRAFTER: DrafterSpec = DrafterSpec::Ngram { min: 2, max: 4 };
pub const DEFAULT_SCHEDULE: &str = "throughput";
pub const DEFAULT_DRAFT_MAX: usize = 16;
/// The largest `draft_max` a request may ask for.
pub const MAX_DRAFT_MAX: usize = 64;

/// A drafter by name: `none`, `ngram`, `ngram:MIN-MAX`, `suffix`, `self:N` (the
/// target's first N layers), `model:NAME` (a draft model configured at
/// server start; on the command line, a store name or path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrafterSpec {
    None,
    Ngram {
        min: usize,
        max: usize,
    },
    SelfLayers(usize),
    Model(String),
    /// Suffix decoding over the prompt, the output so far and earlier
    /// requests' outputs.
    Suffix,
    /// A draft head over the target's hidden states: `mtp` the served
    /// model's shipped head, `mtp:NAME` one configured at server start (on
    /// the command line, a head directory).
    Mtp(Option<String>),
    /// `suffix+mtp[:NAME]`: the suffix drafter's proposal where it matched
    /// a long run, that head's otherwise.
    SuffixMtp(Option<String>),
}

impl FromStr for DrafterSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        Ok(match (kind, arg) {
            ("none", None) => DrafterSpec::None,
            ("ngram", None) => DEFAULT_DRAFTER,
            ("suffix", None) => DrafterSpec::Suffix,
            ("ngram", Some(range)) => {
                let bad = || anyhow::anyhow!("bad n-gram range {range:?} (want MIN-MAX)");
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                let (min, max) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if min == 0 || min > max {
                    bail!("bad n-gram range {range:?}: need 1 <= MIN <= MAX");
                }
                DrafterSpec::Ngram { min, max }
            }
            ("self", Some(n)) => DrafterSpec::SelfLayers(
                n.parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .with_context(|| format!("bad drafter {s:?}: want self:N, N >= 1"))?,
            ),
            ("model", Some(name)) if !name.is_empty() => DrafterSpec::Model(name.to_string()),
            ("mtp", None) => DrafterSpec::Mtp(None),
            ("mtp", Some(name)) if !name.is_empty() => DrafterSpec::Mtp(Some(name.to_string())),
            ("suffix+mtp", None) => DrafterSpec::SuffixMtp(None),
            ("suffix+mtp", Some(name)) if !name.is_empty() => {
                DrafterSpec::SuffixMtp(Some(name.to_string()))
            }
            _ => bail!(
                "unknown drafter {s:?} (none, ngram, ngram:MIN-MAX, suffix, self:N, model:NAME, mtp, mtp:NAME, suffix+mtp[:NAME])"
            ),
        })
    }
}

impl fmt::Display for DrafterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DrafterSpec::None => f.write_str("none"),
            d if *d == DEFAULT_DRAFTER => f.write_str("ngram"),
            DrafterSpec::Ngram { min, max } => write!(f, "ngram:{min}-{max}"),
            DrafterSpec::SelfLayers(n) => write!(f, "self:{n}"),
            DrafterSpec::Model(name) => write!(f, "model:{name}"),
            DrafterSpec::Suffix => f.write_str("suffix"),
            DrafterSpec::Mtp(None) => f.write_str("mtp"),
            DrafterSpec::Mtp(Some(name)) => write!(f, "mtp:{name}"),
            DrafterSpec::SuffixMtp(None) => f.write_str("suffix+mtp"),
            DrafterSpec::SuffixMtp(Some(name)) => write!(f, "suffix+mtp:{name}"),
        }
    }
}

impl Serialize for DrafterSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DrafterSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e: anyhow::Error| serde::de::Error::custom(e))
    }
}

/// The speculation knobs of a request. On `specd serve` the same flags (and
/// the config file's `defaults`) set what a request leaves open.
#[derive(Args, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecOptions {
    /// none, ngram, ngram:MIN-MAX, suffix, self:N (first N target layers),
    /// model:NAME, mtp (the model's shipped MTP head), mtp:NAME (on the
    /// command line a head directory), suffix+mtp[:NAME] [default: ngram].
    #[arg(long)]
    pub drafter: Option<DrafterSpec>,
    /// Draft-length schedule: a policy name or content hash [default: throughput].
    #[arg(long)]
    pub schedule: Option<String>,
    /// Acceptance policy [default: greedy at temperature 0, rejection above].
    #[arg(long)]
    pub acceptance: Option<String>,
    /// Largest draft, at most 64 [default: 16].
    #[arg(long)]
    pub draft_max: Option<usize>,
    /// JSON object handed to the schedule's constructor.
    #[arg(long, value_parser = json_object)]
    pub schedule_config: Option<serde_json::Value>,
    /// JSON object handed to the acceptance policy's constructor.
    #[arg(long, value_parser = json_object)]
    pub acceptance_config: Option<serde_json::Value>,
}

/// A flag's JSON object (`--schedule-config '{"k": 4}'`).
fn json_object(s: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str(s) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        Ok(v) => Err(format!("want a JSON object, got {v}")),
        Err(e) => Err(format!("not valid JSON: {e}")),
    }
}

/// A policy's name and the config object for its constructor.
pub type PolicyWithConfig = (String, Option<serde_json::Value>);

/// A policy as a list names it: `NAME` or `NAME:{json}`, the object handed
/// to its constructor (`bench spec --schedules 'constant:{"k":16}'`, `replay
/// --schedule`).
pub fn policy_with_config(s: &str) -> Result<PolicyWithConfig> {
    match s.split_once(":{") {
        Some((name, rest)) => {
            let config = json_object(&format!("{{{rest}"))
                .map_err(|e| anyhow::anyhow!("policy {s:?}: the config is {e}"))?;
            Ok((name.to_string(), Some(config)))
        }
        None => Ok((s.to_string(), None)),
    }
}

/// A comma-separated flag as its items, trimmed, empty ones dropped:
/// `a, b:{"x": 1, "y": 2},,c` -> `[a, b:{"x": 1, "y": 2}, c]` (commas inside
/// a policy's JSON config do not split it).
pub fn split_list(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth, mut quoted, mut escaped) =
        (Vec::new(), String::new(), 0usize, false, false);
    for ch in s.chars() {
        if quoted {
            (quoted, escaped) = (ch != '"' || escaped, ch == '\\' && !escaped);
        } else {
            match ch {
                '"' => quoted = true,
                '{' | '[' => depth += 1,
                '}' | ']' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    out.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
        }
        cur.push(ch);
    }
    out.push(cur);
    out.into_iter()
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

impl SpecOptions {
    /// The drafter the request runs: its own, else [`DEFAULT_DRAFTER`].
    pub fn drafter_or_default(&self) -> DrafterSpec {
        self.drafter.clone().unwrap_or(DEFAULT_DRAFTER)
    }

    /// Fills what `self` leaves open from `defaults` (server defaults).
    pub fn or(&self, defaults: &SpecOptions) -> SpecOptions {
        let pick = |a: &Option<serde_json::Value>, b: &Option<serde_json::Value>| {
            a.clone().or_else(|| b.clone())
        };
        SpecOptions {
            drafter: self.drafter.clone().or_else(|| defaults.drafter.clone()),
            schedule: self.schedule.clone().or_else(|| defaults.schedule.clone()),
            acceptance: self
                .acceptance
                .clone()
                .or_else(|| defaults.acceptance.clone()),
            draft_max: self.draft_max.or(defaults.draft_max),
            schedule_config: pick(&self.schedule_config, &defaults.schedule_config),
            acceptance_config: pick(&self.acceptance_config, &defaults.acceptance_config),
        }
    }

    /// The draft head a command line names (`mtp:PATH`), if any.
    pub fn draft_head(&self) -> Option<&str> {
        match &self.drafter {
            Some(DrafterSpec::Mtp(Some(p)) | DrafterSpec::SuffixMtp(Some(p))) => Some(p),
            _ => None,
        }
    }

    /// The draft model a command line names (`model:PATH`), if any.
    pub fn draft_model(&self) -> Option<&str> {
        match &self.drafter {
            Some(DrafterSpec::Model(m)) => Some(m),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafter_names_parse_and_print_back() {
        for (text, spec) in [
            ("none", DrafterSpec::None),
            ("ngram", DEFAULT_DRAFTER),
            ("ngram:2-5", DrafterSpec::Ngram { min: 2, max: 5 }),
            ("self:4", DrafterSpec::SelfLayers(4)),
            ("model:tiny", DrafterSpec::Model("tiny".into())),
        ] {
            assert_eq!(text.parse::<DrafterSpec>().unwrap(), spec, "{text}");
            assert_eq!(spec.to_string(), text);
        }
        assert_eq!(
            "ngram:3".parse::<DrafterSpec>().unwrap(),
            DrafterSpec::Ngram { min: 3, max: 3 }
        );
        for bad in [
            "",
            "ngram:5-2",
            "ngram:x",
            "ngram:0-2",
            "self:",
            "self:0",
            "self:x",
            "model:",
            "bogus",
            "none:1",
        ] {
            let e = bad.parse::<DrafterSpec>().unwrap_err().to_string();
            assert!(
                e.contains(&format!("{bad:?}")) || e.contains("range"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn policy_lists_keep_their_configs_whole() {
        assert_eq!(
            split_list(r#"constant:{"k": 16, "x": [1, 2]}, heuristic,,throughput:{"prior": 0.5}"#),
            [
                r#"constant:{"k": 16, "x": [1, 2]}"#,
                "heuristic",
                r#"throughput:{"prior": 0.5}"#
            ]
        );
        // A brace or comma inside a JSON string neither nests nor splits.
        assert_eq!(
            split_list(r#"a:{"s": "},\"{,"}, b"#),
            [r#"a:{"s": "},\"{,"}"#, "b"]
        );
        assert_eq!(
            policy_with_config(r#"constant:{"k": 16}"#).unwrap(),
            ("constant".to_string(), Some(serde_json::json!({"k": 16})))
        );
        assert_eq!(
            policy_with_config("greedy").unwrap(),
            ("greedy".to_string(), None)
        );
        for bad in [
            r#"constant:{"k": }"#,
            "constant:{",
            r#"constant:{"k": 1} x"#,
        ] {
            let e = policy_with_config(bad).unwrap_err().to_string();
            assert!(e.contains("constant") && e.contains("config"), "{bad}: {e}");
        }
    }

    #[test]
    fn options_read_from_json_and_fill_from_defaults() {
        let o: SpecOptions =
            serde_json::from_value(serde_json::json!({"drafter": "self:4", "draft_max": 4}))
                .unwrap();
        assert_eq!(o.drafter, Some(DrafterSpec::SelfLayers(4)));
        let e = serde_json::from_value::<SpecOptions>(serde_json::json!({"drafter": "self:x"}))
            .unwrap_err();
        assert!(e.to_string().contains("self:N"), "{e}");
        let d = SpecOptions {
            schedule: Some("heuristic".into()),
            draft_max: Some(8),
            ..Default::default()
        };
        let filled = o.or(&d);
        assert_eq!(filled.schedule.as_deref(), Some("heuristic"));
        assert_eq!(filled.draft_max, Some(4));
    }
}
