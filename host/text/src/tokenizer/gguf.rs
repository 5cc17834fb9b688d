//! Building the tokenizer from GGUF metadata, as llama.cpp does: byte-level
//! BPE (`tokenizer.ggml.model = gpt2`, the pre-tokenizer named by
//! `tokenizer.ggml.pre`) or SentencePiece BPE (`tokenizer.ggml.model = llama`).

use super::{
    is_byte_level_spelled, max_id_plus_one, spell_byte_level, Facts, Tokenizer,
    END_OF_GENERATION_TOKENS,
};
use crate::gguf::GgufMeta;
use anyhow::{anyhow, bail, Context, Result};
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// GPT-2's split regex (the byte-level default; `\s+` last as in HF).
pub const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// llama 3's split regex.
pub const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split regex.
pub const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

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

impl Tokenizer {
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
        let facts = Facts {
            inner,
            bos_id,
            eos_ids: eos,
            pad_id,
            unk_id,
            add_bos,
            add_eos,
            chat_template,
            model_max_length,
        };
        Ok(Tokenizer::assemble(facts, Some(tokens)))
    }
}
