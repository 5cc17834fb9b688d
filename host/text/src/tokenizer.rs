//! The tokenizer: the `tokenizers` crate, built from a tokenizer.json (Hugging
//! Face directories) or from GGUF metadata (byte-level BPE, `tokenizer.ggml.model
//! = gpt2`, with the pre-tokenizer `tokenizer.ggml.pre` names, as llama.cpp does).

use crate::gguf::GgufMeta;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::OnceLock;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

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

/// GPT-2's split regex (the byte-level default; `\s+` last as in HF).
pub const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// llama 3's split regex.
pub const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split regex.
pub const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A text tokenizer with the special-token facts a generator needs.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_ids: Vec<u32>,
    pad_id: Option<u32>,
    unk_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
    model_max_length: Option<u64>,
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

/// The BPE model of `builder`, with `unk` as its unknown token.
fn build_bpe(builder: tokenizers::models::bpe::BpeBuilder, unk: Option<String>) -> Result<BPE> {
    let builder = match unk {
        Some(u) => builder.unk_token(u),
        None => builder,
    };
    builder
        .build()
        .map_err(|e| anyhow!("cannot build the BPE model: {e}"))
}

fn tk_err(e: tokenizers::Error) -> anyhow::Error {
    anyhow!("{e}")
}

/// The pre-tokenizer llama.cpp applies for a `tokenizer.ggml.pre` name.
fn pre_tokenizer_for(pre: &str) -> Result<PreTokenizerWrapper> {
    let byte_level = |regex| PreTokenizerWrapper::from(ByteLevel::new(false, true, regex));
    let split = |re: &str| -> Result<PreTokenizerWrapper> {
        Ok(Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(tk_err)?
        .into())
    };
    Ok(match pre {
        // llama.cpp: "\p{N}" split first (each digit alone), then GPT-2's
        // regex. HF's own tokenizer.json for these models: Digits(individual)
        // + ByteLevel(use_regex).
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            Sequence::new(vec![Digits::new(true).into(), byte_level(true)]).into()
        }
        // GPT-2's regex only.
        "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => {
            byte_level(true)
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "dbrx"
        | "smaug-bpe" | "lfm2" | "midm-2.0" => {
            Sequence::new(vec![split(LLAMA3_SPLIT)?, byte_level(false)]).into()
        }
        "qwen2" | "deepseek-r1-qwen" | "megrez" | "kormo" => {
            Sequence::new(vec![split(QWEN2_SPLIT)?, byte_level(false)]).into()
        }
        other => bail!(
            "unsupported pre-tokenizer 'tokenizer.ggml.pre' = '{other}' (supported: smollm, starcoder, refact, gpt2, default, mpt, olmo, llama3/llama-bpe, dbrx, smaug-bpe, qwen2)"
        ),
    })
}

/// llama.cpp's byte-level BPE (`tokenizer.ggml.model = gpt2`): the vocabulary
/// in GPT-2's byte alphabet, the file's merges, the `pre` pre-tokenizer.
fn byte_level_tokenizer(
    meta: &GgufMeta,
    tokens: &[String],
    unk_id: Option<u32>,
    pre: &str,
) -> Result<tokenizers::Tokenizer> {
    let n = tokens.len();
    let merges_raw = meta.get_str_array("tokenizer.ggml.merges")?;
    // The model vocabulary, in the byte alphabet (respell the rare token
    // that a converter wrote as plain text, as transformers does).
    let mut vocab: tokenizers::models::bpe::Vocab = Default::default();
    let mut spelled = Vec::with_capacity(n);
    for (i, t) in tokens.iter().enumerate() {
        let s = if is_byte_level_spelled(t) {
            t.clone()
        } else {
            spell_byte_level(t)
        };
        vocab.entry(s.clone()).or_insert(i as u32);
        spelled.push(s);
    }
    let mut merges = Vec::with_capacity(merges_raw.len());
    for (i, m) in merges_raw.iter().enumerate() {
        let (a, b) = m
            .split_once(' ')
            .ok_or_else(|| anyhow!("merge {i} '{m}' in 'tokenizer.ggml.merges' has no space"))?;
        merges.push((a.to_string(), b.to_string()));
    }
    let unk = unk_id.map(|u| spelled[u as usize].clone());
    let bpe = build_bpe(BPE::builder().vocab_and_merges(vocab, merges), unk)?;

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre_tokenizer_for(pre)?));
    inner.with_decoder(Some(ByteLevelDecoder::new(false, true, true)));
    Ok(inner)
}

/// llama.cpp's SentencePiece BPE (`tokenizer.ggml.model = llama`, Gemma's):
/// spaces become U+2581 (with a leading one only where
/// `tokenizer.ggml.add_space_prefix` says), no pre-tokenizer, pieces merged
/// best score first, bytes outside the vocabulary as `<0xXX>` tokens. The
/// file has scores, not merges: a merge (a, b) exists where a, b and a + b
/// are all pieces, ranked by the score of a + b (as llama.cpp's tokenizer
/// picks the best-scoring bigram, and as transformers converts such models).
fn spm_tokenizer(
    meta: &GgufMeta,
    tokens: &[String],
    types: &[i32],
    unk_id: Option<u32>,
) -> Result<tokenizers::Tokenizer> {
    use tokenizers::decoders::byte_fallback::ByteFallback;
    use tokenizers::decoders::fuse::Fuse;
    use tokenizers::decoders::sequence::Sequence as DecoderSequence;
    use tokenizers::normalizers::{Prepend, Replace};
    use tokenizers::NormalizerWrapper;
    let n = tokens.len();
    let scores = meta.get_f32_array("tokenizer.ggml.scores")?;
    if scores.len() != n {
        bail!(
            "'tokenizer.ggml.scores' has {} entries but there are {n} tokens",
            scores.len()
        );
    }
    let space_prefix = if meta.contains("tokenizer.ggml.add_space_prefix") {
        meta.get_bool("tokenizer.ggml.add_space_prefix")?
    } else {
        true
    };
    let mut vocab: tokenizers::models::bpe::Vocab = Default::default();
    for (i, t) in tokens.iter().enumerate() {
        vocab.entry(t.clone()).or_insert(i as u32);
    }
    // Only normal pieces merge (control, user-defined and byte tokens are
    // matched whole or are the byte fallback).
    let mergeable = |id: u32| matches!(types[id as usize], token_type::NORMAL);
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if !mergeable(i as u32) {
            continue;
        }
        for (at, _) in t.char_indices().skip(1) {
            let (a, b) = t.split_at(at);
            if let (Some(&ia), Some(&ib)) = (vocab.get(a), vocab.get(b)) {
                ranked.push((scores[i], i as u32, ia, ib));
            }
        }
    }
    // Best score first; ties by the merged piece's id, then by the pieces'.
    ranked.sort_by(|x, y| {
        y.0.total_cmp(&x.0)
            .then(x.1.cmp(&y.1))
            .then(x.2.cmp(&y.2))
            .then(x.3.cmp(&y.3))
    });
    let merges = ranked
        .iter()
        .map(|&(_, _, a, b)| (tokens[a as usize].clone(), tokens[b as usize].clone()))
        .collect();
    let builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    let bpe = build_bpe(builder, unk_id.map(|u| tokens[u as usize].clone()))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let replace = Replace::new(" ", "\u{2581}").map_err(|e| anyhow!("normalizer: {e}"))?;
    let normalizer: NormalizerWrapper = if space_prefix {
        tokenizers::normalizers::Sequence::new(vec![
            Prepend::new("\u{2581}".into()).into(),
            replace.into(),
        ])
        .into()
    } else {
        replace.into()
    };
    inner.with_normalizer(Some(normalizer));
    let decoder = DecoderSequence::new(vec![
        tokenizers::decoders::DecoderWrapper::Replace(
            tokenizers::normalizers::Replace::new("\u{2581}", " ")
                .map_err(|e| anyhow!("decoder: {e}"))?,
        ),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ]);
    inner.with_decoder(Some(decoder));
    Ok(inner)
}

fn json_token_str(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}

fn json_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => vec![],
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let s =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let v =
        serde_json::from_str(&s).with_context(|| format!("invalid JSON in {}", path.display()))?;
    Ok(Some(v))
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

    /// Build from the tokenizer in a GGUF file's metadata.
    pub fn from_gguf_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let meta = GgufMeta::open(path)?;
        Self::from_gguf(&meta)
    }

    /// Build from already-read GGUF metadata.
    pub fn from_gguf(meta: &GgufMeta) -> Result<Tokenizer> {
        let ctx = || format!("tokenizer of GGUF file {}", meta.path.display());
        Self::from_gguf_inner(meta).with_context(ctx)
    }

    fn from_gguf_inner(meta: &GgufMeta) -> Result<Tokenizer> {
        let model = meta.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" && model != "llama" {
            bail!(
                "unsupported tokenizer model 'tokenizer.ggml.model' = '{model}' (supported: gpt2 byte-level BPE, llama SentencePiece BPE)"
            );
        }
        let pre = if meta.contains("tokenizer.ggml.pre") {
            meta.get_str("tokenizer.ggml.pre")?
        } else {
            "default"
        };
        let tokens = meta.get_str_array("tokenizer.ggml.tokens")?;
        let n = tokens.len();
        if n == 0 {
            bail!("'tokenizer.ggml.tokens' is empty");
        }
        let types = if meta.contains("tokenizer.ggml.token_type") {
            let t = meta.get_i32_array("tokenizer.ggml.token_type")?;
            if t.len() != n {
                bail!(
                    "'tokenizer.ggml.token_type' has {} entries but there are {} tokens",
                    t.len(),
                    n
                );
            }
            t
        } else {
            vec![token_type::NORMAL; n]
        };

        let opt_id = |key: &str| -> Result<Option<u32>> {
            if !meta.contains(key) {
                return Ok(None);
            }
            // Some converters write -1 for "none".
            let v = meta.get_i64(key)?;
            if v < 0 {
                return Ok(None);
            }
            let id = u32::try_from(v)
                .ok()
                .filter(|&i| (i as usize) < n)
                .ok_or_else(|| {
                    anyhow!("'{key}' = {v} is out of range for a vocabulary of {n} tokens")
                })?;
            Ok(Some(id))
        };
        let bos_id = opt_id("tokenizer.ggml.bos_token_id")?;
        let eos_id = opt_id("tokenizer.ggml.eos_token_id")?;
        let eot_id = opt_id("tokenizer.ggml.eot_token_id")?;
        let eom_id = opt_id("tokenizer.ggml.eom_token_id")?;
        let unk_id = opt_id("tokenizer.ggml.unknown_token_id")?;
        let pad_id = opt_id("tokenizer.ggml.padding_token_id")?;
        let flag = |key: &str, default: bool| -> Result<bool> {
            if meta.contains(key) {
                meta.get_bool(key)
            } else {
                Ok(default)
            }
        };
        let add_bos = flag("tokenizer.ggml.add_bos_token", false)?;
        let add_eos = flag("tokenizer.ggml.add_eos_token", false)?;

        let mut inner = if model == "llama" {
            spm_tokenizer(meta, tokens, &types, unk_id)?
        } else {
            byte_level_tokenizer(meta, tokens, unk_id, pre)?
        };

        // Control tokens are special added tokens; user-defined ones are added
        // tokens matched whole in the text (as llama.cpp does).
        let mut specials = vec![];
        let mut users = vec![];
        for (i, (t, &ty)) in tokens.iter().zip(&types).enumerate() {
            let is_eog_name = END_OF_GENERATION_TOKENS.contains(&t.as_str());
            let marked_special = Some(i as u32) == bos_id
                || Some(i as u32) == eos_id
                || Some(i as u32) == eot_id
                || Some(i as u32) == eom_id;
            if ty == token_type::CONTROL || (marked_special && is_eog_name) {
                specials.push(AddedToken::from(t.clone(), true).normalized(false));
            } else if ty == token_type::USER_DEFINED {
                users.push(AddedToken::from(t.clone(), false).normalized(false));
            }
        }
        inner.add_special_tokens(&specials);
        inner.add_tokens(&users);
        let built = max_id_plus_one(&inner);
        if built != n {
            bail!(
                "building the tokenizer changed the vocabulary size from {n} to {built} (misspelled added tokens)"
            );
        }
        let mut single = String::from("$A");
        let mut special_tokens = vec![];
        if add_bos {
            let b = bos_id.ok_or_else(|| {
                anyhow!("'tokenizer.ggml.add_bos_token' is set but there is no bos_token_id")
            })?;
            single = format!("{} {single}", tokens[b as usize]);
            special_tokens.push((tokens[b as usize].clone(), b));
        }
        if add_eos {
            let e = eos_id.ok_or_else(|| {
                anyhow!("'tokenizer.ggml.add_eos_token' is set but there is no eos_token_id")
            })?;
            single = format!("{single} {}", tokens[e as usize]);
            special_tokens.push((tokens[e as usize].clone(), e));
        }
        if add_bos || add_eos {
            let tp = TemplateProcessing::builder()
                .try_single(single)
                .map_err(|e| anyhow!("post-processor template: {e}"))?
                .special_tokens(special_tokens)
                .build()
                .map_err(|e| anyhow!("post-processor: {e}"))?;
            inner.with_post_processor(Some(tp));
        } else {
            inner.with_post_processor(Some(ByteLevel::new(false, false, false)));
        }

        let eos: Vec<u32> = [eos_id, eot_id, eom_id].into_iter().flatten().collect();
        let chat_template = if meta.contains("tokenizer.chat_template") {
            Some(meta.get_str("tokenizer.chat_template")?.to_string())
        } else {
            None
        };
        let ctx_key = format!("{}.context_length", meta.architecture().unwrap_or("llama"));
        let model_max_length = meta.get_u64(&ctx_key).ok();
        Ok(Tokenizer {
            inner,
            bos_id,
            eos_ids: eos,
            pad_id,
            unk_id,
            add_bos,
            add_eos,
            chat_template,
            model_max_length,
            vocab_size: 0,
            byte_table: None,
        }
        .finish(Some(tokens)))
    }

    /// Completes a tokenizer whose source facts are set: the end-of-generation
    /// ids llama.cpp's rule adds, the vocabulary size and the byte table.
    /// `id_tokens`: the source's own token list, where it has one.
    fn finish(mut self, id_tokens: Option<&[String]>) -> Tokenizer {
        let inner = &self.inner;
        // Every special token named like an end-of-turn/end-of-text marker
        // also ends generation (llama.cpp's rule).
        let added = inner.get_added_tokens_decoder();
        let extra: BTreeSet<u32> = added
            .iter()
            .filter(|(_, tok)| {
                tok.special && END_OF_GENERATION_TOKENS.contains(&tok.content.as_str())
            })
            .map(|(id, _)| *id)
            .collect();
        push_new(&mut self.eos_ids, extra);
        let mut seen = BTreeSet::new();
        self.eos_ids.retain(|id| seen.insert(*id));

        let vocab_size = max_id_plus_one(inner);
        self.byte_table = match inner.get_decoder() {
            Some(DecoderWrapper::ByteLevel(_)) => {
                let mut bytes = Vec::with_capacity(vocab_size);
                let mut special = Vec::with_capacity(vocab_size);
                for id in 0..vocab_size as u32 {
                    // The source's own token list where we have it (a GGUF
                    // vocabulary may spell two ids the same).
                    let text = match id_tokens {
                        Some(t) => t.get(id as usize).cloned(),
                        None => inner.id_to_token(id),
                    };
                    special.push(text.is_some() && added.get(&id).is_some_and(|a| a.special));
                    bytes.push(text.map_or_else(Vec::new, |t| byte_level_bytes(&t)));
                }
                Some(ByteTable { bytes, special })
            }
            _ => None,
        };
        self.vocab_size = vocab_size;
        self
    }

    /// Load a tokenizer.json file alone (no config: no chat template, eos ids
    /// from the end-of-generation token names only).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| anyhow!("cannot load tokenizer {}: {e}", path.display()))?;
        Ok(Self::from_hf_parts(inner, None, None, None))
    }

    /// Load a Hugging Face model directory: tokenizer.json, and where present
    /// tokenizer_config.json (bos/eos/pad/unk tokens, chat_template,
    /// add_bos_token), chat_template.jinja, config.json and
    /// generation_config.json (eos_token_id, int or list).
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        let dir = dir.as_ref();
        let tj = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&tj)
            .map_err(|e| anyhow!("cannot load tokenizer {}: {e}", tj.display()))?;
        let cfg = read_json(&dir.join("tokenizer_config.json"))?;
        let mut eos_extra = vec![];
        for f in ["generation_config.json", "config.json"] {
            if let Some(v) = read_json(&dir.join(f))? {
                push_new(&mut eos_extra, json_ids(v.get("eos_token_id")));
            }
        }
        let jinja = dir.join("chat_template.jinja");
        let template_file = if jinja.exists() {
            Some(
                std::fs::read_to_string(&jinja)
                    .with_context(|| format!("cannot read {}", jinja.display()))?,
            )
        } else {
            None
        };
        let mut t = Self::from_hf_parts(inner, cfg.as_ref(), Some(eos_extra), template_file);
        if t.chat_template.is_none() {
            if let Some(v) = read_json(&dir.join("chat_template.json"))? {
                t.chat_template = v
                    .get("chat_template")
                    .and_then(|c| c.as_str())
                    .map(String::from);
            }
        }
        Ok(t)
    }

    fn from_hf_parts(
        inner: tokenizers::Tokenizer,
        cfg: Option<&Value>,
        eos_extra: Option<Vec<u32>>,
        template_file: Option<String>,
    ) -> Tokenizer {
        let tok_id = |key: &str| -> Option<u32> {
            cfg.and_then(|c| c.get(key))
                .and_then(json_token_str)
                .and_then(|s| inner.token_to_id(&s))
        };
        let bos_id = tok_id("bos_token");
        let mut eos: Vec<u32> = tok_id("eos_token").into_iter().collect();
        push_new(&mut eos, eos_extra.unwrap_or_default());
        let pad_id = tok_id("pad_token");
        let unk_id = tok_id("unk_token");
        let chat_template = template_file.or_else(|| {
            match cfg.and_then(|c| c.get("chat_template")) {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: take "default" (or the first).
                Some(Value::Array(a)) => a
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .or_else(|| a.first())
                    .and_then(|t| t.get("template"))
                    .and_then(|t| t.as_str())
                    .map(String::from),
                _ => None,
            }
        });
        let model_max_length = cfg
            .and_then(|c| c.get("model_max_length"))
            .and_then(|v| v.as_u64());
        // Whether the post-processor adds BOS/EOS is a fact of tokenizer.json.
        let probe = |add: bool| {
            inner
                .encode("a", add)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        };
        let (with, without) = (probe(true), probe(false));
        let add_bos = bos_id.is_some()
            && with.first() == bos_id.as_ref()
            && without.first() != bos_id.as_ref();
        let add_eos = with.len() > without.len() && with.last().is_some_and(|l| eos.contains(l));
        Tokenizer {
            inner,
            bos_id,
            eos_ids: eos,
            pad_id,
            unk_id,
            add_bos,
            add_eos,
            chat_template,
            model_max_length,
            vocab_size: 0,
            byte_table: None,
        }
        .finish(None)
    }

    /// Encode text. Special tokens written in the text (e.g. `<|im_start|>`)
    /// always encode as their single ids; `add_special` adds what the model
    /// adds around a sequence (BOS for models that want it).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
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
        if self.add_bos && !starts_with_bos {
            if let Some(b) = self.bos_id {
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
        self.inner.decode(ids, skip_special).unwrap_or_default()
    }

    /// Number of token ids: the largest id (model vocabulary or added
    /// token) + 1.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Ids that end generation (the model's eos first).
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.contains(&id)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Whether the model wants BOS prepended to a prompt.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk_id
    }

    pub fn bos_token(&self) -> Option<String> {
        self.bos_id.and_then(|i| self.id_to_token(i))
    }

    /// The text of the primary eos token.
    pub fn eos_token(&self) -> Option<String> {
        self.eos_ids.first().and_then(|&i| self.id_to_token(i))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token as stored in the vocabulary (byte-level spelling, e.g. `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        match &self.byte_table {
            Some(t) => t.special.get(id as usize).copied().unwrap_or(false),
            None => self
                .inner
                .get_added_tokens_decoder()
                .get(&id)
                .is_some_and(|a| a.special),
        }
    }

    /// The chat template (Jinja) the model carries, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    pub fn set_chat_template(&mut self, template: Option<String>) {
        self.chat_template = template;
    }

    /// The model's context length where the source says.
    pub fn model_max_length(&self) -> Option<u64> {
        self.model_max_length
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    pub(crate) fn byte_table(&self) -> Option<&ByteTable> {
        self.byte_table.as_ref()
    }

    /// tokenizer.json contents (pretty-printed) that `tokenizers`,
    /// transformers and mlx-lm load.
    pub fn to_tokenizer_json(&self) -> Result<String> {
        self.inner
            .to_string(true)
            .map_err(|e| anyhow!("serializing tokenizer.json: {e}"))
    }

    /// tokenizer_config.json contents for a Hugging Face directory.
    pub fn to_tokenizer_config_json(&self) -> Result<String> {
        let mut cfg = Map::new();
        let mut added = Map::new();
        let mut decoder: Vec<(u32, AddedToken)> =
            self.inner.get_added_tokens_decoder().into_iter().collect();
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
        cfg.insert("add_bos_token".into(), json!(self.add_bos));
        cfg.insert("add_eos_token".into(), json!(self.add_eos));
        cfg.insert("add_prefix_space".into(), json!(false));
        cfg.insert("added_tokens_decoder".into(), Value::Object(added));
        cfg.insert(
            "additional_special_tokens".into(),
            Value::Array(extra_specials),
        );
        cfg.insert("bos_token".into(), tok(self.bos_id));
        cfg.insert("eos_token".into(), tok(self.eos_ids.first().copied()));
        cfg.insert("pad_token".into(), tok(self.pad_id));
        cfg.insert("unk_token".into(), tok(self.unk_id));
        if let Some(t) = &self.chat_template {
            cfg.insert("chat_template".into(), json!(t));
        }
        cfg.insert("clean_up_tokenization_spaces".into(), json!(false));
        if let Some(m) = self.model_max_length {
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
            ("bos_token", self.bos_id),
            ("eos_token", self.eos_ids.first().copied()),
            ("pad_token", self.pad_id),
            ("unk_token", self.unk_id),
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
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .field("add_bos", &self.add_bos)
            .field("has_chat_template", &self.chat_template.is_some())
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
