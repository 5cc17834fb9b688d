//! Tool calls in generated text: which format a chat template asks the model
//! to write them in, parsing them out of the output, and holding back the
//! text of a call while streaming so that it never reaches the client as
//! content.
//!
//! The formats:
//! - [`ToolFormat::Hermes`]: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
//!   one block per call (Hermes, Qwen2.5, Qwen3 templates);
//! - [`ToolFormat::Mistral`]: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`;
//! - [`ToolFormat::Json`]: the whole answer is one JSON object
//!   `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`
//!   (Llama 3.1 / 3.2 templates).
use serde_json::Value;

/// How a template's model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Mistral,
    Json,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_MARK: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolFormat {
    /// The format a template's source shows its model (it renders earlier
    /// calls the way the model is to write new ones).
    pub fn of_template(source: &str) -> ToolFormat {
        if source.contains(HERMES_OPEN) {
            ToolFormat::Hermes
        } else if source.contains(MISTRAL_MARK) {
            ToolFormat::Mistral
        } else {
            ToolFormat::Json
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes (<tool_call>)",
            ToolFormat::Mistral => "mistral ([TOOL_CALLS])",
            ToolFormat::Json => "json ({\"name\", \"parameters\"})",
        }
    }
}

/// One parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// A JSON object.
    pub arguments: Value,
}

/// An answer split into its text and its calls.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parsed {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// `{"name": ..., "arguments" | "parameters": {...}}` (arguments may also be
/// a string holding the object).
fn call_of(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok()?,
        Some(a) => a.clone(),
    };
    arguments
        .is_object()
        .then_some(ToolCall { name, arguments })
}

/// One JSON object or an array of them.
fn calls_of(text: &str) -> Option<Vec<ToolCall>> {
    match serde_json::from_str::<Value>(text.trim()).ok()? {
        Value::Array(a) if !a.is_empty() => a.iter().map(call_of).collect(),
        v @ Value::Object(_) => call_of(&v).map(|c| vec![c]),
        _ => None,
    }
}

/// Splits `text` into content and calls. Text that looks like a call but
/// does not parse stays content, so nothing the model wrote is lost.
pub fn parse(format: ToolFormat, text: &str) -> Parsed {
    match format {
        ToolFormat::Hermes => {
            let mut out = Parsed::default();
            let mut rest = text;
            while let Some(i) = rest.find(HERMES_OPEN) {
                out.content.push_str(&rest[..i]);
                let body = &rest[i + HERMES_OPEN.len()..];
                // An unclosed last block (the model stopped at its end) still counts.
                let (inner, after) = match body.find(HERMES_CLOSE) {
                    Some(j) => (&body[..j], &body[j + HERMES_CLOSE.len()..]),
                    None => (body, ""),
                };
                match calls_of(inner) {
                    Some(c) => out.calls.extend(c),
                    None => out.content.push_str(&rest[i..rest.len() - after.len()]),
                }
                rest = after;
            }
            out.content.push_str(rest);
            out.content = out.content.trim().to_string();
            out
        }
        ToolFormat::Mistral => match text.find(MISTRAL_MARK) {
            Some(i) => match calls_of(&text[i + MISTRAL_MARK.len()..]) {
                Some(calls) => Parsed {
                    content: text[..i].trim().to_string(),
                    calls,
                },
                None => Parsed {
                    content: text.to_string(),
                    calls: vec![],
                },
            },
            None => Parsed {
                content: text.to_string(),
                calls: vec![],
            },
        },
        ToolFormat::Json => {
            let t = text.trim_start();
            let t = t.strip_prefix(PYTHON_TAG).unwrap_or(t);
            match calls_of(t) {
                Some(calls) => Parsed {
                    content: String::new(),
                    calls,
                },
                None => Parsed {
                    content: text.to_string(),
                    calls: vec![],
                },
            }
        }
    }
}

/// Streams an answer's text while holding back what may be a tool call:
/// from a call's marker on (or, for [`ToolFormat::Json`], an answer that
/// opens with `{`), text waits for [`finish`](Self::finish), which parses
/// the whole answer.
#[derive(Debug)]
pub struct ToolStream {
    format: ToolFormat,
    /// Everything pushed.
    text: String,
    /// How much of `text` went out as content.
    sent: usize,
    /// A call started: nothing more goes out before the end.
    held: bool,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> Self {
        ToolStream {
            format,
            text: String::new(),
            sent: 0,
            held: false,
        }
    }

    /// Adds generated text; returns the content that can go out now.
    pub fn push(&mut self, chunk: &str) -> String {
        self.text.push_str(chunk);
        if self.held {
            return String::new();
        }
        let pending = &self.text[self.sent..];
        let safe = match self.format {
            ToolFormat::Hermes | ToolFormat::Mistral => {
                let mark = if self.format == ToolFormat::Hermes {
                    HERMES_OPEN
                } else {
                    MISTRAL_MARK
                };
                match pending.find(mark) {
                    Some(i) => {
                        self.held = true;
                        i
                    }
                    // Keep back a tail that may be the start of the marker.
                    None => pending.len() - partial_suffix(pending, mark),
                }
            }
            ToolFormat::Json => {
                let t = self.text.trim_start();
                if t.is_empty() || PYTHON_TAG.starts_with(t) {
                    0
                } else if t.starts_with('{') || t.starts_with(PYTHON_TAG) {
                    self.held = true;
                    0
                } else {
                    pending.len()
                }
            }
        };
        let out = pending[..safe].to_string();
        self.sent += safe;
        out
    }

    /// The end of the answer: the content not yet sent, and the calls.
    pub fn finish(self) -> Parsed {
        let mut p = parse(self.format, &self.text);
        // What went out already is part of `p.content`'s start (modulo
        // trimming): send only the rest.
        let sent = self.text[..self.sent].trim_start();
        p.content = match p.content.strip_prefix(sent) {
            Some(rest) => rest.to_string(),
            None if p.calls.is_empty() => self.text[self.sent..].to_string(),
            None => String::new(),
        };
        p
    }
}

/// The length of the longest suffix of `s` that is a proper prefix of `mark`
/// (at a character boundary).
fn partial_suffix(s: &str, mark: &str) -> usize {
    (1..mark.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && mark.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_each_format_and_keeps_what_does_not_parse() {
        let p = parse(
            ToolFormat::Hermes,
            "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"b\\\": 2}\"}",
        );
        assert_eq!(p.content, "Let me check.");
        assert_eq!(
            p.calls,
            vec![
                ToolCall {
                    name: "f".into(),
                    arguments: json!({"a": 1})
                },
                ToolCall {
                    name: "g".into(),
                    arguments: json!({"b": 2})
                },
            ]
        );
        let p = parse(ToolFormat::Hermes, "x <tool_call>not json</tool_call> y");
        assert_eq!(
            (p.content.as_str(), p.calls.len()),
            ("x <tool_call>not json</tool_call> y", 0)
        );
        let p = parse(
            ToolFormat::Mistral,
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\"}]",
        );
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[1].arguments, json!({}));
        let p = parse(
            ToolFormat::Json,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}",
        );
        assert_eq!(p.calls[0].arguments, json!({"q": "x"}));
        assert_eq!(parse(ToolFormat::Json, "{\"a\": 1}").calls.len(), 0);
        assert_eq!(
            ToolFormat::of_template("{{ '<tool_call>' }}"),
            ToolFormat::Hermes
        );
    }

    fn stream(format: ToolFormat, pieces: &[&str]) -> (String, Parsed) {
        let mut s = ToolStream::new(format);
        let mut sent = String::new();
        for p in pieces {
            sent.push_str(&s.push(p));
        }
        (sent, s.finish())
    }

    #[test]
    fn streaming_holds_back_calls_and_sends_the_rest() {
        let (sent, p) = stream(
            ToolFormat::Hermes,
            &[
                "Hi ",
                "there <tool",
                "_call>{\"name\": \"f\", ",
                "\"arguments\": {}}</tool_call>",
            ],
        );
        assert_eq!(sent, "Hi there ");
        assert_eq!((p.content.as_str(), p.calls.len()), ("", 1));
        // A partial marker that turns out to be text goes out after all.
        let (sent, p) = stream(ToolFormat::Hermes, &["a <to", "e> b"]);
        assert_eq!(format!("{sent}{}", p.content), "a <toe> b");
        assert!(p.calls.is_empty());
        // A block that does not parse comes back as content at the end.
        let (sent, p) = stream(ToolFormat::Hermes, &["a ", "<tool_call>oops"]);
        assert_eq!(
            (sent.as_str(), p.content.as_str()),
            ("a ", "<tool_call>oops")
        );
        let (sent, p) = stream(
            ToolFormat::Json,
            &[" {\"name\": \"f\",", " \"parameters\": {}}"],
        );
        assert_eq!((sent.as_str(), p.calls.len()), ("", 1));
        let (sent, p) = stream(ToolFormat::Json, &["Hello", " world"]);
        assert_eq!((sent.as_str(), p.content.as_str()), ("Hello world", ""));
    }
}
