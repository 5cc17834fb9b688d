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
//! this check is the gate. docs/serving.md lists the inert and refused fields.
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
    /// The vLLM and SGLang request extensions this API shares with theirs
    /// ([`VLLM_SHARED`] and the API's own).
    pub extensions: &'static [&'static [(&'static str, Rule)]],
}

impl Table {
    fn rule(&self, name: &str) -> Option<Rule> {
        let common: &[(&str, Rule)] = if self.common { COMMON } else { &[] };
        self.fields
            .iter()
            .chain(common)
            .chain(self.extensions.iter().flat_map(|e| e.iter()))
            .find(|(n, _)| *n == name)
            .map(|(_, r)| *r)
    }

    /// Every field it names itself or through its extensions.
    #[cfg(test)]
    fn own(&self) -> impl Iterator<Item = &'static (&'static str, Rule)> + '_ {
        self.fields
            .iter()
            .chain(self.extensions.iter().flat_map(|e| e.iter()))
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
        .own()
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
fn is_true(v: &Value) -> bool {
    v == &Value::Bool(true)
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
    // vLLM's sampling extensions (SGLang's too), on both APIs.
    ("repetition_penalty", Rule::Used),
    ("ignore_eos", Rule::Used),
    ("min_tokens", Rule::Used),
    ("stop_token_ids", Rule::Used),
    ("include_stop_str_in_output", Rule::Used),
    ("no_stop_trim", Rule::Used),
    ("skip_special_tokens", Rule::Used),
];

const USE_RESPONSE_FORMAT: &str =
    "specd's structured output is `response_format` (json_object or json_schema)";
const NOT_VLLM: fn(&Value) -> bool = |_| false;

/// The request extensions vLLM's and SGLang's OpenAI servers add to both
/// chat and completions, which routers (vllm-router, the SGLang gateway)
/// and benchmark clients (guidellm, `vllm bench serve`) send, mostly at
/// their neutral values. Those that change the output and that specd
/// implements are in [`COMMON`].
pub static VLLM_SHARED: &[(&str, Rule)] = &[
    // Identify or route a request; no effect on its tokens.
    ("request_id", Rule::Inert),
    ("rid", Rule::Inert),
    ("cache_salt", Rule::Inert),
    (
        "use_beam_search",
        Rule::NeutralOnly(is_false, "specd does not run beam search"),
    ),
    (
        "length_penalty",
        Rule::NeutralOnly(
            is_one,
            "specd does not run beam search (length_penalty 1 only)",
        ),
    ),
    (
        "spaces_between_special_tokens",
        Rule::NeutralOnly(
            is_true,
            "specd detokenizes special tokens without added spaces",
        ),
    ),
    (
        "truncate_prompt_tokens",
        Rule::NeutralOnly(NOT_VLLM, "specd does not truncate prompts"),
    ),
    (
        "allowed_token_ids",
        Rule::NeutralOnly(is_empty, "specd does not restrict the vocabulary"),
    ),
    (
        "bad_words",
        Rule::NeutralOnly(is_empty, "specd does not ban words"),
    ),
    (
        "prompt_logprobs",
        Rule::NeutralOnly(NOT_VLLM, "use completions' `echo` with `logprobs`"),
    ),
    (
        "priority",
        Rule::NeutralOnly(
            is_zero,
            "specd serves requests in arrival order (priority 0 only)",
        ),
    ),
    (
        "logits_processors",
        Rule::NeutralOnly(is_empty, "specd runs no request-supplied logits processors"),
    ),
    // Token ids in the answer (`openai::TokenIdFields`).
    ("return_tokens_as_token_ids", Rule::Used),
    ("return_token_ids", Rule::Used),
    (
        "return_hidden_states",
        Rule::NeutralOnly(is_false, "specd does not return hidden states"),
    ),
    (
        "kv_transfer_params",
        Rule::NeutralOnly(
            NOT_VLLM,
            "specd does not transfer KV caches between servers",
        ),
    ),
    (
        "vllm_xargs",
        Rule::NeutralOnly(is_empty, "specd takes no vLLM extra arguments"),
    ),
    (
        "mm_processor_kwargs",
        Rule::NeutralOnly(is_empty, "the served model reads text only"),
    ),
    (
        "guided_json",
        Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT),
    ),
    (
        "guided_regex",
        Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT),
    ),
    (
        "guided_choice",
        Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT),
    ),
    (
        "guided_grammar",
        Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT),
    ),
    (
        "guided_decoding_backend",
        Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT),
    ),
    (
        "guided_whitespace_pattern",
        Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT),
    ),
    (
        "structural_tag",
        Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT),
    ),
    (
        "structured_outputs",
        Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT),
    ),
    ("regex", Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT)),
    ("ebnf", Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT)),
    (
        "json_schema",
        Rule::NeutralOnly(NOT_VLLM, USE_RESPONSE_FORMAT),
    ),
    (
        "lora_path",
        Rule::NeutralOnly(NOT_VLLM, "specd serves no LoRA adapters"),
    ),
    (
        "session_params",
        Rule::NeutralOnly(
            NOT_VLLM,
            "specd keeps no sessions; its prefix cache reuses prompts",
        ),
    ),
    (
        "custom_logit_processor",
        Rule::NeutralOnly(NOT_VLLM, "specd runs no request-supplied logits processors"),
    ),
    (
        "custom_params",
        Rule::NeutralOnly(NOT_VLLM, "specd runs no request-supplied logits processors"),
    ),
];

/// vLLM's and SGLang's chat-only extensions.
pub static VLLM_CHAT: &[(&str, Rule)] = &[
    (
        "add_generation_prompt",
        Rule::NeutralOnly(is_true, "specd always renders the assistant turn's start"),
    ),
    (
        "continue_final_message",
        Rule::NeutralOnly(is_false, "specd does not continue a final message"),
    ),
    (
        "echo",
        Rule::NeutralOnly(is_false, "specd does not echo chat prompts"),
    ),
    (
        "add_special_tokens",
        Rule::NeutralOnly(is_false, "the chat template places the special tokens"),
    ),
    (
        "chat_template",
        Rule::NeutralOnly(
            is_empty,
            "specd renders the served model's own chat template",
        ),
    ),
    (
        "chat_template_kwargs",
        Rule::NeutralOnly(
            is_empty,
            "specd renders the chat template without extra arguments",
        ),
    ),
    (
        "documents",
        Rule::NeutralOnly(
            is_empty,
            "the served model's chat template renders no documents",
        ),
    ),
    (
        "best_of",
        Rule::NeutralOnly(is_one, "specd returns one choice (best_of = 1)"),
    ),
    // The served models do not reason: no reasoning text to separate,
    // stream or include.
    ("separate_reasoning", Rule::Inert),
    ("stream_reasoning", Rule::Inert),
    ("include_reasoning", Rule::Inert),
];

/// vLLM's completions-only extensions.
pub static VLLM_COMPLETIONS: &[(&str, Rule)] = &[(
    "add_special_tokens",
    Rule::NeutralOnly(
        is_true,
        "specd encodes a prompt as the model's tokenizer does",
    ),
)];

/// `stream_options` of both OpenAI APIs.
pub static STREAM_OPTIONS: Table = Table {
    api: "OpenAI stream options",
    fields: &[
        ("include_usage", Rule::Used),
        // vLLM's: usage on every chunk. specd sends it with the last.
        ("continuous_usage_stats", Rule::Inert),
    ],
    common: false,
    extensions: &[],
};

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
        ("stream_options", Rule::Used),
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
    extensions: &[VLLM_SHARED, VLLM_CHAT],
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
    extensions: &[],
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
        ("stream_options", Rule::Used),
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
    extensions: &[VLLM_SHARED, VLLM_COMPLETIONS],
};

/// OpenAI's Responses API (`/v1/responses`); the speculation and sampling
/// fields are the other routes' ([`COMMON`]).
pub static OPENAI_RESPONSES: Table = Table {
    api: "OpenAI responses API",
    fields: &[
        ("model", Rule::Used),
        ("input", Rule::Used),
        ("instructions", Rule::Used),
        ("stream", Rule::Used),
        ("max_output_tokens", Rule::Used),
        // Checked item by item (`responses::read_tools`): functions only.
        ("tools", Rule::Used),
        ("tool_choice", Rule::Used),
        ("text", Rule::Used),
        ("store", Rule::Used),
        ("previous_response_id", Rule::Used),
        ("metadata", Rule::Inert),
        ("user", Rule::Inert),
        ("parallel_tool_calls", Rule::Inert),
        ("service_tier", Rule::Inert),
        ("safety_identifier", Rule::Inert),
        ("prompt_cache_key", Rule::Inert),
        ("prompt_cache_retention", Rule::Inert),
        ("stream_options", Rule::Inert),
        // The calls of one answer come in one turn: nothing to cap.
        ("max_tool_calls", Rule::Inert),
        (
            "truncation",
            Rule::NeutralOnly(
                |v| v.as_str() == Some("disabled"),
                "specd does not truncate the conversation (disabled only)",
            ),
        ),
        (
            "reasoning",
            Rule::NeutralOnly(
                |v| {
                    v.as_object()
                        .is_some_and(|o| o.values().all(Value::is_null))
                },
                "the served model is not a reasoning model",
            ),
        ),
        (
            "include",
            Rule::NeutralOnly(
                is_empty,
                "specd has no built-in tool results, reasoning or logprobs to include",
            ),
        ),
        (
            "top_logprobs",
            Rule::NeutralOnly(is_zero, "specd's responses carry no logprobs"),
        ),
        (
            "background",
            Rule::NeutralOnly(is_false, "specd answers in the foreground"),
        ),
        (
            "conversation",
            Rule::NeutralOnly(
                |_| false,
                "specd keeps no conversations; use previous_response_id",
            ),
        ),
        (
            "prompt",
            Rule::NeutralOnly(|_| false, "stored prompt templates are not supported"),
        ),
    ],
    common: true,
    extensions: &[],
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
    extensions: &[],
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
    extensions: &[],
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
    extensions: &[],
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
    extensions: &[],
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
    fn what_routers_and_benchmarks_send_passes() {
        // vllm-router's rewrite of every chat request.
        let router = json!({
            "model": "m", "messages": [], "logprobs": false, "no_stop_trim": false,
            "ignore_eos": false, "continue_final_message": false,
            "skip_special_tokens": true, "separate_reasoning": true,
            "stream_reasoning": true, "return_hidden_states": false,
            "include_reasoning": true,
        });
        check(&router, &OPENAI_CHAT, "").unwrap();
        // guidellm's.
        let guidellm = json!({
            "model": "m", "messages": [], "stream": true, "ignore_eos": true,
            "max_completion_tokens": 64,
            "stream_options": {"include_usage": true, "continuous_usage_stats": true},
        });
        check(&guidellm, &OPENAI_CHAT, "").unwrap();
        check(
            &guidellm["stream_options"],
            &STREAM_OPTIONS,
            "stream_options.",
        )
        .unwrap();
        let neutral = json!({
            "prompt": "x", "add_special_tokens": true, "min_tokens": 0, "top_k": -1,
            "spaces_between_special_tokens": true, "use_beam_search": false,
            "request_id": "r1", "priority": 0, "bad_words": [], "guided_json": null,
        });
        check(&neutral, &OPENAI_COMPLETIONS, "").unwrap();
        // Non-neutral values are refused by name.
        for (body, field) in [
            (
                json!({"add_generation_prompt": false}),
                "add_generation_prompt",
            ),
            (
                json!({"continue_final_message": true}),
                "continue_final_message",
            ),
            (json!({"guided_json": {"type": "object"}}), "guided_json"),
            (json!({"use_beam_search": true}), "use_beam_search"),
            (json!({"priority": 3}), "priority"),
        ] {
            assert_eq!(check(&body, &OPENAI_CHAT, "").unwrap_err().field(), field);
        }
        let e = check(&json!({"bogus": 1}), &STREAM_OPTIONS, "stream_options.").unwrap_err();
        assert_eq!(e.field(), "stream_options.bogus");
        // Chat's extensions are not completions'.
        let e = check(
            &json!({"continue_final_message": false}),
            &OPENAI_COMPLETIONS,
            "",
        );
        assert!(matches!(e, Err(FieldError::Unknown { .. })));
    }

    #[test]
    fn every_table_names_a_field_once() {
        for t in [
            &OPENAI_CHAT,
            &OPENAI_MESSAGE,
            &OPENAI_COMPLETIONS,
            &OPENAI_RESPONSES,
            &STREAM_OPTIONS,
            &OLLAMA_GENERATE,
            &OLLAMA_CHAT,
            &OLLAMA_MESSAGE,
            &OLLAMA_OPTIONS,
        ] {
            let common: &[(&str, Rule)] = if t.common { COMMON } else { &[] };
            let mut all: Vec<_> = t.own().chain(common).map(|(n, _)| *n).collect();
            let n = all.len();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), n, "{}", t.api);
        }
    }

    #[test]
    fn the_serving_doc_lists_the_inert_fields() {
        let doc = include_str!("../../../docs/serving.md");
        for t in [
            &OPENAI_CHAT,
            &OPENAI_COMPLETIONS,
            &OPENAI_RESPONSES,
            &OLLAMA_GENERATE,
            &OLLAMA_OPTIONS,
        ] {
            for f in names(t, true) {
                assert!(
                    doc.contains(&format!("`{f}`")),
                    "docs/serving.md misses {f}"
                );
            }
        }
    }
}
