//! A completions request's `prompt` in every shape OpenAI and vLLM take: a
//! string, a list of strings, a list of token ids, or a list of lists of
//! token ids (lm-eval's `local-completions` sends the last for a batch).
//! Several prompts are one choice each, in order.
use super::api::ApiError;
use crate::request::Prompt;
use serde_json::Value;

/// One prompt of a completions request.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptIn {
    Text(String),
    /// Token ids, each below the model's vocabulary size.
    Ids(Vec<u32>),
}

impl PromptIn {
    /// What the engine takes.
    pub fn prompt(&self) -> Prompt {
        match self {
            PromptIn::Text(t) => Prompt::Raw(t.clone()),
            PromptIn::Ids(ids) => Prompt::Tokens(ids.clone()),
        }
    }

    /// Its text, as `echo` returns it (token ids decoded).
    pub fn text(&self, tok: &specd_text::Tokenizer) -> String {
        match self {
            PromptIn::Text(t) => t.clone(),
            PromptIn::Ids(ids) => tok.decode(ids),
        }
    }
}

const SHAPES: &str =
    "a string, a list of strings, a list of token ids or a list of lists of token ids";

fn bad(message: String) -> ApiError {
    let mut e = ApiError::bad(message);
    e.param = Some("prompt".into());
    e
}

/// A list of token ids; `at` names it in errors (`prompt`, `prompt[2]`).
fn ids(items: &[Value], at: &str, vocab: usize) -> Result<Vec<u32>, ApiError> {
    if items.is_empty() {
        return Err(bad(format!("{at} is an empty list of token ids")));
    }
    items
        .iter()
        .enumerate()
        .map(|(j, v)| match v.as_i64() {
            Some(t) if t >= 0 && (t as u64) < vocab as u64 => Ok(t as u32),
            Some(t) => Err(bad(format!(
                "{at}[{j}]: token id {t} is outside the model's vocabulary (0..{vocab})"
            ))),
            None => Err(bad(format!(
                "{at}[{j}] must be a token id (an integer), got {v}"
            ))),
        })
        .collect()
}

/// The prompts of a completions body's `prompt`, in order; token ids are
/// checked against `vocab`.
pub fn read(v: Option<&Value>, vocab: usize) -> Result<Vec<PromptIn>, ApiError> {
    let a = match v {
        None | Some(Value::Null) => return Err(bad("prompt is required".into())),
        Some(Value::String(s)) => return Ok(vec![PromptIn::Text(s.clone())]),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad(format!("prompt must be {SHAPES}"))),
    };
    match a.first() {
        None => Err(bad("prompt must not be an empty list".into())),
        Some(Value::String(_)) => a
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                Value::String(s) => Ok(PromptIn::Text(s.clone())),
                _ => Err(bad(format!(
                    "prompt[{i}] must be a string like the prompts before it ({SHAPES})"
                ))),
            })
            .collect(),
        Some(Value::Number(_)) => Ok(vec![PromptIn::Ids(ids(a, "prompt", vocab)?)]),
        Some(Value::Array(_)) => a
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                Value::Array(items) => {
                    Ok(PromptIn::Ids(ids(items, &format!("prompt[{i}]"), vocab)?))
                }
                _ => Err(bad(format!(
                    "prompt[{i}] must be a list of token ids like the prompts before it ({SHAPES})"
                ))),
            })
            .collect(),
        Some(_) => Err(bad(format!("prompt must be {SHAPES}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        read(Some(&v), 100).unwrap_err().message
    }

    #[test]
    fn every_shape_reads_in_order() {
        let t = |s: &str| PromptIn::Text(s.into());
        assert_eq!(read(Some(&json!("a")), 100).unwrap(), [t("a")]);
        assert_eq!(
            read(Some(&json!(["a", "b"])), 100).unwrap(),
            [t("a"), t("b")]
        );
        assert_eq!(
            read(Some(&json!([1, 2, 3])), 100).unwrap(),
            [PromptIn::Ids(vec![1, 2, 3])]
        );
        assert_eq!(
            read(Some(&json!([[1, 2], [3]])), 100).unwrap(),
            [PromptIn::Ids(vec![1, 2]), PromptIn::Ids(vec![3])]
        );
    }

    #[test]
    fn bad_prompts_are_named() {
        assert!(err(json!([5, 100])).contains("prompt[1]: token id 100 is outside"));
        assert!(err(json!([[1], [2, -1]])).contains("prompt[1][1]: token id -1"));
        assert!(err(json!([[1], []])).contains("prompt[1] is an empty list"));
        assert!(err(json!([])).contains("must not be an empty list"));
        assert!(err(json!(["a", 1])).contains("prompt[1] must be a string"));
        assert!(err(json!([[1], "a"])).contains("prompt[1] must be a list of token ids"));
        assert!(err(json!([1.5])).contains("prompt[0] must be a token id"));
        assert!(err(json!({"a": 1})).contains("prompt must be a string, a list"));
        let e = read(None, 100).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }
}
