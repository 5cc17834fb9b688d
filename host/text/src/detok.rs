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
//! There the equality with `decode` holds for valid UTF-8; where byte-fallback
//! tokens spell invalid UTF-8, `ByteFallback` turns the whole run of byte
//! tokens into U+FFFD while the stream may already have emitted its valid
//! head.

use crate::tokenizer::Tokenizer;
use std::ops::Deref;

/// Incremental decoder over any handle to a [`Tokenizer`] (`&Tokenizer`,
/// `Arc<Tokenizer>`, ...).
pub struct StreamDetokenizer<T: Deref<Target = Tokenizer>> {
    tok: T,
    skip_special: bool,
    /// Byte mode: bytes of an unfinished UTF-8 character.
    pending: Vec<u8>,
    /// Window mode: the ids emitted last (context) followed by ids not yet
    /// emitted; `read` = how many are context.
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
        let prefix = self
            .tok
            .decode_opts(&self.window[..self.read], self.skip_special);
        let full = self.tok.decode_opts(&self.window, self.skip_special);
        if full.len() > prefix.len() && full.starts_with(&prefix) && !full.ends_with('\u{FFFD}') {
            let out = full[prefix.len()..].to_string();
            // Keep the ids just emitted as context for the next step (decoders
            // such as Metaspace/Strip treat the first token specially, and a
            // character may span several byte-fallback tokens).
            self.window.drain(..self.read);
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
        let prefix = self
            .tok
            .decode_opts(&self.window[..self.read], self.skip_special);
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
                out.push_str(
                    std::str::from_utf8(&pending[start..start + valid]).unwrap_or_default(),
                );
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
    fn drained_text_matches_lossy_decode() {
        // Deterministic pseudo-random byte streams, fed in random-sized pieces.
        let mut s = 0x2545F4914F6CDD1Du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let alphabet: Vec<u8> = "aé€😀"
            .bytes()
            .chain([0x80, 0xbf, 0xc0, 0xe2, 0xf0, 0xf4, 0xff, 0xed, 0xa0])
            .collect();
        for _ in 0..3000 {
            let len = (next() % 24) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
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

#[cfg(test)]
mod window_tests {
    use super::*;

    /// A tiny Llama/SentencePiece-style tokenizer: Metaspace + byte fallback
    /// decoders, so the detokenizer runs in window mode.
    fn spm_tokenizer() -> Tokenizer {
        let mut vocab = serde_json::Map::new();
        let mut id = 0u32;
        for t in ["<unk>", "<s>", "</s>"] {
            vocab.insert(t.into(), id.into());
            id += 1;
        }
        for b in 0..=255u8 {
            vocab.insert(format!("<0x{b:02X}>"), id.into());
            id += 1;
        }
        for t in ["▁", "▁a", "b", "▁hello", "é", "▁w", "orld"] {
            vocab.insert(t.into(), id.into());
            id += 1;
        }
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
            ]},
            "pre_tokenizer": null,
            "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}
            ]},
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                      "vocab": vocab, "merges": []}
        });
        let dir = std::env::temp_dir().join(format!("specd-text-spm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tokenizer.json");
        std::fs::write(&p, json.to_string()).unwrap();
        let t = Tokenizer::from_file(&p).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        t
    }

    #[test]
    fn window_mode_equals_decode() {
        let t = spm_tokenizer();
        assert!(t.byte_table().is_none());
        let n = t.vocab_size() as u64;
        let mut s = 0x853c49e6748fea9bu64;
        for round in 0..400 {
            let len = 1 + round % 10;
            // Normal tokens, and whole characters as byte-fallback runs
            // (ByteFallback renders a run containing invalid UTF-8 as U+FFFD
            // for every byte of the run; see the module docs).
            let mut ids: Vec<u32> = vec![];
            for _ in 0..len {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if s.is_multiple_of(3) {
                    let c = ['é', '€', '😀', 'x', '\n'][(s >> 8) as usize % 5];
                    let mut buf = [0u8; 4];
                    ids.extend(c.encode_utf8(&mut buf).bytes().map(|b| b as u32 + 3));
                } else {
                    ids.push(((s >> 8) % n) as u32);
                    if (3..259).contains(ids.last().unwrap()) {
                        // a lone byte token: keep it ASCII
                        *ids.last_mut().unwrap() = 3 + ((s >> 16) % 128) as u32;
                    }
                }
            }
            let mut d = StreamDetokenizer::new(&t);
            let mut out: String = ids.iter().map(|&i| d.push(i)).collect();
            out.push_str(&d.flush());
            assert_eq!(out, t.decode(&ids), "{ids:?}");
        }
        // "é" split over byte-fallback tokens comes out whole.
        let e = [0xC3u32 + 3, 0xA9 + 3];
        let mut d = StreamDetokenizer::new(&t);
        assert_eq!(d.push(e[0]), "");
        assert_eq!(d.push(e[1]), "é");
        assert_eq!(d.flush(), "");
    }
}
