//! `POST /tokenize` and `/detokenize` in the two shapes clients send:
//! vLLM's (`{"prompt"}` or `{"messages"}` -> `{"tokens", "count",
//! "max_model_len"}`; `{"tokens"}` -> `{"prompt"}`) and llama-server's
//! (`{"content"}` -> `{"tokens"}`, with `with_pieces` each token's text;
//! `{"tokens"}` -> `{"content"}`). Each answers in the shape it was asked
//! in: `prompt`/`messages` are vLLM's, `content` is llama-server's; a
//! detokenize body naming a `model` is vLLM's, one without is answered
//! with both keys. The tokens are exactly the ids the server feeds the
//! model for the same completions prompt or chat messages.
use super::api::{self, ApiError, Flavor};
use super::fields::{reasons, Neutral, Rule, Table};
use super::State;
use crate::engine::Prompt;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::Json;
use serde_json::{json, Value};

pub static TOKENIZE: Table = Table {
    api: "tokenize API (vLLM's or llama-server's)",
    fields: &[
        // vLLM's: a completions prompt or chat messages.
        (
            &[
                "model",
                "prompt",
                "messages",
                "tools",
                "add_special_tokens",
                "add_generation_prompt",
                "return_token_strs",
            ],
            Rule::Used,
        ),
        (&["continue_final_message"], reasons::CONTINUE_FINAL),
        (&["chat_template"], reasons::CHAT_TEMPLATE),
        (&["chat_template_kwargs"], reasons::TEMPLATE_KWARGS),
        // llama-server's.
        (&["content", "add_special", "with_pieces"], Rule::Used),
        (
            &["parse_special"],
            Rule::NeutralOnly(
                Neutral::True,
                "special tokens written in the text always encode as their ids",
            ),
        ),
    ],
    common: false,
    extensions: &[],
};

pub static DETOKENIZE: Table = Table {
    api: "detokenize API (vLLM's or llama-server's)",
    fields: &[(&["model", "tokens"], Rule::Used)],
    common: false,
    extensions: &[],
};

fn flag(v: &Value, key: &str, default: bool) -> Result<bool, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::bad(format!(
            "{key} must be true or false, got {other}"
        ))),
    }
}

fn check_model(state: &State, v: &Value) -> Result<(), ApiError> {
    match v.get("model").and_then(Value::as_str) {
        // Both servers take a body without one.
        None => Ok(()),
        Some(m) => state.served_model(&Some(m.to_string())).map(|_| ()),
    }
}

/// A token's text as llama-server's `with_pieces` gives it: a string
/// where its bytes are UTF-8, else the bytes.
fn piece(bytes: Vec<u8>) -> Value {
    match String::from_utf8(bytes) {
        Ok(s) => json!(s),
        Err(e) => json!(e.into_bytes()),
    }
}

pub async fn tokenize(
    axum::extract::State(state): axum::extract::State<State>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let v = api::read_body(body, &TOKENIZE).map_err(|e| e.flavor(Flavor::OpenAi))?;
    let llama = v.get("content").is_some();
    let flavor = if llama {
        Flavor::Ollama
    } else {
        Flavor::OpenAi
    };
    tokenize_body(&state, &v, llama).map_err(|e| e.flavor(flavor))
}

fn tokenize_body(state: &State, v: &Value, llama: bool) -> Result<Json<Value>, ApiError> {
    check_model(state, v)?;
    let validator = state.worker.validator();
    let tok = validator.tokenizer();
    let given: Vec<&str> = ["prompt", "messages", "content"]
        .into_iter()
        .filter(|k| v.get(*k).is_some_and(|x| !x.is_null()))
        .collect();
    if given.len() != 1 {
        return Err(ApiError::bad(format!(
            "give one of prompt, messages (vLLM) or content (llama-server){}",
            if given.is_empty() {
                String::new()
            } else {
                format!(", not {}", given.join(" and "))
            }
        )));
    }
    let encoded = |r: anyhow::Result<Vec<u32>>| {
        r.map_err(|e| ApiError::bad(format!("cannot encode the text: {e:#}")))
    };
    if llama {
        let Some(text) = v["content"].as_str() else {
            return Err(ApiError::bad("content must be a string"));
        };
        // llama-server: no BOS unless `add_special`.
        let ids = if flag(v, "add_special", false)? {
            encoded(tok.encode_prompt(text))?
        } else {
            encoded(tok.encode(text, false))?
        };
        if flag(v, "with_pieces", false)? {
            let tokens: Vec<Value> = ids
                .iter()
                .map(|&id| json!({"id": id, "piece": piece(tok.token_bytes(id))}))
                .collect();
            return Ok(Json(json!({ "tokens": tokens })));
        }
        return Ok(Json(json!({ "tokens": ids })));
    }
    let ids = if let Some(p) = v.get("prompt").filter(|p| !p.is_null()) {
        let Some(text) = p.as_str() else {
            return Err(ApiError::bad("prompt must be a string"));
        };
        // vLLM's default adds the special tokens: the ids a completions
        // request with this prompt runs on.
        if flag(v, "add_special_tokens", true)? {
            encoded(tok.encode_prompt(text))?
        } else {
            encoded(tok.encode(text, false))?
        }
    } else {
        let msgs = super::openai::read_messages(v)?;
        let tools = super::tools::read(v.get("tools"), None, state.model.tool_format)?;
        let prompt = match tools {
            Some(t) => Prompt::ChatWithTools(msgs, t.list),
            None => Prompt::Chat(msgs),
        };
        if flag(v, "add_generation_prompt", true)? {
            encoded(validator.encode(&prompt))?
        } else {
            let text = match &prompt {
                Prompt::ChatWithTools(m, t) => validator.template().render_with_tools(m, t, false),
                Prompt::Chat(m) => validator.template().render(m, false),
                _ => unreachable!("built above as chat"),
            };
            let text =
                text.map_err(|e| ApiError::bad(format!("rendering the chat template: {e:#}")))?;
            encoded(tok.encode_prompt(&text))?
        }
    };
    let strs = if flag(v, "return_token_strs", false)? {
        json!(ids
            .iter()
            .map(|&id| tok.id_to_token(id).unwrap_or_default())
            .collect::<Vec<_>>())
    } else {
        Value::Null
    };
    Ok(Json(json!({
        "count": ids.len(),
        "max_model_len": validator.context_length(),
        "tokens": ids,
        "token_strs": strs,
    })))
}

pub async fn detokenize(
    axum::extract::State(state): axum::extract::State<State>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let v = api::read_body(body, &DETOKENIZE).map_err(|e| e.flavor(Flavor::OpenAi))?;
    let vllm = v.get("model").is_some_and(|m| !m.is_null());
    let flavor = if vllm { Flavor::OpenAi } else { Flavor::Ollama };
    detokenize_body(&state, &v, vllm).map_err(|e| e.flavor(flavor))
}

fn detokenize_body(state: &State, v: &Value, vllm: bool) -> Result<Json<Value>, ApiError> {
    check_model(state, v)?;
    let vocab = state.model.vocab_size;
    let Some(items) = v.get("tokens").and_then(Value::as_array) else {
        return Err(ApiError::bad("tokens must be a list of token ids"));
    };
    let ids = items
        .iter()
        .enumerate()
        .map(|(i, t)| match t.as_i64() {
            Some(t) if t >= 0 && (t as u64) < vocab as u64 => Ok(t as u32),
            _ => Err(ApiError::bad(format!(
                "tokens[{i}]: {t} is not a token id of the model's vocabulary (0..{vocab})"
            ))),
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let text = state.worker.validator().tokenizer().decode(&ids);
    Ok(Json(if vllm {
        json!({ "prompt": text })
    } else {
        // The shape is not told apart by the body: both keys.
        json!({ "prompt": text, "content": text })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_name_a_field_once() {
        for t in [&TOKENIZE, &DETOKENIZE] {
            let mut all: Vec<_> = t.fields.iter().map(|(n, _)| *n).collect();
            let n = all.len();
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), n, "{}", t.api);
        }
        let e = super::super::fields::check(&json!({"content": "x", "bogus": 1}), &TOKENIZE, "")
            .unwrap_err();
        assert_eq!(e.field(), "bogus");
    }

    #[test]
    fn pieces_are_text_or_bytes() {
        assert_eq!(piece(b"hi".to_vec()), json!("hi"));
        assert_eq!(piece(vec![0xe2, 0x82]), json!([0xe2, 0x82]));
    }
}
