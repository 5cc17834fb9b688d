//! One stream assembler for both APIs. The worker's messages become
//! [`Piece`]s: text with the logprobs of the tokens it holds, round traces,
//! and the end with whatever was held back. Logprobs wait for the text they
//! belong to; tool calls are held back from the content and come whole at
//! the end; completions' echoed prompt goes out before the first text. The
//! Ollama and OpenAI routes only format pieces.
use super::worker::{LogprobEntry, Msg};
use crate::sequence::Stats;
use crate::speculation::RoundTrace;
use futures_util::Stream;
use specd_text::{ToolCall, ToolFormat, ToolStream};
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;

/// What a stream sends next, before its API's formatting.
pub enum Piece {
    /// Text, with the logprobs of its tokens (and of the echoed prompt's,
    /// with the first).
    Text {
        text: String,
        logprobs: Vec<LogprobEntry>,
    },
    /// Round traces, as they end (`trace_rounds`).
    Rounds(Vec<RoundTrace>),
    /// Generation ended. `text`: what was held back and not sent (an echo
    /// that no text followed, held-back text that was not a tool call after
    /// all); `calls`: the tool calls parsed from the held-back text;
    /// `logprobs`: those whose text never came (held back by a stop string).
    Done {
        text: String,
        calls: Vec<ToolCall>,
        logprobs: Vec<LogprobEntry>,
        stats: Box<Stats>,
        log: Vec<u32>,
    },
    /// Refused or failed: the stream's last piece.
    Failed(String),
}

/// Holds back what a stream must not send yet ([`Piece`]).
pub struct Assembler {
    prefix: Option<String>,
    pending: Vec<LogprobEntry>,
    calls: Option<ToolStream>,
}

impl Assembler {
    /// `prefix` goes out before the first text (completions' `echo`; empty:
    /// none); `tools`: the format of the tool calls to hold back.
    pub fn new(prefix: String, tools: Option<ToolFormat>) -> Assembler {
        Assembler {
            prefix: Some(prefix).filter(|p| !p.is_empty()),
            pending: Vec::new(),
            calls: tools.map(ToolStream::new),
        }
    }

    /// The piece `msg` completes, if any.
    pub fn push(&mut self, msg: Msg) -> Option<Piece> {
        match msg {
            Msg::Logprobs(e) => {
                self.pending.push(e);
                None
            }
            Msg::PromptLogprobs(v) => {
                self.pending.extend(v);
                None
            }
            Msg::Chunk(t) => {
                let t = match self.calls.as_mut() {
                    Some(c) => c.push(&t),
                    None => t,
                };
                if t.is_empty() {
                    return None;
                }
                let text = match self.prefix.take() {
                    Some(p) => p + &t,
                    None => t,
                };
                Some(Piece::Text {
                    text,
                    logprobs: std::mem::take(&mut self.pending),
                })
            }
            Msg::Done { stats, log } => {
                let parsed = self
                    .calls
                    .take()
                    .map(ToolStream::finish)
                    .unwrap_or_default();
                Some(Piece::Done {
                    text: self.prefix.take().unwrap_or_default() + &parsed.content,
                    calls: parsed.calls,
                    logprobs: std::mem::take(&mut self.pending),
                    stats,
                    log,
                })
            }
            Msg::Failed(e) | Msg::Error { message: e, .. } => Some(Piece::Failed(e)),
            Msg::Rounds(r) => Some(Piece::Rounds(r)),
            Msg::Started { .. } => None,
        }
    }
}

/// A response stream: `format` turns each piece into the items to send and
/// whether that was the last.
pub fn pieces<T, F>(
    rx: UnboundedReceiver<Msg>,
    mut asm: Assembler,
    mut format: F,
) -> impl Stream<Item = Result<T, Infallible>>
where
    T: Send + 'static,
    F: FnMut(Piece) -> (Vec<T>, bool) + Send + 'static,
{
    super::api::stream_of(rx, move |msg| match asm.push(msg) {
        Some(p) => format(p),
        None => (vec![], false),
    })
}
