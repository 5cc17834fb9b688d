//! Which request fields each API accepts, so that nothing a client sends is
//! silently ignored. Every field of a body is in its API's table as one of:
//!
//! - [`Rule::Used`]: specd implements it;
//! - [`Rule::Inert`]: part of the API, accepted, and it cannot change the
//!   output here (`user`, `keep_alive`, thread counts, ...);
//! - [`Rule::NeutralOnly`]: accepted only at a value that changes nothing
//!   (`null`, `false`, an empty list, `n = 1`, ...); any other value is a 400
//!   naming the field and why.
//!
//! A field in no table is a 400 too ("unknown field"). The serde structs that
//! read the bodies stay lenient because several of them read the same body;
//! this check is the gate. The README lists the inert and refused fields.
use serde_json::Value;

/// How a field is treated.
#[derive(Clone, Copy)]
pub enum Rule {
    Used,
    Inert,
    /// Accepted when the predicate holds for its value (`null` always
    /// passes); otherwise refused with the reason.
    NeutralOnly(fn(&Value) -> bool, &'static str),
}

/// One API body's fields.
pub struct Table {
    /// The API, as the error names it.
    pub api: &'static str,
    /// Its own fields, and whether the shared sampling and speculation
    /// fields ([`COMMON`]) belong to it.
    pub fields: &'static [(&'static str, Rule)],
    pub common: bool,
}

impl Table {
    fn rule(&self, name: &str) -> Option<Rule> {
        let common: &[(&str, Rule)] = if self.common { COMMON } else { &[] };
        self.fields
            .iter()
            .chain(common)
            .find(|(n, _)| *n == name)
            .map(|(_, r)| *r)
    }
}

/// Why a field was refused; tests match on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldError {
    /// In neither the API nor specd's extensions.
    Unknown { field: String, api: &'static str },
    /// Part of the API, but specd does not implement that value.
    Unsupported { field: String, why: &'static str },
}

impl FieldError {
    pub fn field(&self) -> &str {
        match self {
            FieldError::Unknown { field, .. } | FieldError::Unsupported { field, .. } => field,
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FieldError::Unknown { field, api } => write!(
                f,
                "unknown field `{field}`: it is neither part of the {api} nor a specd extension"
            ),
            FieldError::Unsupported { field, why } => {
                write!(f, "field `{field}` is not supported: {why}")
            }
        }
    }
}

/// A handler's body as JSON, every top-level key checked against `table`:
/// the one way a body comes in.
pub fn read(
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
    table: &Table,
) -> Result<Value, super::api::ApiError> {
    let v: Value = super::api::parse_body(body)?;
    check(&v, table, "").map_err(super::api::ApiError::field)?;
    Ok(v)
}

/// Checks every key of `body` (an object; anything else passes, the typed
/// parse reports it) against `table`; `prefix` goes before the field names.
pub fn check(body: &Value, table: &Table, prefix: &str) -> Result<(), FieldError> {
    let Some(obj) = body.as_object() else {
        return Ok(());
    };
    for (k, v) in obj {
        let field = format!("{prefix}{k}");
        match table.rule(k) {
            None => {
                return Err(FieldError::Unknown {
                    field,
                    api: table.api,
                })
            }
            Some(Rule::Used | Rule::Inert) => {}
            Some(Rule::NeutralOnly(neutral, why)) => {
                if !v.is_null() && !neutral(v) {
                    return Err(FieldError::Unsupported { field, why });
                }
            }
        }
    }
    Ok(())
}

/// The fields of `table` with `rule` (for the docs test).
#[cfg(test)]
fn names(table: &Table, inert: bool) -> Vec<&'static str> {
    table
        .fields
        .iter()
        .filter(|(_, r)| matches!(r, Rule::Inert) == inert)
        .map(|(n, _)| *n)
        .collect()
}

fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}
fn is_empty(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}
fn is_zero(v: &Value) -> bool {
    v.as_f64() == Some(0.0)
}
fn is_one(v: &Value) -> bool {
    v.as_f64() == Some(1.0)
}
fn is_none_str(v: &Value) -> bool {
    v.as_str() == Some("none")
}
fn is_text_only(v: &Value) -> bool {
    v.as_array()
        .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text")))
}

/// Sampling and speculation fields both APIs read through `CommonOptions`
/// (OpenAI: top level; Ollama: in `options`). The speculation ones and
/// `top_k`, `min_p`, `repeat_penalty`, `repeat_last_n` are specd extensions
/// on the OpenAI side.
pub static COMMON: &[(&str, Rule)] = &[
    ("temperature", Rule::Used),
    ("top_k", Rule::Used),
    ("top_p", Rule::Used),
    ("min_p", Rule::Used),
    ("repeat_penalty", Rule::Used),
    ("repeat_last_n", Rule::Used),
    ("presence_penalty", Rule::Used),
    ("frequency_penalty", Rule::Used),
    ("seed", Rule::Used),
    ("stop", Rule::Used),
    ("drafter", Rule::Used),
    ("schedule", Rule::Used),
    ("acceptance", Rule::Used),
    ("draft_max", Rule::Used),
    ("schedule_config", Rule::Used),
    ("acceptance_config", Rule::Used),
];

const NO_LOGIT_BIAS: Rule = Rule::NeutralOnly(is_empty, "specd does not apply logit biases");
const FUNCTIONS_WHY: &str = "the deprecated functions API is not supported; use `tools`";
const NO_FUNCTIONS: Rule = Rule::NeutralOnly(is_empty, FUNCTIONS_WHY);
const NO_IMAGES: Rule = Rule::NeutralOnly(is_empty, "the served model reads text only");
const NO_THINK: Rule = Rule::NeutralOnly(is_false, "the served model has no thinking mode");

pub static OPENAI_CHAT: Table = Table {
    api: "OpenAI chat completions API",
    fields: &[
        ("model", Rule::Used),
        ("messages", Rule::Used),
        ("stream", Rule::Used),
        ("max_tokens", Rule::Used),
        ("max_completion_tokens", Rule::Used),
        ("n", Rule::Used),
        ("user", Rule::Inert),
        ("metadata", Rule::Inert),
        ("store", Rule::Inert),
        ("stream_options", Rule::Inert),
        ("parallel_tool_calls", Rule::Inert),
        ("service_tier", Rule::Inert),
        ("safety_identifier", Rule::Inert),
        ("prompt_cache_key", Rule::Inert),
        ("logprobs", Rule::Used),
        ("top_logprobs", Rule::Used),
        ("logit_bias", NO_LOGIT_BIAS),
        ("response_format", Rule::Used),
        // Checked against the served model's template (`tools::read`).
        ("tools", Rule::Used),
        ("tool_choice", Rule::Used),
        ("functions", NO_FUNCTIONS),
        (
            "function_call",
            Rule::NeutralOnly(is_none_str, FUNCTIONS_WHY),
        ),
        (
            "modalities",
            Rule::NeutralOnly(is_text_only, "specd produces text only"),
        ),
        (
            "audio",
            Rule::NeutralOnly(|_| false, "specd produces text only"),
        ),
        (
            "prediction",
            Rule::NeutralOnly(|_| false, "predicted outputs are not supported"),
        ),
        (
            "web_search_options",
            Rule::NeutralOnly(|_| false, "specd has no web search"),
        ),
        (
            "reasoning_effort",
            Rule::NeutralOnly(|_| false, "the served model is not a reasoning model"),
        ),
        (
            "verbosity",
            Rule::NeutralOnly(|_| false, "the served model has no verbosity control"),
        ),
    ],
    common: true,
};

/// One message of an OpenAI chat request.
pub static OPENAI_MESSAGE: Table = Table {
    api: "OpenAI chat message",
    fields: &[
        ("role", Rule::Used),
        ("content", Rule::Used),
        ("refusal", Rule::Inert),
        (
            "name",
            Rule::NeutralOnly(
                is_empty,
                "the served model's chat template does not render participant names",
            ),
        ),
        ("tool_calls", Rule::Used),
        ("function_call", NO_FUNCTIONS),
        ("tool_call_id", Rule::Used),
        (
            "audio",
            Rule::NeutralOnly(|_| false, "specd reads text only"),
        ),
    ],
    common: false,
};

pub static OPENAI_COMPLETIONS: Table = Table {
    api: "OpenAI completions API",
    fields: &[
        ("model", Rule::Used),
        ("prompt", Rule::Used),
        ("stream", Rule::Used),
        ("max_tokens", Rule::Used),
        ("n", Rule::Used),
        ("echo", Rule::Used),
        ("logprobs", Rule::Used),
        ("user", Rule::Inert),
        ("stream_options", Rule::Inert),
        ("logit_bias", NO_LOGIT_BIAS),
        (
            "best_of",
            Rule::NeutralOnly(is_one, "specd returns one choice (best_of = 1)"),
        ),
        (
            "suffix",
            Rule::NeutralOnly(is_empty, "specd does not fill in the middle"),
        ),
    ],
    common: true,
};

pub static OLLAMA_GENERATE: Table = Table {
    api: "Ollama generate API",
    fields: &[
        ("model", Rule::Used),
        ("prompt", Rule::Used),
        ("system", Rule::Used),
        ("raw", Rule::Used),
        ("stream", Rule::Used),
        ("options", Rule::Used),
        ("keep_alive", Rule::Inert),
        (
            "suffix",
            Rule::NeutralOnly(is_empty, "specd does not fill in the middle"),
        ),
        (
            "template",
            Rule::NeutralOnly(
                is_empty,
                "specd renders the model's own chat template; use raw = true for a prompt of your own",
            ),
        ),
        (
            "context",
            Rule::NeutralOnly(
                is_empty,
                "specd does not continue from a context; send the conversation (/api/chat) or the text (raw = true)",
            ),
        ),
        ("logprobs", Rule::Used),
        ("top_logprobs", Rule::Used),
        ("images", NO_IMAGES),
        ("format", Rule::Used),
        ("think", NO_THINK),
        ("width", Rule::NeutralOnly(|_| false, "specd generates text, not images")),
        ("height", Rule::NeutralOnly(|_| false, "specd generates text, not images")),
        ("steps", Rule::NeutralOnly(|_| false, "specd generates text, not images")),
    ],
    common: false,
};

pub static OLLAMA_CHAT: Table = Table {
    api: "Ollama chat API",
    fields: &[
        ("model", Rule::Used),
        ("messages", Rule::Used),
        ("stream", Rule::Used),
        ("options", Rule::Used),
        ("keep_alive", Rule::Inert),
        ("logprobs", Rule::Used),
        ("top_logprobs", Rule::Used),
        // Checked against the served model's template (`tools::read`).
        ("tools", Rule::Used),
        ("format", Rule::Used),
        ("think", NO_THINK),
    ],
    common: false,
};

/// One message of an Ollama chat request.
pub static OLLAMA_MESSAGE: Table = Table {
    api: "Ollama chat message",
    fields: &[
        ("role", Rule::Used),
        ("content", Rule::Used),
        ("images", NO_IMAGES),
        ("tool_calls", Rule::Used),
        ("tool_name", Rule::Used),
        (
            "thinking",
            Rule::NeutralOnly(is_empty, "the served model has no thinking mode"),
        ),
    ],
    common: false,
};

/// Ollama's `options` (its Modelfile parameters).
pub static OLLAMA_OPTIONS: Table = Table {
    api: "Ollama options",
    fields: &[
        ("num_predict", Rule::Used),
        // Checked against the model's context where the options are read.
        ("num_ctx", Rule::Used),
        ("trace_rounds", Rule::Used),
        // A specd extension (Ollama's API has none): OpenAI's `tool_choice`.
        ("tool_choice", Rule::Used),
        // Load-time and performance settings: no effect on the tokens.
        ("num_keep", Rule::Inert),
        ("num_batch", Rule::Inert),
        ("num_gpu", Rule::Inert),
        ("main_gpu", Rule::Inert),
        ("num_thread", Rule::Inert),
        ("numa", Rule::Inert),
        ("low_vram", Rule::Inert),
        ("f16_kv", Rule::Inert),
        ("use_mmap", Rule::Inert),
        ("use_mlock", Rule::Inert),
        ("vocab_only", Rule::Inert),
        ("logits_all", Rule::Inert),
        ("embedding_only", Rule::Inert),
        // Ollama itself no longer applies it.
        ("penalize_newline", Rule::Inert),
        // Only read when mirostat is on, which is refused.
        ("mirostat_tau", Rule::Inert),
        ("mirostat_eta", Rule::Inert),
        (
            "mirostat",
            Rule::NeutralOnly(
                is_zero,
                "specd does not implement mirostat sampling (0 only)",
            ),
        ),
        (
            "typical_p",
            Rule::NeutralOnly(
                is_one,
                "specd does not implement typical sampling (1.0 only)",
            ),
        ),
        (
            "tfs_z",
            Rule::NeutralOnly(
                is_one,
                "specd does not implement tail-free sampling (1.0 only)",
            ),
        ),
    ],
    common: true,
};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_and_unsupported_fields_are_named() {
        let e = check(&json!({"model": "m", "bogus": 1}), &OPENAI_CHAT, "").unwrap_err();
        assert_eq!(
            e,
            FieldError::Unknown {
                field: "bogus".into(),
                api: OPENAI_CHAT.api
            }
        );
        let e = check(&json!({"logit_bias": {"42": 5}}), &OPENAI_CHAT, "").unwrap_err();
        assert!(matches!(e, FieldError::Unsupported { .. }));
        assert_eq!(e.field(), "logit_bias");
        let e = check(&json!({"mirostat": 2}), &OLLAMA_OPTIONS, "options.").unwrap_err();
        assert_eq!(e.field(), "options.mirostat");
        assert!(e.to_string().contains("mirostat"), "{e}");
    }

    #[test]
    fn neutral_values_and_inert_fields_pass() {
        let body = json!({
            "model": "m", "messages": [], "logit_bias": {}, "logprobs": false,
            "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
            "user": "u", "metadata": {"a": "b"}, "stream_options": {"include_usage": true},
            "parallel_tool_calls": true, "n": 1, "modalities": ["text"], "audio": null,
        });
        check(&body, &OPENAI_CHAT, "").unwrap();
        let opts = json!({"num_ctx": 2048, "num_thread": 2, "typical_p": 1.0, "mirostat": 0});
        check(&opts, &OLLAMA_OPTIONS, "options.").unwrap();
        check(
            &json!({"keep_alive": "5m", "tools": [], "think": false}),
            &OLLAMA_CHAT,
            "",
        )
        .unwrap();
    }

    #[test]
    fn every_table_names_a_field_once() {
        for t in [
            &OPENAI_CHAT,
            &OPENAI_MESSAGE,
            &OPENAI_COMPLETIONS,
            &OLLAMA_GENERATE,
            &OLLAMA_CHAT,
            &OLLAMA_MESSAGE,
            &OLLAMA_OPTIONS,
        ] {
            let mut all: Vec<_> = t.fields.iter().map(|(n, _)| *n).collect();
            let n = all.len();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), n, "{}", t.api);
        }
    }

    #[test]
    fn the_readme_lists_the_inert_fields() {
        let readme = include_str!("../../../README.md");
        for t in [
            &OPENAI_CHAT,
            &OPENAI_COMPLETIONS,
            &OLLAMA_GENERATE,
            &OLLAMA_OPTIONS,
        ] {
            for f in names(t, true) {
                assert!(readme.contains(&format!("`{f}`")), "README misses {f}");
            }
        }
    }
}
