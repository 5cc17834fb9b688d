//! specd-text against the default model's GGUF.
//!
//! The GGUF is the default model where `specd pull` puts it (fetched when
//! missing); these tests fail, never skip, when it cannot be had.
//! `SPECD_TOKENIZER_REF` may name an extra reference file ({text: ids}) made by
//! tests/py/tokenizer_reference.py; tests/data/tokenizer_ref.json is always
//! compared.

use specd_text::{ChatMessage, ChatTemplate, GgufFile, GgufMeta, StreamDetokenizer, Tokenizer};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

fn gguf_path() -> PathBuf {
    specd_store::default_model().expect("the default model (specd pull)")
}

fn meta() -> &'static GgufMeta {
    static M: OnceLock<GgufMeta> = OnceLock::new();
    M.get_or_init(|| GgufFile::open(gguf_path()).expect("open GGUF"))
}

fn tok() -> Arc<Tokenizer> {
    static T: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| Arc::new(Tokenizer::from_gguf(meta()).expect("tokenizer from GGUF")))
        .clone()
}

fn reference(path: &std::path::Path) -> BTreeMap<String, Vec<u32>> {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn builtin_reference() -> BTreeMap<String, Vec<u32>> {
    reference(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer_ref.json"))
}

fn samples() -> Vec<String> {
    let mut v: Vec<String> = builtin_reference().into_keys().collect();
    v.extend(
        [
            "🧑🏾‍🚀 in 🚀, 🏳️‍🌈",
            "mixed 中文 and English with 123 numbers 😀\n\t",
            "    indented code\n\n\n    more",
            "\u{feff}BOM and \u{10ffff} and \u{7f}\u{1}",
        ]
        .map(String::from),
    );
    v
}

#[test]
fn gguf_metadata_reads_the_default_models_fields() {
    let m = meta();
    assert_eq!(m.version, 3);
    assert_eq!(m.architecture().unwrap(), "llama");
    assert_eq!(m.get_u32("llama.block_count").unwrap(), 30);
    assert_eq!(m.get_u64("llama.context_length").unwrap(), 8192);
    assert_eq!(m.get_u32("llama.attention.head_count").unwrap(), 9);
    assert_eq!(m.get_u32("llama.attention.head_count_kv").unwrap(), 3);
    assert!((m.get_f32("llama.rope.freq_base").unwrap() - 100000.0).abs() < 1e-3);
    assert_eq!(m.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(m.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(
        m.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert_eq!(
        m.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );
    assert_eq!(
        m.get_str_array("tokenizer.ggml.merges").unwrap().len(),
        48900
    );
    assert!(m
        .get_str("tokenizer.chat_template")
        .unwrap()
        .contains("<|im_start|>"));
    assert_eq!(m.tensors.len(), 272);
    let emb = m.tensor("token_embd.weight").expect("token_embd.weight");
    assert_eq!(emb.shape, vec![576, 49152]);
    assert!(emb.n_bytes().is_some());
    assert_eq!(m.data_offset % m.alignment, 0);
    // Typed getters name the file and the key.
    let e = m.get_u32("general.architecture").unwrap_err().to_string();
    assert!(
        e.contains("general.architecture") && e.contains(".gguf"),
        "{e}"
    );
    let e = m.get_str("no.such.key").unwrap_err().to_string();
    assert!(e.contains("no.such.key") && e.contains(".gguf"), "{e}");
}

#[test]
fn gguf_truncated_and_corrupt_files_error_cleanly() {
    let m = meta();
    let full = std::fs::read(gguf_path()).unwrap();
    let head = &full[..m.data_offset as usize];
    // The metadata alone: the tensor data is missing.
    let e = GgufMeta::from_bytes(head, "head.gguf").unwrap_err();
    assert!(format!("{e:#}").contains("runs past the end"), "{e:#}");
    // Truncations throughout the header, metadata and tensor table.
    let step = (head.len() / 150).max(1);
    let mut cuts: Vec<usize> = (0..head.len()).step_by(step).collect();
    cuts.extend([0, 1, 3, 4, 7, 8, 23, 24, 25, head.len() - 1]);
    for n in cuts {
        let r = GgufMeta::from_bytes(&full[..n], "cut.gguf");
        let e = r.expect_err(&format!("truncated at {n} parsed"));
        assert!(format!("{e:#}").contains("cut.gguf"));
    }
    // A truncated file on disk: the error names it.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let p = dir.join("specd-text-truncated.gguf");
    std::fs::write(&p, &full[..5000]).unwrap();
    let e = format!("{:#}", GgufFile::open(&p).unwrap_err());
    assert!(
        e.contains("specd-text-truncated.gguf") && e.contains("truncated"),
        "{e}"
    );
    let p2 = dir.join("specd-text-not-gguf.gguf");
    std::fs::write(&p2, b"PK\x03\x04 this is a zip").unwrap();
    let e = format!("{:#}", GgufFile::open(&p2).unwrap_err());
    assert!(e.contains("not a GGUF file"), "{e}");
    let e = format!(
        "{:#}",
        GgufFile::open(dir.join("missing.gguf")).unwrap_err()
    );
    assert!(e.contains("missing.gguf"), "{e}");
    // Corrupt bytes in the metadata: errors or odd values, never a panic.
    let mut s = 0x243F6A8885A308D3u64;
    for _ in 0..60 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let mut c = head.to_vec();
        let i = (s as usize) % c.len().min(200_000);
        c[i] = (s >> 40) as u8;
        let _ = GgufMeta::from_bytes(&c, "fuzz.gguf");
    }
}

#[test]
fn special_tokens_encode_as_single_ids() {
    let t = tok();
    let toks = meta().get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(toks[0], "<|endoftext|>");
    assert_eq!(toks[1], "<|im_start|>");
    assert_eq!(toks[2], "<|im_end|>");
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.token_to_id("<|endoftext|>"), Some(0));
    assert_eq!(t.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(t.token_to_id("<|im_end|>"), Some(2));
    assert_eq!(t.id_to_token(2).as_deref(), Some("<|im_end|>"));
    assert_eq!(t.encode("<|im_start|>", false).unwrap(), vec![1]);
    assert_eq!(t.encode("<|im_end|>", true).unwrap(), vec![2]);
    assert_eq!(t.encode("<|endoftext|>", false).unwrap(), vec![0]);
    let ids = t.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(ids.iter().filter(|&&i| i <= 2).count(), 2);
    let mut eos = t.eos_ids();
    assert_eq!(eos[0], 2, "the GGUF's eos_token_id comes first");
    eos.sort();
    assert_eq!(eos, vec![0, 2]);
    assert!(t.is_eos(0) && t.is_eos(2) && !t.is_eos(1));
    assert_eq!(t.bos_id(), Some(1));
    assert!(!t.add_bos());
    assert_eq!(t.bos_token().as_deref(), Some("<|im_start|>"));
    assert_eq!(t.eos_token().as_deref(), Some("<|im_end|>"));
    assert!(t.is_special(0) && t.is_special(16) && !t.is_special(17));
    assert_eq!(t.model_max_length(), Some(8192));
    // encode(add_special) adds nothing for this model; encode_prompt neither.
    assert_eq!(
        t.encode("Hi", true).unwrap(),
        t.encode("Hi", false).unwrap()
    );
    assert_eq!(
        t.encode_prompt("Hi").unwrap(),
        t.encode("Hi", false).unwrap()
    );
    assert_eq!(t.decode(&[1, 2, 0]), "<|im_start|><|im_end|><|endoftext|>");
    assert_eq!(t.decode_opts(&[1, 2, 0], true), "");
}

#[test]
fn decode_inverts_encode() {
    let t = tok();
    for s in samples() {
        let ids = t.encode(&s, false).unwrap();
        assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size()));
        assert_eq!(t.decode(&ids), s, "ids {ids:?}");
        assert_eq!(t.decode(&ids), t.inner().decode(&ids, false).unwrap());
    }
    // Multi-digit numbers split into single digits (llama.cpp's smollm pre).
    let ids = t.encode("12345", false).unwrap();
    assert_eq!(ids.len(), 5, "{ids:?}");
}

#[test]
fn matches_reference_ids() {
    let t = tok();
    let mut refs = vec![(
        "tests/data/tokenizer_ref.json".to_string(),
        builtin_reference(),
    )];
    if let Ok(p) = std::env::var("SPECD_TOKENIZER_REF") {
        if !p.is_empty() {
            refs.push((p.clone(), reference(std::path::Path::new(&p))));
        }
    }
    for (name, r) in refs {
        assert!(r.len() >= 20, "{name}: too few reference strings");
        let mut bad = vec![];
        for (text, want) in &r {
            let got = t.encode(text, false).unwrap();
            if &got != want {
                bad.push(format!("{text:?}:\n  ours {got:?}\n  ref  {want:?}"));
            }
        }
        assert!(
            bad.is_empty(),
            "{name}: {} of {} differ:\n{}",
            bad.len(),
            r.len(),
            bad.join("\n")
        );
    }
}

#[test]
fn stream_detokenizer_equals_decode() {
    let t = tok();
    for s in samples() {
        let ids = t.encode(&s, false).unwrap();
        let mut d = StreamDetokenizer::new(t.clone());
        let mut out = String::new();
        for &id in &ids {
            let chunk = d.push(id);
            // Valid text never produces a replacement character mid-stream.
            assert!(!chunk.contains('\u{FFFD}'), "{s:?}: chunk {chunk:?}");
            out.push_str(&chunk);
        }
        out.push_str(&d.flush());
        assert_eq!(out, s);
        assert_eq!(d.tokens(), ids.len());
    }
    // A 4-byte emoji spread over byte tokens comes out whole, once.
    let ids = t.encode("😀", false).unwrap();
    assert!(ids.len() > 1, "{ids:?}");
    let mut d = StreamDetokenizer::new(&*t);
    let chunks: Vec<String> = ids.iter().map(|&i| d.push(i)).collect();
    assert_eq!(chunks.concat(), "😀");
    assert_eq!(chunks.iter().filter(|c| !c.is_empty()).count(), 1);
    // Arbitrary id sequences, including ones that are not valid UTF-8.
    let mut x = 0x9E3779B97F4A7C15u64;
    for round in 0..300 {
        let n = 1 + (round % 12);
        let ids: Vec<u32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Bias to the byte tokens (ids < 300) to split characters.
                if x.is_multiple_of(3) {
                    (x >> 20) as u32 % 49152
                } else {
                    (x >> 20) as u32 % 300
                }
            })
            .collect();
        for skip in [false, true] {
            let mut d = StreamDetokenizer::with_skip_special(t.clone(), skip);
            let mut out: String = ids.iter().map(|&i| d.push(i)).collect();
            out.push_str(&d.flush());
            assert_eq!(out, t.decode_opts(&ids, skip), "{ids:?}");
        }
        assert_eq!(
            t.decode(&ids),
            t.inner().decode(&ids, false).unwrap(),
            "{ids:?}"
        );
    }
}

#[test]
fn the_chatml_template_renders_like_transformers() {
    let t = tok();
    let ct = ChatTemplate::from_tokenizer(&t).unwrap();
    assert_eq!(
        ct.source(),
        meta().get_str("tokenizer.chat_template").unwrap()
    );
    let s = ct
        .render(
            &[
                ChatMessage::system("You are terse."),
                ChatMessage::user("What is the capital of France?"),
            ],
            true,
        )
        .unwrap();
    assert_eq!(
        s,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    // The model's template adds its default system prompt when there is none.
    let s = ct.render(&[ChatMessage::user("Hi")], true).unwrap();
    assert_eq!(
        s,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let s2 = ct.render(&[ChatMessage::user("Hi")], false).unwrap();
    assert!(s.starts_with(&s2) && !s2.ends_with("assistant\n"));
    let ids = t.encode_prompt(&s).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2);
}

#[test]
fn hf_tokenizer_files_round_trip() {
    let t = tok();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("specd-text-hf");
    let _ = std::fs::remove_dir_all(&dir);
    t.write_hf_files(&dir).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["bos_token"], "<|im_start|>");
    assert_eq!(cfg["eos_token"], "<|im_end|>");
    assert_eq!(
        cfg["chat_template"],
        meta().get_str("tokenizer.chat_template").unwrap()
    );
    assert_eq!(cfg["added_tokens_decoder"]["2"]["content"], "<|im_end|>");
    let h = Tokenizer::from_path(&dir).unwrap();
    let j = Tokenizer::from_path(dir.join("tokenizer.json")).unwrap();
    let g = Tokenizer::from_path(gguf_path()).unwrap();
    assert_eq!(g.vocab_size(), 49152);
    assert_eq!(h.vocab_size(), t.vocab_size());
    let mut e = h.eos_ids();
    e.sort();
    assert_eq!(e, vec![0, 2]);
    assert_eq!(h.bos_id(), Some(1));
    assert!(!h.add_bos());
    assert_eq!(h.chat_template(), t.chat_template());
    for s in samples() {
        let ids = t.encode(&s, false).unwrap();
        assert_eq!(h.encode(&s, false).unwrap(), ids, "{s:?}");
        assert_eq!(j.encode(&s, true).unwrap(), ids, "{s:?}");
        assert_eq!(h.decode(&ids), s);
    }
}
