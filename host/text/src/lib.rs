//! specd-text: everything text-side, no MLX.
//!
//! - [`gguf`]: GGUF header, metadata and tensor-info reader;
//! - [`tokenizer`]: the tokenizer (tokenizer.json or GGUF metadata);
//! - [`detok`]: streaming detokenizer (complete UTF-8 only);
//! - [`chat`]: chat templates (Jinja via minijinja; none is an error for chat);
//! - [`stop`]: stop strings across streamed chunks;
//! - [`tool_calls`]: tool-call formats, parsing them out of the output;
//! - [`pyjson`]: JSON as Python's `json.dumps` writes it (templates' `tojson`).

pub mod chat;
pub mod detok;
pub mod gguf;
pub mod pyjson;
pub mod stop;
pub mod tokenizer;
pub mod tool_calls;

pub use chat::{ChatMessage, ChatTemplate, NoChatTemplate, NoToolSupport, CHATML_TEMPLATE};
pub use detok::StreamDetokenizer;
pub use gguf::{GgufArray, GgufFile, GgufMeta, GgufType, GgufValue, TensorInfo};
pub use stop::{StopMatcher, StopOutput};
pub use tokenizer::Tokenizer;
pub use tool_calls::{ToolCall, ToolFormat, ToolStream};
