//! Chat templates: the model's own Jinja template rendered with minijinja the
//! way transformers renders it (`trim_blocks`, `lstrip_blocks`, `messages`,
//! `tools`, `add_generation_prompt`, `bos_token`, `eos_token`,
//! `raise_exception`, `tojson` as Python's `json.dumps`, `strftime_now`,
//! Python string methods via pycompat, dict keys in their given order). A model
//! without a template (a base model) takes raw prompts only: rendering chat
//! for it is [`NoChatTemplate`], never a guessed format.

use crate::tokenizer::Tokenizer;
use crate::tool_calls::ToolFormat;
use anyhow::{anyhow, Context, Result};
use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

/// ChatML (what Qwen-style instruct models use), for callers that want it
/// explicitly; never applied to a model that has no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// One chat message, with the fields tool-using templates read (absent,
/// not null, when unset: templates test them with `is defined`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's calls as transformers passes them to templates:
    /// `{"id"?, "type": "function", "function": {"name", "arguments": {...}}}`
    /// with the arguments an object, not a JSON string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool result's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A tool result's function name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// Chat messages sent to a model that has no chat template. Callers turn it
/// into a refusal (CLI error, HTTP 400): completion mode is the only mode
/// such a model has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoChatTemplate;

impl std::fmt::Display for NoChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the model has no chat template, so it takes raw prompts only \
             (completion mode: no --chat; \"raw\": true on /api/generate; /v1/completions)",
        )
    }
}

impl std::error::Error for NoChatTemplate {}

/// Tools sent to a model whose template does not render them. Callers turn
/// it into a refusal (HTTP 400 naming `tools`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoToolSupport;

impl std::fmt::Display for NoToolSupport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the served model's chat template does not render tools, \
             so the model cannot be told about them (a model whose template uses `tools` can)",
        )
    }
}

impl std::error::Error for NoToolSupport {}

/// A compiled chat template, or the lack of one.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `false` for a model without a template: rendering is an error.
    present: bool,
    /// How the model writes tool calls, when the template renders `tools`.
    tools: Option<ToolFormat>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `tojson` as transformers defines it: Python's `json.dumps` (no HTML
/// escaping, `", "` / `": "` separators), with its `indent` and `sort_keys`.
fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<usize>>("indent")? {
        Some(i) => Some(i),
        None => indent,
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    // Python's defaults only: other separators or ASCII escaping are not offered.
    if kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: ensure_ascii=True is not supported",
        ));
    }
    kwargs.assert_all_used()?;
    let v = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(crate::pyjson::dumps(
        &v, indent, sort_keys,
    )))
}

/// `strftime_now(fmt)` as transformers provides it (UTC, Python's strftime
/// directives); an unknown directive is a template error.
fn strftime_now(fmt: String) -> Result<String, Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Utc::now().format(&fmt)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: bad format {fmt:?}"),
        )
    })?;
    Ok(out)
}

impl ChatTemplate {
    /// Compile a template. `bos_token`/`eos_token` are the texts the template
    /// sees under those names (empty when the model has none).
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| anyhow!("invalid chat template: {e:#}"))?;
        // A template that reads `tools` renders them (transformers passes
        // them as that variable); one that never does cannot.
        let reads_tools = env
            .get_template("chat")
            .map(|t| t.undeclared_variables(false).contains("tools"))
            .unwrap_or(false);
        Ok(ChatTemplate {
            env,
            present: true,
            tools: reads_tools.then(|| ToolFormat::of_template(source)),
            source: source.to_string(),
            bos_token: bos_token.unwrap_or_default(),
            eos_token: eos_token.unwrap_or_default(),
        })
    }

    /// The model's template (GGUF `tokenizer.chat_template` or
    /// tokenizer_config.json's `chat_template`); without one, a template
    /// whose rendering is [`NoChatTemplate`].
    pub fn from_tokenizer(tok: &Tokenizer) -> Result<Self> {
        match tok.chat_template() {
            Some(src) => Self::new(src, tok.bos_token(), tok.eos_token()),
            None => Ok(Self::none()),
        }
    }

    /// The template of a model that has none.
    pub fn none() -> Self {
        ChatTemplate {
            env: Environment::new(),
            present: false,
            tools: None,
            source: String::new(),
            bos_token: String::new(),
            eos_token: String::new(),
        }
    }

    /// Whether the model has a template (chat is possible).
    pub fn is_present(&self) -> bool {
        self.present
    }

    /// ChatML.
    pub fn chatml() -> Self {
        Self::new(CHATML_TEMPLATE, None, None).expect("ChatML template compiles")
    }

    /// How the model writes tool calls; `None` when its template does not
    /// render tools.
    pub fn tool_format(&self) -> Option<ToolFormat> {
        self.tools
    }

    /// The template's text; empty when the model has none.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render a conversation.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let msgs = serde_json::to_value(messages).context("serializing chat messages")?;
        self.render_json(&msgs, add_generation_prompt, &serde_json::Value::Null)
    }

    /// Render a conversation with tools (OpenAI's function objects, passed
    /// to the template as `tools`, as transformers does). Tools are
    /// [`NoToolSupport`] for a template that does not render them.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        if tools.is_empty() {
            return self.render(messages, add_generation_prompt);
        }
        if !self.present {
            return Err(NoChatTemplate.into());
        }
        if self.tools.is_none() {
            return Err(NoToolSupport.into());
        }
        let msgs = serde_json::to_value(messages).context("serializing chat messages")?;
        self.render_json(
            &msgs,
            add_generation_prompt,
            &serde_json::json!({ "tools": tools }),
        )
    }

    /// Render messages given as JSON (any shape the template understands,
    /// e.g. with tool calls), with extra top-level variables from `extra` (a
    /// JSON object, e.g. `{"tools": [...]}`; null for none).
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: &serde_json::Value,
    ) -> Result<String> {
        if !self.present {
            return Err(NoChatTemplate.into());
        }
        let mut ctx = serde_json::Map::new();
        if let serde_json::Value::Object(o) = extra {
            for (k, v) in o {
                ctx.insert(k.clone(), v.clone());
            }
        }
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| anyhow!("{e:#}"))?;
        tmpl.render(Value::from_serialize(&ctx))
            .map_err(|e| anyhow!("rendering the chat template failed: {e:#}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templateless_models_refuse_chat() {
        let t = ChatTemplate::none();
        assert!(!t.is_present());
        assert_eq!(t.source(), "");
        let e = t.render(&[ChatMessage::user("Hi")], true).unwrap_err();
        assert!(e.downcast_ref::<NoChatTemplate>().is_some(), "{e:#}");
        assert!(format!("{e:#}").contains("no chat template"), "{e:#}");
    }

    #[test]
    fn chatml_renders() {
        let t = ChatTemplate::chatml();
        let s = t
            .render(&[ChatMessage::system("S"), ChatMessage::user("Hi")], true)
            .unwrap();
        assert_eq!(s, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        let s = t.render(&[ChatMessage::user("Hi")], false).unwrap();
        assert_eq!(s, "<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn hf_template_features_render_and_errors_surface() {
        let src = "{{ bos_token }}{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}\n  {{ m.content.strip().upper() | tojson }}{% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into())).unwrap();
        let s = t
            .render(&[ChatMessage::user("  hi \"x\" ")], false)
            .unwrap();
        assert_eq!(s, "<s>  \"HI \\\"X\\\"\"</s>");
        let e = t.render(&[ChatMessage::system("x")], false).unwrap_err();
        assert!(format!("{e:#}").contains("bad role system"), "{e:#}");
        let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d %b') }}", None, None).unwrap();
        let s = t.render(&[], false).unwrap();
        assert_eq!(s.len(), 14, "{s}");
        let t = ChatTemplate::new("{{ strftime_now('%Q') }}", None, None).unwrap();
        assert!(
            t.render(&[], false).is_err(),
            "an unknown directive is an error"
        );
        assert!(ChatTemplate::new("{% if %}", None, None).is_err());
    }

    #[test]
    fn tools_render_where_the_template_reads_them() {
        let src = "{% if tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}\
{% for m in messages %}{{ m.role }}:{{ m.content }}\
{% if m.tool_calls is defined %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endif %}\
{% if m.tool_call_id is defined %}[{{ m.tool_call_id }}]{% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        assert_eq!(t.tool_format(), Some(ToolFormat::Hermes));
        let tool = serde_json::json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
        let mut call = ChatMessage::assistant("");
        call.tool_calls = Some(vec![
            serde_json::json!({"type": "function", "function": {"name": "f", "arguments": {"x": "<1>"}}}),
        ]);
        let mut result = ChatMessage::new("tool", "42");
        result.tool_call_id = Some("call_1".into());
        let s = t
            .render_with_tools(&[ChatMessage::user("hi"), call, result], &[tool], false)
            .unwrap();
        // Keys in the given order, Python's separators, no HTML escaping
        // (and `trim_blocks` eats the newline after each block tag).
        assert_eq!(
            s,
            "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}\n\
user:hiassistant:<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": \"<1>\"}}</tool_call>tool:42[call_1]"
        );
        // ChatML reads no tools: refused with its own error.
        let e = ChatTemplate::chatml()
            .render_with_tools(&[ChatMessage::user("hi")], &[serde_json::json!({})], true)
            .unwrap_err();
        assert!(e.downcast_ref::<NoToolSupport>().is_some(), "{e:#}");
        assert_eq!(ChatTemplate::chatml().tool_format(), None);
        let t = ChatTemplate::new("{{ {'b': 1, 'a': [1, 2]} | tojson(indent=1) }}", None, None)
            .unwrap();
        assert_eq!(
            t.render(&[], false).unwrap(),
            "{\n \"b\": 1,\n \"a\": [\n  1,\n  2\n ]\n}"
        );
    }
}
