//! Streaming detokenizer: feed ids one at a time, get back only complete UTF-8
//! text. The concatenation of every `push` plus the final `flush` equals
//! `Tokenizer::decode` of all the ids.
//!
//! For byte-level tokenizers (GPT-2 style, all GGUF `gpt2` vocabularies and
//! tokenizer.json files with a ByteLevel decoder) it works on bytes: each id
//! maps to fixed bytes, and at most the 1-3 bytes of an unfinished character
//! are held back. For other decoders (SentencePiece-style Metaspace /
//! ByteFallback) it keeps a small window of ids, like mlx-lm's and
//! `tokenizers`' DecodeStream: decode(window + new) minus decode(window).

use crate::tokenizer::Tokenizer;
use std::ops::Deref;

/// Incremental decoder over any handle to a [`Tokenizer`] (`&Tokenizer`,
/// `Arc<Tokenizer>`, ...).
pub struct StreamDetokenizer<T: Deref<Target = Tokenizer>> {
    tok: T,
    skip_special: bool,
    /// Byte mode: bytes of an unfinished UTF-8 character.
    pending: Vec<u8>,
    /// Window mode: ids from `prefix_offset` on; `read` = ids already emitted.
    window: Vec<u32>,
    read: usize,
    tokens: usize,
}

impl<T: Deref<Target = Tokenizer>> StreamDetokenizer<T> {
    /// Special tokens are emitted as their text.
    pub fn new(tok: T) -> Self {
        Self::with_skip_special(tok, false)
    }

    /// `skip_special`: special tokens produce no text (as
    /// `decode_opts(ids, true)`).
    pub fn with_skip_special(tok: T, skip_special: bool) -> Self {
        StreamDetokenizer {
            tok,
            skip_special,
            pending: Vec::new(),
            window: Vec::new(),
            read: 0,
            tokens: 0,
        }
    }

    /// Number of ids pushed so far.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Add one id; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.tokens += 1;
        if let Some(table) = self.tok.byte_table() {
            let idx = id as usize;
            if let Some(b) = table.bytes.get(idx) {
                if !(self.skip_special && table.special[idx]) {
                    self.pending.extend_from_slice(b);
                }
            }
            let mut out = String::new();
            drain_utf8(&mut self.pending, &mut out);
            return out;
        }
        self.window.push(id);
        let prefix = self.tok.decode_opts(&self.window[..self.read], self.skip_special);
        let full = self.tok.decode_opts(&self.window, self.skip_special);
        if full.len() > prefix.len() && full.starts_with(&prefix) && !full.ends_with('\u{FFFD}') {
            let out = full[prefix.len()..].to_string();
            // Keep the last emitted id as context for the next step (decoders
            // such as Metaspace treat the first token specially).
            let keep_from = self.window.len() - 1;
            self.window.drain(..keep_from);
            self.read = self.window.len();
            out
        } else {
            String::new()
        }
    }

    /// Add several ids; returns the text that is now complete.
    pub fn push_all(&mut self, ids: &[u32]) -> String {
        ids.iter().map(|&i| self.push(i)).collect()
    }

    /// End of stream: whatever is held back (an unfinished character comes
    /// out as U+FFFD, as `decode` would render it).
    pub fn flush(&mut self) -> String {
        if self.tok.byte_table().is_some() {
            let out = String::from_utf8_lossy(&self.pending).into_owned();
            self.pending.clear();
            return out;
        }
        let prefix = self.tok.decode_opts(&self.window[..self.read], self.skip_special);
        let full = self.tok.decode_opts(&self.window, self.skip_special);
        let out = if full.starts_with(&prefix) {
            full[prefix.len()..].to_string()
        } else {
            String::new()
        };
        self.window.clear();
        self.read = 0;
        out
    }
}

/// Move every complete character of `pending` into `out`, rendering invalid
/// sequences as U+FFFD exactly as `String::from_utf8_lossy` does, and keep
/// only an unfinished trailing character.
fn drain_utf8(pending: &mut Vec<u8>, out: &mut String) {
    let mut start = 0;
    loop {
        match std::str::from_utf8(&pending[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = pending.len();
                break;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // SAFETY-free: re-validate the valid prefix.
                out.push_str(std::str::from_utf8(&pending[start..start + valid]).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        start += valid + n;
                    }
                    None => {
                        start += valid;
                        break;
                    }
                }
            }
        }
    }
    pending.drain(..start);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_matches_lossy() {
        // Deterministic pseudo-random byte streams, fed in random-sized pieces.
        let mut s = 0x2545F4914F6CDD1Du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let alphabet: Vec<u8> = "aé€😀".bytes().chain([0x80, 0xbf, 0xc0, 0xe2, 0xf0, 0xf4, 0xff, 0xed, 0xa0]).collect();
        for _ in 0..3000 {
            let len = (next() % 24) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect();
            let mut pending = vec![];
            let mut out = String::new();
            let mut i = 0;
            while i < bytes.len() {
                let k = 1 + (next() % 4) as usize;
                let end = (i + k).min(bytes.len());
                pending.extend_from_slice(&bytes[i..end]);
                drain_utf8(&mut pending, &mut out);
                assert!(pending.len() <= 3, "held back {:?}", pending);
                i = end;
            }
            out.push_str(&String::from_utf8_lossy(&pending));
            assert_eq!(out, String::from_utf8_lossy(&bytes), "{bytes:02x?}");
        }
    }
}
