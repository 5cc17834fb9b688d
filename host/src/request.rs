//! One validated request, after TGI's `router/src/validation.rs`: a front
//! end reads its wire format (an OpenAI or Ollama body) and turns it into a
//! [`ValidatedRequest`] through the checks here, once. The worker and the
//! engine take that type and check nothing again. A refusal is a
//! [`RequestError`]: typed, so that tests match on it, and naming its field
//! (OpenAI's `error.param`).
use crate::options::{DrafterSpec, SpecOptions};
use crate::sampling::logprobs::MAX_TOP_LOGPROBS;
use crate::sampling::{JsonFormat, LogprobMode, LogprobRequest, SamplingError, SamplingParams};
use crate::sequence::EndRules;
use serde::Deserialize;
use serde_json::Value;

/// A request's input: raw text, token ids or chat messages.
#[derive(Debug, Clone)]
pub enum Prompt {
    Raw(String),
    /// Token ids as given (completions' token-id prompts): no BOS added,
    /// each below the vocabulary size (checked by the front end).
    Tokens(Vec<u32>),
    Chat(Vec<specd_text::ChatMessage>),
    /// Chat messages and the tools the template renders (OpenAI function
    /// objects, the template's `tools`).
    ChatWithTools(Vec<specd_text::ChatMessage>, Vec<serde_json::Value>),
}

impl Prompt {
    /// One user turn, after a system message where `system` gives one.
    pub fn user_turn(system: Option<String>, text: String) -> Prompt {
        let system = system.map(specd_text::ChatMessage::system);
        let user = specd_text::ChatMessage::user(text);
        Prompt::Chat(system.into_iter().chain([user]).collect())
    }
}

/// A request that passed every check a front end can make (the prompt's
/// length against the context is the worker's, once it is tokenized).
#[derive(Debug, Clone)]
pub struct ValidatedRequest {
    pub prompt: Prompt,
    /// In range ([`RequestOptions::sampling`]), defaults filled in.
    pub params: SamplingParams,
    /// Within the server's limit ([`max_tokens`]).
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// The drafter parsed ([`DrafterSpec`]), merged with the server defaults
    /// ([`RequestOptions::speculation`]). Names of policies and draft models are resolved when the
    /// request starts.
    pub spec: SpecOptions,
    /// Send each round's trace as the round ends.
    pub trace_rounds: bool,
    /// Whose prefix cache and carried policy state the request uses: the
    /// caller's key id, or `""` (shared) when no key was needed.
    pub tenant: String,
    /// Send each emitted token's logprobs before its text ([`logprobs`]).
    pub logprobs: Option<LogprobRequest>,
    /// What the output must be: a JSON format or a forced tool call's grammar.
    pub format: Option<JsonFormat>,
    /// Also send the prompt's logprobs (completions' `echo`), with
    /// `logprobs`' request.
    pub prompt_logprobs: bool,
    /// How generation may end besides EOS, the budget and `stop`
    /// ([`RequestOptions::ends`]).
    pub ends: EndRules,
}

/// Why a request was refused. The messages are the ones clients saw before
/// this type existed.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestError {
    /// A sampling parameter out of its range.
    Sampling(SamplingError),
    /// An integer outside what its field allows.
    OutOfRange {
        field: String,
        value: i64,
        allowed: String,
    },
    /// A name that must not be empty (`drafter`, `schedule`, `acceptance`).
    Empty { field: &'static str },
    /// A drafter that does not parse.
    Drafter { problem: String },
    /// A policy config that is not a JSON object (or a string holding one).
    NotAnObject {
        field: &'static str,
        problem: String,
    },
    /// More tokens than the server's `max_tokens` limit.
    OverLimit {
        field: String,
        value: usize,
        limit: usize,
    },
    /// A field that needs another (`top_logprobs` without `logprobs`).
    Needs { field: String, needs: &'static str },
    /// Two fields that say the same thing differently
    /// (`repetition_penalty` and `repeat_penalty`).
    Conflict {
        field: &'static str,
        other: &'static str,
    },
}

impl RequestError {
    /// The field at fault.
    pub fn field(&self) -> &str {
        match self {
            RequestError::Sampling(e) => e.field,
            RequestError::OutOfRange { field, .. }
            | RequestError::OverLimit { field, .. }
            | RequestError::Needs { field, .. } => field,
            RequestError::Conflict { field, .. } => field,
            RequestError::Empty { field } | RequestError::NotAnObject { field, .. } => field,
            RequestError::Drafter { .. } => "drafter",
        }
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Sampling(e) => e.fmt(f),
            RequestError::OutOfRange {
                field,
                value,
                allowed,
            } => write!(f, "{field} must be {allowed}, got {value}"),
            RequestError::Empty { field } => write!(f, "{field} must not be empty"),
            RequestError::Drafter { problem } => write!(f, "drafter: {problem}"),
            RequestError::NotAnObject { field, problem } => write!(f, "{field} {problem}"),
            RequestError::OverLimit {
                field,
                value,
                limit,
            } => write!(
                f,
                "{field} = {value} is over this server's limit of {limit} tokens (max_tokens)"
            ),
            RequestError::Needs { field, needs } => write!(f, "{field} needs {needs}"),
            RequestError::Conflict { field, other } => write!(
                f,
                "{field} and {other} are the same penalty: give one, or both at the same value"
            ),
        }
    }
}

impl std::error::Error for RequestError {}

impl From<SamplingError> for RequestError {
    fn from(e: SamplingError) -> Self {
        RequestError::Sampling(e)
    }
}

/// A non-negative integer field (`draft_max`, `max_tokens`, ...).
pub fn non_negative(field: &str, v: Option<i64>) -> Result<Option<usize>, RequestError> {
    match v {
        Some(n) if n < 0 => Err(RequestError::OutOfRange {
            field: field.to_string(),
            value: n,
            allowed: ">= 0".into(),
        }),
        Some(n) => Ok(Some(n as usize)),
        None => Ok(None),
    }
}

/// `stop`: a string or a list of strings.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect()
    }
}

/// The sampling and speculation fields both APIs share, as sent (Ollama:
/// inside `options`; OpenAI: at the top level of the body). The sampling
/// fields are also `specd generate`'s and `specd bench spec`'s flags, so the
/// command line goes through the same checks; it takes the speculation flags
/// typed ([`SpecOptions`]) and the stop strings as its own repeatable flag.
#[derive(Deserialize, clap::Args, Debug, Default, Clone)]
#[serde(default)]
pub struct RequestOptions {
    /// 0: greedy (argmax) [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// 0 disables [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub top_k: Option<i64>,
    /// 1 disables [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// 0 disables [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// 1 disables [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
    /// Recent tokens the penalties look at; -1: all [default: 64].
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_last_n: Option<i64>,
    /// Subtracted once from every token seen in the last 64 (OpenAI's
    /// presence_penalty) [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// Subtracted per occurrence in the last 64 tokens (OpenAI's
    /// frequency_penalty) [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// The sampling seed; negative: a fresh one [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<i64>,
    #[arg(skip)]
    pub stop: Option<StopField>,
    #[arg(skip)]
    pub drafter: Option<String>,
    #[arg(skip)]
    pub schedule: Option<String>,
    #[arg(skip)]
    pub acceptance: Option<String>,
    #[arg(skip)]
    pub draft_max: Option<i64>,
    #[arg(skip)]
    pub schedule_config: Option<Value>,
    #[arg(skip)]
    pub acceptance_config: Option<Value>,
    // vLLM's and SGLang's request extensions, which routers and benchmark
    // clients send ([`RequestOptions::ends`]; `repetition_penalty` is read
    // by [`RequestOptions::sampling`]).
    /// vLLM's repetition penalty: `repeat_penalty` over the whole context.
    #[arg(skip)]
    pub repetition_penalty: Option<f32>,
    #[arg(skip)]
    pub ignore_eos: Option<bool>,
    #[arg(skip)]
    pub min_tokens: Option<i64>,
    #[arg(skip)]
    pub stop_token_ids: Option<Vec<i64>>,
    #[arg(skip)]
    pub include_stop_str_in_output: Option<bool>,
    /// SGLang's name for `include_stop_str_in_output`.
    #[arg(skip)]
    pub no_stop_trim: Option<bool>,
    #[arg(skip)]
    pub skip_special_tokens: Option<bool>,
}

fn nonempty(s: &Option<String>, field: &'static str) -> Result<Option<String>, RequestError> {
    match s {
        Some(s) if s.trim().is_empty() => Err(RequestError::Empty { field }),
        s => Ok(s.clone()),
    }
}

/// What is left to check of speculation options that arrive typed (the
/// command line's flags, parsed by clap with the same [`DrafterSpec`] and
/// JSON-object parsers): the policy names.
pub fn checked(o: SpecOptions) -> Result<SpecOptions, RequestError> {
    nonempty(&o.schedule, "schedule")?;
    nonempty(&o.acceptance, "acceptance")?;
    Ok(o)
}

/// A policy config: a JSON object, or a string holding one.
fn config_json(v: &Option<Value>, field: &'static str) -> Result<Option<Value>, RequestError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            serde_json::from_str(s)
                .map(Some)
                .map_err(|e| RequestError::NotAnObject {
                    field,
                    problem: format!("is not valid JSON: {e}"),
                })
        }
        Some(v @ Value::Object(_)) => Ok(Some(v.clone())),
        Some(v) => Err(RequestError::NotAnObject {
            field,
            problem: format!("must be a JSON object, got {v}"),
        }),
    }
}

impl RequestOptions {
    /// The sampling parameters: what the request sets, `defaults` for the
    /// rest (a fresh seed when it sets none and `fresh_seed`), checked.
    pub fn sampling(
        &self,
        defaults: &SamplingParams,
        fresh_seed: bool,
    ) -> Result<SamplingParams, RequestError> {
        let d = defaults;
        // vLLM: -1 turns top-k off, as 0 does here.
        let top_k = match self.top_k {
            Some(-1) => Some(0),
            k => non_negative("top_k", k)?,
        };
        let top_k = top_k.unwrap_or(d.top_k);
        let repetition = match (self.repetition_penalty, self.repeat_penalty) {
            (Some(a), Some(b)) if a != b => {
                return Err(RequestError::Conflict {
                    field: "repetition_penalty",
                    other: "repeat_penalty",
                })
            }
            (r, _) => r,
        };
        let repeat_last_n = match self.repeat_last_n {
            Some(n) if n < -1 => {
                return Err(RequestError::OutOfRange {
                    field: "repeat_last_n".into(),
                    value: n,
                    allowed: ">= -1".into(),
                })
            }
            Some(-1) => usize::MAX,
            Some(n) => n as usize,
            // vLLM's penalty counts the prompt and the output, no window.
            None if repetition.is_some() => usize::MAX,
            None => d.repeat_last_n,
        };
        let seed = match self.seed {
            // Ollama: a negative seed means "random".
            Some(s) if s < 0 => crate::sampling::fresh_seed(),
            Some(s) => s as u64,
            None if fresh_seed => crate::sampling::fresh_seed(),
            None => d.seed,
        };
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k,
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: repetition
                .or(self.repeat_penalty)
                .unwrap_or(d.repeat_penalty),
            repeat_last_n,
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            seed,
        };
        p.validate()?;
        Ok(p)
    }

    /// The speculation options, the drafter parsed, merged with the
    /// server's `defaults`.
    pub fn speculation(&self, defaults: &SpecOptions) -> Result<SpecOptions, RequestError> {
        let drafter = nonempty(&self.drafter, "drafter")?
            .map(|d| d.parse::<DrafterSpec>())
            .transpose()
            .map_err(|e| RequestError::Drafter {
                problem: e.to_string(),
            })?;
        let o = SpecOptions {
            drafter,
            schedule: nonempty(&self.schedule, "schedule")?,
            acceptance: nonempty(&self.acceptance, "acceptance")?,
            draft_max: non_negative("draft_max", self.draft_max)?,
            schedule_config: config_json(&self.schedule_config, "schedule_config")?,
            acceptance_config: config_json(&self.acceptance_config, "acceptance_config")?,
        };
        Ok(o.or(defaults))
    }

    /// How generation may end besides EOS, the budget and `stop`; a stop
    /// token must be below `vocab`. Absent fields keep what every API did
    /// before them (specd streams special tokens' text unless
    /// `skip_special_tokens` is true).
    pub fn ends(&self, vocab: usize) -> Result<EndRules, RequestError> {
        let min_tokens = non_negative("min_tokens", self.min_tokens)?.unwrap_or(0);
        let mut stop_token_ids = Vec::new();
        for (i, &t) in self.stop_token_ids.iter().flatten().enumerate() {
            if t < 0 || t as usize >= vocab {
                return Err(RequestError::OutOfRange {
                    field: format!("stop_token_ids[{i}]"),
                    value: t,
                    allowed: format!("a token id in 0..{vocab}"),
                });
            }
            stop_token_ids.push(t as u32);
        }
        Ok(EndRules {
            ignore_eos: self.ignore_eos.unwrap_or(false),
            min_tokens,
            stop_token_ids,
            include_stop: self.include_stop_str_in_output.unwrap_or(false)
                || self.no_stop_trim.unwrap_or(false),
            skip_special: self.skip_special_tokens.unwrap_or(false),
        })
    }

    pub fn stop(&self) -> Vec<String> {
        self.stop
            .clone()
            .map(StopField::into_vec)
            .unwrap_or_default()
    }
}

/// A request's max tokens under the server's `limit`: more is an error
/// naming `field`; none asked gets the limit.
pub fn max_tokens(
    limit: Option<usize>,
    asked: Option<usize>,
    field: &str,
) -> Result<Option<usize>, RequestError> {
    match (limit, asked) {
        (Some(max), Some(n)) if n > max => Err(RequestError::OverLimit {
            field: field.to_string(),
            value: n,
            limit: max,
        }),
        (Some(max), None) => Ok(Some(max)),
        (_, asked) => Ok(asked),
    }
}

/// What `logprobs` (asked or not) and `top_logprobs` (named `top_field`)
/// ask for, of the `mode` distribution.
pub fn logprobs(
    want: bool,
    top: Option<i64>,
    top_field: &str,
    mode: LogprobMode,
) -> Result<Option<LogprobRequest>, RequestError> {
    let top = match top {
        None => 0,
        Some(n) if n < 0 || n as usize > MAX_TOP_LOGPROBS => {
            return Err(RequestError::OutOfRange {
                field: top_field.to_string(),
                value: n,
                allowed: format!("in 0..={MAX_TOP_LOGPROBS}"),
            })
        }
        Some(n) => n as usize,
    };
    if !want {
        if top > 0 {
            return Err(RequestError::Needs {
                field: top_field.to_string(),
                needs: "logprobs = true",
            });
        }
        return Ok(None);
    }
    Ok(Some(LogprobRequest { top, mode }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refusals_are_typed_and_name_their_field() {
        let d = SamplingParams::default();
        let opts = |v: Value| serde_json::from_value::<RequestOptions>(v).unwrap();
        let e = opts(json!({"top_p": 1.5})).sampling(&d, false).unwrap_err();
        assert!(matches!(
            e,
            RequestError::Sampling(SamplingError { field: "top_p", .. })
        ));
        assert_eq!(e.field(), "top_p");
        let e = opts(json!({"top_k": -2})).sampling(&d, false).unwrap_err();
        assert!(
            matches!(&e, RequestError::OutOfRange { field, value: -2, .. } if field == "top_k")
        );
        assert_eq!(e.to_string(), "top_k must be >= 0, got -2");
        // vLLM's "off".
        let p = opts(json!({"top_k": -1})).sampling(&d, false).unwrap();
        assert_eq!(p.top_k, 0);
        // vLLM's repetition penalty: the whole context; with specd's at
        // another value, a conflict.
        let p = opts(json!({"repetition_penalty": 1.3}))
            .sampling(&d, false)
            .unwrap();
        assert_eq!((p.repeat_penalty, p.repeat_last_n), (1.3, usize::MAX));
        let p = opts(json!({"repetition_penalty": 1.3, "repeat_penalty": 1.3, "repeat_last_n": 8}))
            .sampling(&d, false)
            .unwrap();
        assert_eq!((p.repeat_penalty, p.repeat_last_n), (1.3, 8));
        let e = opts(json!({"repetition_penalty": 1.3, "repeat_penalty": 1.1}))
            .sampling(&d, false)
            .unwrap_err();
        assert_eq!(e.field(), "repetition_penalty");
        let e = opts(json!({"stop_token_ids": [1, 99]}))
            .ends(50)
            .unwrap_err();
        assert_eq!(e.field(), "stop_token_ids[1]");
        let e = opts(json!({"min_tokens": -1})).ends(50).unwrap_err();
        assert_eq!(e.field(), "min_tokens");
        let r = opts(json!({"no_stop_trim": true, "min_tokens": 3, "stop_token_ids": [7]}))
            .ends(50)
            .unwrap();
        assert!(r.include_stop && r.min_tokens == 3 && r.stop_token_ids == [7]);
        let none = SpecOptions::default();
        let e = opts(json!({"drafter": "self:x"}))
            .speculation(&none)
            .unwrap_err();
        assert!(matches!(e, RequestError::Drafter { .. }), "{e}");
        let e = opts(json!({"schedule": " "}))
            .speculation(&none)
            .unwrap_err();
        assert_eq!(e, RequestError::Empty { field: "schedule" });
        let e = opts(json!({"acceptance_config": [1]}))
            .speculation(&none)
            .unwrap_err();
        assert!(matches!(
            e,
            RequestError::NotAnObject {
                field: "acceptance_config",
                ..
            }
        ));
        let e = max_tokens(Some(8), Some(9), "max_tokens").unwrap_err();
        assert!(matches!(
            e,
            RequestError::OverLimit {
                value: 9,
                limit: 8,
                ..
            }
        ));
        assert_eq!(max_tokens(Some(8), None, "max_tokens").unwrap(), Some(8));
        let e = logprobs(false, Some(2), "top_logprobs", LogprobMode::Raw).unwrap_err();
        assert!(matches!(e, RequestError::Needs { .. }));
        let e = logprobs(true, Some(99), "top_logprobs", LogprobMode::Raw).unwrap_err();
        assert!(matches!(e, RequestError::OutOfRange { value: 99, .. }));
    }
}
