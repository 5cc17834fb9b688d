//! The tokenizer: the `tokenizers` crate, built from a tokenizer.json (Hugging
//! Face directories) or from GGUF metadata (byte-level BPE, `tokenizer.ggml.model
//! = gpt2`, with the pre-tokenizer `tokenizer.ggml.pre` names, as llama.cpp does).
//!
//! - `gguf`: building it from GGUF metadata (llama.cpp's byte-level BPE and
//!   SentencePiece BPE vocabularies);
//! - `hf`: loading it from Hugging Face files (tokenizer.json,
//!   tokenizer_config.json and the rest of a model directory).

mod gguf;
mod hf;

pub use gguf::{token_type, GPT2_SPLIT, LLAMA3_SPLIT, QWEN2_SPLIT};

use anyhow::{anyhow, Context, Result};
use serde_json::{json, Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::OnceLock;
use tokenizers::{AddedToken, DecoderWrapper};

/// Token texts that end generation when they are special tokens of the model
/// (the list llama.cpp uses to find end-of-generation tokens).
pub const END_OF_GENERATION_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// A text tokenizer with the special-token facts a generator needs.
#[derive(Clone)]
pub struct Tokenizer {
    /// What its source (GGUF metadata, Hugging Face files) says.
    facts: Facts,
    /// Largest id + 1 (cached: `tokenizers` recounts its vocabulary each call).
    vocab_size: usize,
    /// For byte-level decoders: each id's bytes (empty for unknown ids), and
    /// whether it is a special token. Lets the stream detokenizer work on bytes.
    byte_table: Option<ByteTable>,
}

#[derive(Clone)]
pub(crate) struct ByteTable {
    pub bytes: Vec<Vec<u8>>,
    pub special: Vec<bool>,
}

/// What a source (GGUF metadata, Hugging Face files) says about its
/// tokenizer; [`Tokenizer::assemble`] derives the rest.
#[derive(Clone)]
struct Facts {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    pad_id: Option<u32>,
    unk_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
    model_max_length: Option<u64>,
}

/// GPT-2's reversible byte <-> printable char mapping.
pub fn bytes_to_unicode() -> &'static [char; 256] {
    static MAP: OnceLock<[char; 256]> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = ['\0'; 256];
        let mut n = 0u32;
        for b in 0..256u32 {
            let printable = (b'!' as u32..=b'~' as u32).contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            map[b as usize] = if printable {
                char::from_u32(b).unwrap()
            } else {
                let c = char::from_u32(256 + n).unwrap();
                n += 1;
                c
            };
        }
        map
    })
}

fn unicode_to_bytes() -> &'static HashMap<char, u8> {
    static MAP: OnceLock<HashMap<char, u8>> = OnceLock::new();
    MAP.get_or_init(|| {
        bytes_to_unicode()
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect()
    })
}

/// Bytes of a byte-level token as the ByteLevel decoder produces them: each
/// char mapped back to its byte, or the raw UTF-8 if any char is not in the
/// byte alphabet (e.g. an added token such as `<think>` spelled plainly).
fn byte_level_bytes(token: &str) -> Vec<u8> {
    let map = unicode_to_bytes();
    token
        .chars()
        .map(|c| map.get(&c).copied())
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

fn is_byte_level_spelled(token: &str) -> bool {
    let map = unicode_to_bytes();
    token.chars().all(|c| map.contains_key(&c))
}

fn spell_byte_level(token: &str) -> String {
    let m = bytes_to_unicode();
    token.bytes().map(|b| m[b as usize]).collect()
}

fn max_id_plus_one(t: &tokenizers::Tokenizer) -> usize {
    let model = t.get_vocab(false).into_values().max();
    let added = t.get_added_tokens_decoder().into_keys().max();
    model.max(added).map_or(0, |m| m as usize + 1)
}

/// Appends the ids of `more` that `ids` does not hold yet, in order.
fn push_new(ids: &mut Vec<u32>, more: impl IntoIterator<Item = u32>) {
    for id in more {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
}

impl Tokenizer {
    /// Load from a path: a `.gguf` file (or any file starting with the GGUF
    /// magic), a tokenizer.json file, or a Hugging Face model directory.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        if path.is_dir() {
            return Self::from_hf_dir(path);
        }
        let mut magic = [0u8; 4];
        let is_gguf = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .map(|_| magic == crate::gguf::GGUF_MAGIC)
            .unwrap_or(false);
        if is_gguf || path.extension().is_some_and(|e| e == "gguf") {
            Self::from_gguf_file(path)
        } else {
            Self::from_file(path)
        }
    }

    /// Builds a tokenizer from what its source says, completing it with the
    /// end-of-generation ids llama.cpp's rule adds, the vocabulary size and
    /// the byte table. `id_tokens`: the source's own token list, where it has
    /// one.
    fn assemble(mut facts: Facts, id_tokens: Option<&[String]>) -> Tokenizer {
        // Every special token named like an end-of-turn/end-of-text marker
        // also ends generation (llama.cpp's rule).
        let added = facts.inner.get_added_tokens_decoder();
        let extra: BTreeSet<u32> = added
            .iter()
            .filter(|(_, tok)| {
                tok.special && END_OF_GENERATION_TOKENS.contains(&tok.content.as_str())
            })
            .map(|(id, _)| *id)
            .collect();
        push_new(&mut facts.eos_ids, extra);
        let mut seen = BTreeSet::new();
        facts.eos_ids.retain(|id| seen.insert(*id));

        let vocab_size = max_id_plus_one(&facts.inner);
        let byte_table = match facts.inner.get_decoder() {
            Some(DecoderWrapper::ByteLevel(_)) => {
                let mut bytes = Vec::with_capacity(vocab_size);
                let mut special = Vec::with_capacity(vocab_size);
                for id in 0..vocab_size as u32 {
                    // The source's own token list where we have it (a GGUF
                    // vocabulary may spell two ids the same).
                    let text = match id_tokens {
                        Some(t) => t.get(id as usize).cloned(),
                        None => facts.inner.id_to_token(id),
                    };
                    special.push(text.is_some() && added.get(&id).is_some_and(|a| a.special));
                    bytes.push(text.map_or_else(Vec::new, |t| byte_level_bytes(&t)));
                }
                Some(ByteTable { bytes, special })
            }
            _ => None,
        };
        Tokenizer {
            facts,
            vocab_size,
            byte_table,
        }
    }

    /// Encode text. Special tokens written in the text (e.g. `<|im_start|>`)
    /// always encode as their single ids; `add_special` adds what the model
    /// adds around a sequence (BOS for models that want it).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .facts
            .inner
            .encode_fast(text, add_special)
            .map_err(|e| anyhow!("tokenizer: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Encode a rendered prompt: adds BOS where the model wants it, unless
    /// the text already starts with the BOS token (chat templates often
    /// write it themselves).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let starts_with_bos = self
            .bos_token()
            .is_some_and(|b| !b.is_empty() && text.starts_with(&b));
        let mut ids = self.encode(text, false)?;
        if self.facts.add_bos && !starts_with_bos {
            if let Some(b) = self.facts.bos_id {
                ids.insert(0, b);
            }
        }
        Ok(ids)
    }

    /// Decode ids to text, special tokens included as their text.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_opts(ids, false)
    }

    /// One token's bytes as it decodes (for logprobs: a token may hold part
    /// of a UTF-8 character).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let mut out = Vec::new();
        self.push_token_bytes(id, &mut out);
        out
    }

    /// [`Tokenizer::token_bytes`] appended to `out`, without a buffer of
    /// its own where the tokenizer has a byte table (a per-token path).
    pub fn push_token_bytes(&self, id: u32, out: &mut Vec<u8>) {
        match &self.byte_table {
            Some(t) => out.extend_from_slice(t.bytes.get(id as usize).map_or(&[][..], |b| b)),
            None => out.extend(self.decode(&[id]).into_bytes()),
        }
    }

    /// Decode ids to text, optionally dropping special tokens.
    pub fn decode_opts(&self, ids: &[u32], skip_special: bool) -> String {
        if let Some(t) = &self.byte_table {
            let mut bytes = Vec::new();
            for &id in ids {
                if let Some(b) = t.bytes.get(id as usize) {
                    if !(skip_special && t.special[id as usize]) {
                        bytes.extend_from_slice(b);
                    }
                }
            }
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        self.facts
            .inner
            .decode(ids, skip_special)
            .unwrap_or_default()
    }

    /// Number of token ids: the largest id (model vocabulary or added
    /// token) + 1.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Ids that end generation (the model's eos first).
    pub fn eos_ids(&self) -> Vec<u32> {
        self.facts.eos_ids.clone()
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.facts.eos_ids.contains(&id)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.facts.bos_id
    }

    /// Whether the model wants BOS prepended to a prompt.
    pub fn add_bos(&self) -> bool {
        self.facts.add_bos
    }

    pub fn add_eos(&self) -> bool {
        self.facts.add_eos
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.facts.pad_id
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.facts.unk_id
    }

    pub fn bos_token(&self) -> Option<String> {
        self.facts.bos_id.and_then(|i| self.id_to_token(i))
    }

    /// The text of the primary eos token.
    pub fn eos_token(&self) -> Option<String> {
        self.facts
            .eos_ids
            .first()
            .and_then(|&i| self.id_to_token(i))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.facts.inner.token_to_id(token)
    }

    /// The token as stored in the vocabulary (byte-level spelling, e.g. `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.facts.inner.id_to_token(id)
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        match &self.byte_table {
            Some(t) => t.special.get(id as usize).copied().unwrap_or(false),
            None => self
                .facts
                .inner
                .get_added_tokens_decoder()
                .get(&id)
                .is_some_and(|a| a.special),
        }
    }

    /// The chat template (Jinja) the model carries, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.facts.chat_template.as_deref()
    }

    pub fn set_chat_template(&mut self, template: Option<String>) {
        self.facts.chat_template = template;
    }

    /// The model's context length where the source says.
    pub fn model_max_length(&self) -> Option<u64> {
        self.facts.model_max_length
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.facts.inner
    }

    pub(crate) fn byte_table(&self) -> Option<&ByteTable> {
        self.byte_table.as_ref()
    }

    /// tokenizer.json contents (pretty-printed) that `tokenizers`,
    /// transformers and mlx-lm load.
    pub fn to_tokenizer_json(&self) -> Result<String> {
        self.facts
            .inner
            .to_string(true)
            .map_err(|e| anyhow!("serializing tokenizer.json: {e}"))
    }

    /// tokenizer_config.json contents for a Hugging Face directory.
    pub fn to_tokenizer_config_json(&self) -> Result<String> {
        let mut cfg = Map::new();
        let mut added = Map::new();
        let mut decoder: Vec<(u32, AddedToken)> = self
            .facts
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .collect();
        decoder.sort_by_key(|(id, _)| *id);
        let mut extra_specials = vec![];
        for (id, t) in &decoder {
            added.insert(
                id.to_string(),
                json!({
                    "content": t.content,
                    "lstrip": t.lstrip,
                    "normalized": t.normalized,
                    "rstrip": t.rstrip,
                    "single_word": t.single_word,
                    "special": t.special,
                }),
            );
            if t.special {
                extra_specials.push(Value::String(t.content.clone()));
            }
        }
        let tok = |id: Option<u32>| {
            id.and_then(|i| self.id_to_token(i))
                .map(Value::String)
                .unwrap_or(Value::Null)
        };
        cfg.insert("add_bos_token".into(), json!(self.facts.add_bos));
        cfg.insert("add_eos_token".into(), json!(self.facts.add_eos));
        cfg.insert("add_prefix_space".into(), json!(false));
        cfg.insert("added_tokens_decoder".into(), Value::Object(added));
        cfg.insert(
            "additional_special_tokens".into(),
            Value::Array(extra_specials),
        );
        cfg.insert("bos_token".into(), tok(self.facts.bos_id));
        cfg.insert("eos_token".into(), tok(self.facts.eos_ids.first().copied()));
        cfg.insert("pad_token".into(), tok(self.facts.pad_id));
        cfg.insert("unk_token".into(), tok(self.facts.unk_id));
        if let Some(t) = &self.facts.chat_template {
            cfg.insert("chat_template".into(), json!(t));
        }
        cfg.insert("clean_up_tokenization_spaces".into(), json!(false));
        if let Some(m) = self.facts.model_max_length {
            cfg.insert("model_max_length".into(), json!(m));
        }
        cfg.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        serde_json::to_string_pretty(&Value::Object(cfg))
            .context("serializing tokenizer_config.json")
    }

    /// special_tokens_map.json contents.
    pub fn to_special_tokens_map_json(&self) -> Result<String> {
        let mut m = Map::new();
        for (k, id) in [
            ("bos_token", self.facts.bos_id),
            ("eos_token", self.facts.eos_ids.first().copied()),
            ("pad_token", self.facts.pad_id),
            ("unk_token", self.facts.unk_id),
        ] {
            if let Some(t) = id.and_then(|i| self.id_to_token(i)) {
                m.insert(k.into(), json!(t));
            }
        }
        serde_json::to_string_pretty(&Value::Object(m))
            .context("serializing special_tokens_map.json")
    }

    /// Write tokenizer.json, tokenizer_config.json (bos/eos tokens and the
    /// chat template) and special_tokens_map.json into `dir` (created if
    /// needed) — the tokenizer half of a Hugging Face model directory.
    pub fn write_hf_files(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, body) in [
            ("tokenizer.json", self.to_tokenizer_json()?),
            ("tokenizer_config.json", self.to_tokenizer_config_json()?),
            (
                "special_tokens_map.json",
                self.to_special_tokens_map_json()?,
            ),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, body).with_context(|| format!("cannot write {}", p.display()))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.facts.bos_id)
            .field("eos_ids", &self.facts.eos_ids)
            .field("add_bos", &self.facts.add_bos)
            .field("has_chat_template", &self.facts.chat_template.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokenizer_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
        check::<crate::chat::ChatTemplate>();
    }

    #[test]
    fn byte_map_is_a_bijection() {
        let m = bytes_to_unicode();
        let set: BTreeSet<char> = m.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(byte_level_bytes("Ġhi"), b" hi");
        assert_eq!(spell_byte_level(" hi\n"), "ĠhiĊ");
    }
}
