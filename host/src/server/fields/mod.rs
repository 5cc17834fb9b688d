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
#[derive(Clone, Copy, Debug)]
pub enum Rule {
    Used,
    Inert,
    /// Accepted when its value is [`Neutral`] (`null` always passes);
    /// otherwise refused with the reason. Each reason is one constant of
    /// [`reasons`], named by every field it covers.
    NeutralOnly(Neutral, &'static str),
}

/// The one value (besides `null`) at which a refused field changes nothing.
#[derive(Clone, Copy, Debug)]
pub enum Neutral {
    /// Only `null`: any value asks for what specd does not do.
    Null,
    False,
    True,
    /// `""`, `[]` or `{}`.
    Empty,
    Zero,
    One,
    /// The string `"none"`.
    NoneStr,
    /// The string `"disabled"`.
    Disabled,
    /// A list of `"text"` only.
    TextOnly,
    /// An object whose values are all `null`.
    AllNull,
}

impl Neutral {
    pub fn holds(self, v: &Value) -> bool {
        match self {
            Neutral::Null => v.is_null(),
            Neutral::False => v == &Value::Bool(false),
            Neutral::True => v == &Value::Bool(true),
            Neutral::Empty => match v {
                Value::String(s) => s.is_empty(),
                Value::Array(a) => a.is_empty(),
                Value::Object(o) => o.is_empty(),
                _ => false,
            },
            Neutral::Zero => v.as_f64() == Some(0.0),
            Neutral::One => v.as_f64() == Some(1.0),
            Neutral::NoneStr => v.as_str() == Some("none"),
            Neutral::Disabled => v.as_str() == Some("disabled"),
            Neutral::TextOnly => v
                .as_array()
                .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text"))),
            Neutral::AllNull => v
                .as_object()
                .is_some_and(|o| o.values().all(Value::is_null)),
        }
    }
}

/// One row of a table: fields that share a rule. A refusal's reason is
/// one row however many fields it covers.
pub type Row = (&'static [&'static str], Rule);

/// One API body's fields.
pub struct Table {
    /// The API, as the error names it.
    pub api: &'static str,
    /// Its own fields, and whether the shared sampling and speculation
    /// fields ([`COMMON`]) belong to it.
    pub fields: &'static [Row],
    pub common: bool,
    /// The vLLM and SGLang request extensions this API shares with theirs
    /// ([`VLLM_SHARED`] and the API's own).
    pub extensions: &'static [&'static [Row]],
}

impl Table {
    fn rule(&self, name: &str) -> Option<Rule> {
        self.all().find(|(n, _)| *n == name).map(|(_, r)| r)
    }

    /// Every field with its rule: its own, the extensions', then [`COMMON`]
    /// if it has those.
    fn all(&self) -> impl Iterator<Item = (&'static str, Rule)> + '_ {
        let common: &'static [Row] = if self.common { COMMON } else { &[] };
        self.fields
            .iter()
            .chain(self.extensions.iter().flat_map(|e| e.iter()))
            .chain(common)
            .flat_map(|(names, rule)| names.iter().map(move |n| (*n, *rule)))
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
                if !v.is_null() && !neutral.holds(v) {
                    return Err(FieldError::Unsupported { field, why });
                }
            }
        }
    }
    Ok(())
}

/// Sampling and speculation fields both APIs read through `CommonOptions`
/// (OpenAI: top level; Ollama: in `options`). The speculation ones and
/// `top_k`, `min_p`, `repeat_penalty`, `repeat_last_n` are specd extensions
/// on the OpenAI side.
pub static COMMON: &[Row] = &[
    (
        &[
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "repeat_penalty",
            "repeat_last_n",
            "presence_penalty",
            "frequency_penalty",
            "seed",
            "stop",
            "drafter",
            "schedule",
            "acceptance",
            "draft_max",
            "schedule_config",
            "acceptance_config",
        ],
        Rule::Used,
    ),
    // vLLM's sampling extensions (SGLang's too), on both APIs.
    (
        &[
            "repetition_penalty",
            "ignore_eos",
            "min_tokens",
            "stop_token_ids",
            "include_stop_str_in_output",
            "no_stop_trim",
            "skip_special_tokens",
        ],
        Rule::Used,
    ),
];

/// The reasons for refusing a field, each once; the tables name them.
pub mod reasons {
    use super::{Neutral, Rule};

    const fn only(neutral: Neutral, why: &'static str) -> Rule {
        Rule::NeutralOnly(neutral, why)
    }
    const fn never(why: &'static str) -> Rule {
        Rule::NeutralOnly(Neutral::Null, why)
    }

    // Output specd does not make.
    pub const STRUCTURED: Rule =
        never("specd's structured output is `response_format` (json_object or json_schema)");
    pub const TEXT_OUT: Rule = never("specd produces text only");
    pub const MODALITIES: Rule = only(Neutral::TextOnly, "specd produces text only");
    pub const IMAGES_OUT: Rule = never("specd generates text, not images");
    pub const ONE_CHOICE: Rule = only(Neutral::One, "specd returns one choice (best_of = 1)");
    pub const HIDDEN_STATES: Rule = only(Neutral::False, "specd does not return hidden states");
    pub const PREDICTION: Rule = never("predicted outputs are not supported");
    pub const WEB_SEARCH: Rule = never("specd has no web search");
    pub const VERBOSITY: Rule = never("the served model has no verbosity control");
    pub const RESPONSE_LOGPROBS: Rule = only(Neutral::Zero, "specd's responses carry no logprobs");
    pub const INCLUDE: Rule = only(
        Neutral::Empty,
        "specd has no built-in tool results, reasoning or logprobs to include",
    );
    pub const BACKGROUND: Rule = only(Neutral::False, "specd answers in the foreground");

    // Input the served model does not read.
    pub const IMAGES_IN: Rule = only(Neutral::Empty, "the served model reads text only");
    pub const AUDIO_IN: Rule = never("specd reads text only");
    pub const NAMES: Rule = only(
        Neutral::Empty,
        "the served model's chat template does not render participant names",
    );
    pub const DOCUMENTS: Rule = only(
        Neutral::Empty,
        "the served model's chat template renders no documents",
    );
    pub const REASONING: Rule = never("the served model is not a reasoning model");
    pub const REASONING_OFF: Rule = only(
        Neutral::AllNull,
        "the served model is not a reasoning model",
    );
    pub const THINK: Rule = only(Neutral::False, "the served model has no thinking mode");
    pub const THINKING: Rule = only(Neutral::Empty, "the served model has no thinking mode");

    // Sampling specd does not implement.
    pub const BEAM_SEARCH: Rule = only(Neutral::False, "specd does not run beam search");
    pub const LENGTH_PENALTY: Rule = only(
        Neutral::One,
        "specd does not run beam search (length_penalty 1 only)",
    );
    pub const LOGIT_BIAS: Rule = only(Neutral::Empty, "specd does not apply logit biases");
    pub const VOCABULARY: Rule = only(Neutral::Empty, "specd does not restrict the vocabulary");
    pub const BAD_WORDS: Rule = only(Neutral::Empty, "specd does not ban words");
    pub const PROCESSORS: Rule = never("specd runs no request-supplied logits processors");
    pub const PROCESSOR_LIST: Rule = only(
        Neutral::Empty,
        "specd runs no request-supplied logits processors",
    );
    pub const MIROSTAT: Rule = only(
        Neutral::Zero,
        "specd does not implement mirostat sampling (0 only)",
    );
    pub const TYPICAL: Rule = only(
        Neutral::One,
        "specd does not implement typical sampling (1.0 only)",
    );
    pub const TAIL_FREE: Rule = only(
        Neutral::One,
        "specd does not implement tail-free sampling (1.0 only)",
    );

    // Prompts and templates.
    pub const TRUNCATE: Rule = never("specd does not truncate prompts");
    pub const TRUNCATION: Rule = only(
        Neutral::Disabled,
        "specd does not truncate the conversation (disabled only)",
    );
    pub const PROMPT_LOGPROBS: Rule = never("use completions' `echo` with `logprobs`");
    pub const FILL_IN_MIDDLE: Rule = only(Neutral::Empty, "specd does not fill in the middle");
    pub const GENERATION_PROMPT: Rule = only(
        Neutral::True,
        "specd always renders the assistant turn's start",
    );
    pub const CONTINUE_FINAL: Rule =
        only(Neutral::False, "specd does not continue a final message");
    pub const ECHO_CHAT: Rule = only(Neutral::False, "specd does not echo chat prompts");
    pub const CHAT_SPECIAL_TOKENS: Rule = only(
        Neutral::False,
        "the chat template places the special tokens",
    );
    pub const PROMPT_SPECIAL_TOKENS: Rule = only(
        Neutral::True,
        "specd encodes a prompt as the model's tokenizer does",
    );
    pub const SPACES: Rule = only(
        Neutral::True,
        "specd detokenizes special tokens without added spaces",
    );
    pub const CHAT_TEMPLATE: Rule = only(
        Neutral::Empty,
        "specd renders the served model's own chat template",
    );
    pub const TEMPLATE_KWARGS: Rule = only(
        Neutral::Empty,
        "specd renders the chat template without extra arguments",
    );
    pub const OLLAMA_TEMPLATE: Rule = only(
        Neutral::Empty,
        "specd renders the model's own chat template; use raw = true for a prompt of your own",
    );
    pub const CONTEXT: Rule = only(
        Neutral::Empty,
        "specd does not continue from a context; send the conversation (/api/chat) or the text (raw = true)",
    );
    pub const STORED_PROMPT: Rule = never("stored prompt templates are not supported");
    const FUNCTIONS_WHY: &str = "the deprecated functions API is not supported; use `tools`";
    pub const FUNCTIONS: Rule = only(Neutral::Empty, FUNCTIONS_WHY);
    pub const FUNCTION_CALL: Rule = only(Neutral::NoneStr, FUNCTIONS_WHY);

    // Serving: what the server around the model does not do.
    pub const PRIORITY: Rule = only(
        Neutral::Zero,
        "specd serves requests in arrival order (priority 0 only)",
    );
    pub const KV_TRANSFER: Rule = never("specd does not transfer KV caches between servers");
    pub const VLLM_XARGS: Rule = only(Neutral::Empty, "specd takes no vLLM extra arguments");
    pub const MM_KWARGS: Rule = only(Neutral::Empty, "the served model reads text only");
    pub const LORA: Rule = never("specd serves no LoRA adapters");
    pub const SESSIONS: Rule = never("specd keeps no sessions; its prefix cache reuses prompts");
    pub const CONVERSATIONS: Rule = never("specd keeps no conversations; use previous_response_id");
}
use reasons::*;

/// The request extensions vLLM's and SGLang's OpenAI servers add to both
/// chat and completions, which routers (vllm-router, the SGLang gateway)
/// and benchmark clients (guidellm, `vllm bench serve`) send, mostly at
/// their neutral values. Those that change the output and that specd
/// implements are in [`COMMON`].
pub static VLLM_SHARED: &[Row] = &[
    // Identify or route a request; no effect on its tokens.
    (&["request_id", "rid", "cache_salt"], Rule::Inert),
    // Token ids in the answer (`openai::TokenIdFields`).
    (
        &["return_tokens_as_token_ids", "return_token_ids"],
        Rule::Used,
    ),
    (&["use_beam_search"], BEAM_SEARCH),
    (&["length_penalty"], LENGTH_PENALTY),
    (&["spaces_between_special_tokens"], SPACES),
    (&["truncate_prompt_tokens"], TRUNCATE),
    (&["allowed_token_ids"], VOCABULARY),
    (&["bad_words"], BAD_WORDS),
    (&["prompt_logprobs"], PROMPT_LOGPROBS),
    (&["priority"], PRIORITY),
    (&["logits_processors"], PROCESSOR_LIST),
    (&["custom_logit_processor", "custom_params"], PROCESSORS),
    (&["return_hidden_states"], HIDDEN_STATES),
    (&["kv_transfer_params"], KV_TRANSFER),
    (&["vllm_xargs"], VLLM_XARGS),
    (&["mm_processor_kwargs"], MM_KWARGS),
    (
        &[
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "guided_decoding_backend",
            "guided_whitespace_pattern",
            "structural_tag",
            "structured_outputs",
            "regex",
            "ebnf",
            "json_schema",
        ],
        STRUCTURED,
    ),
    (&["lora_path"], LORA),
    (&["session_params"], SESSIONS),
];

/// vLLM's and SGLang's chat-only extensions.
pub static VLLM_CHAT: &[Row] = &[
    (&["add_generation_prompt"], GENERATION_PROMPT),
    (&["continue_final_message"], CONTINUE_FINAL),
    (&["echo"], ECHO_CHAT),
    (&["add_special_tokens"], CHAT_SPECIAL_TOKENS),
    (&["chat_template"], CHAT_TEMPLATE),
    (&["chat_template_kwargs"], TEMPLATE_KWARGS),
    (&["documents"], DOCUMENTS),
    (&["best_of"], ONE_CHOICE),
    // The served models do not reason: no reasoning text to separate,
    // stream or include.
    (
        &[
            "separate_reasoning",
            "stream_reasoning",
            "include_reasoning",
        ],
        Rule::Inert,
    ),
];

/// vLLM's completions-only extensions.
pub static VLLM_COMPLETIONS: &[Row] = &[(&["add_special_tokens"], PROMPT_SPECIAL_TOKENS)];

/// `stream_options` of both OpenAI APIs.
pub static STREAM_OPTIONS: Table = Table {
    api: "OpenAI stream options",
    fields: &[
        (&["include_usage"], Rule::Used),
        // vLLM's: usage on every chunk. specd sends it with the last.
        (&["continuous_usage_stats"], Rule::Inert),
    ],
    common: false,
    extensions: &[],
};

pub static OPENAI_CHAT: Table = Table {
    api: "OpenAI chat completions API",
    fields: &[
        (
            &[
                "model",
                "messages",
                "stream",
                "max_tokens",
                "max_completion_tokens",
                "n",
                "stream_options",
                "logprobs",
                "top_logprobs",
                "response_format",
                // Checked against the served model's template (`tools::read`).
                "tools",
                "tool_choice",
            ],
            Rule::Used,
        ),
        (
            &[
                "user",
                "metadata",
                "store",
                "parallel_tool_calls",
                "service_tier",
                "safety_identifier",
                "prompt_cache_key",
            ],
            Rule::Inert,
        ),
        (&["logit_bias"], LOGIT_BIAS),
        (&["functions"], FUNCTIONS),
        (&["function_call"], FUNCTION_CALL),
        (&["modalities"], MODALITIES),
        (&["audio"], TEXT_OUT),
        (&["prediction"], PREDICTION),
        (&["web_search_options"], WEB_SEARCH),
        (&["reasoning_effort"], REASONING),
        (&["verbosity"], VERBOSITY),
    ],
    common: true,
    extensions: &[VLLM_SHARED, VLLM_CHAT],
};

/// One message of an OpenAI chat request.
pub static OPENAI_MESSAGE: Table = Table {
    api: "OpenAI chat message",
    fields: &[
        (
            &["role", "content", "tool_calls", "tool_call_id"],
            Rule::Used,
        ),
        (&["refusal"], Rule::Inert),
        (&["name"], NAMES),
        (&["function_call"], FUNCTIONS),
        (&["audio"], AUDIO_IN),
    ],
    common: false,
    extensions: &[],
};

pub static OPENAI_COMPLETIONS: Table = Table {
    api: "OpenAI completions API",
    fields: &[
        (
            &[
                "model",
                "prompt",
                "stream",
                "max_tokens",
                "n",
                "echo",
                "logprobs",
                "stream_options",
            ],
            Rule::Used,
        ),
        (&["user"], Rule::Inert),
        (&["logit_bias"], LOGIT_BIAS),
        (&["best_of"], ONE_CHOICE),
        (&["suffix"], FILL_IN_MIDDLE),
    ],
    common: true,
    extensions: &[VLLM_SHARED, VLLM_COMPLETIONS],
};

/// OpenAI's Responses API (`/v1/responses`); the speculation and sampling
/// fields are the other routes' ([`COMMON`]).
pub static OPENAI_RESPONSES: Table = Table {
    api: "OpenAI responses API",
    fields: &[
        (
            &[
                "model",
                "input",
                "instructions",
                "stream",
                "max_output_tokens",
                // Checked item by item (`responses::read_tools`): functions only.
                "tools",
                "tool_choice",
                "text",
                "store",
                "previous_response_id",
            ],
            Rule::Used,
        ),
        (
            &[
                "metadata",
                "user",
                "parallel_tool_calls",
                "service_tier",
                "safety_identifier",
                "prompt_cache_key",
                "prompt_cache_retention",
                "stream_options",
                // The calls of one answer come in one turn: nothing to cap.
                "max_tool_calls",
            ],
            Rule::Inert,
        ),
        (&["truncation"], TRUNCATION),
        (&["reasoning"], REASONING_OFF),
        (&["include"], INCLUDE),
        (&["top_logprobs"], RESPONSE_LOGPROBS),
        (&["background"], BACKGROUND),
        (&["conversation"], CONVERSATIONS),
        (&["prompt"], STORED_PROMPT),
    ],
    common: true,
    extensions: &[],
};

pub static OLLAMA_GENERATE: Table = Table {
    api: "Ollama generate API",
    fields: &[
        (
            &[
                "model",
                "prompt",
                "system",
                "raw",
                "stream",
                "options",
                "logprobs",
                "top_logprobs",
                "format",
            ],
            Rule::Used,
        ),
        (&["keep_alive"], Rule::Inert),
        (&["suffix"], FILL_IN_MIDDLE),
        (&["template"], OLLAMA_TEMPLATE),
        (&["context"], CONTEXT),
        (&["images"], IMAGES_IN),
        (&["think"], THINK),
        (&["width", "height", "steps"], IMAGES_OUT),
    ],
    common: false,
    extensions: &[],
};

pub static OLLAMA_CHAT: Table = Table {
    api: "Ollama chat API",
    fields: &[
        (
            &[
                "model",
                "messages",
                "stream",
                "options",
                "logprobs",
                "top_logprobs",
                // Checked against the served model's template (`tools::read`).
                "tools",
                "format",
            ],
            Rule::Used,
        ),
        (&["keep_alive"], Rule::Inert),
        (&["think"], THINK),
    ],
    common: false,
    extensions: &[],
};

/// One message of an Ollama chat request.
pub static OLLAMA_MESSAGE: Table = Table {
    api: "Ollama chat message",
    fields: &[
        (&["role", "content", "tool_calls", "tool_name"], Rule::Used),
        (&["images"], IMAGES_IN),
        (&["thinking"], THINKING),
    ],
    common: false,
    extensions: &[],
};

/// Ollama's `options` (its Modelfile parameters).
pub static OLLAMA_OPTIONS: Table = Table {
    api: "Ollama options",
    fields: &[
        (
            &[
                "num_predict",
                // Checked against the model's context where the options are read.
                "num_ctx",
                "trace_rounds",
                // A specd extension (Ollama's API has none): OpenAI's `tool_choice`.
                "tool_choice",
            ],
            Rule::Used,
        ),
        // Load-time and performance settings: no effect on the tokens.
        (
            &[
                "num_keep",
                "num_batch",
                "num_gpu",
                "main_gpu",
                "num_thread",
                "numa",
                "low_vram",
                "f16_kv",
                "use_mmap",
                "use_mlock",
                "vocab_only",
                "logits_all",
                "embedding_only",
            ],
            Rule::Inert,
        ),
        // Ollama itself no longer applies it.
        (&["penalize_newline"], Rule::Inert),
        // Only read when mirostat is on, which is refused.
        (&["mirostat_tau", "mirostat_eta"], Rule::Inert),
        (&["mirostat"], MIROSTAT),
        (&["typical_p"], TYPICAL),
        (&["tfs_z"], TAIL_FREE),
    ],
    common: true,
    extensions: &[],
};

#[cfg(test)]
mod tests;
