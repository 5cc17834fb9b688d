//! `specd convert GGUF DIR`: the Hugging Face directory form that mlx-lm and
//! transformers load — float32 safetensors under HF names with q/k back in
//! HF's rotate-half layout, config.json, tokenizer files with the template.
//! Gemma 3 becomes mlx-lm's `gemma3_text`: its names, q/k as they are (its
//! GGUF is not permuted), and norms back to Gemma's `w` (the GGUF holds
//! `1 + w`; `x - 1` is exact for the weights near 1 these are).
use super::load::read_gguf;
use super::{Arch, LlamaConfig};
use anyhow::{Context, Result};
use specd_mlx::{io, Array};
use specd_text::Tokenizer;
use std::path::Path;

/// GGUF stores q/k rows permuted for interleaved rope:
/// gguf = hf.reshape(h, 2, d/2, in).swapaxes(1, 2); this undoes it.
pub fn unpermute(w: &Array, heads: usize) -> Result<Array> {
    let s = w.shape();
    let (rows, cols) = (s[0], s[1]);
    let h = heads as i32;
    Ok(w.reshape(&[h, rows / h / 2, 2, cols])?
        .swapaxes(1, 2)?
        .reshape(&[rows, cols])?)
}

const LAYER_NAMES: [(&str, &str); 9] = [
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

const GEMMA3_LAYER_NAMES: [(&str, &str); 13] = [
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// A Gemma norm weight as HF holds it: the GGUF's `1 + w` less one.
fn gemma_norm(w: Array) -> Result<Array> {
    Ok(specd_mlx::ops::subtract(&w, &Array::scalar(1.0)?)?)
}

pub fn convert_gguf(gguf: &Path, out: &Path) -> Result<()> {
    let (t, meta) = read_gguf(gguf, super::WeightMode::F32)?;
    // The names and q/k layout below are llama's and Gemma 3's.
    match meta.get("general.architecture").map(String::as_str) {
        None | Some("llama" | "gemma3") => {}
        Some(a) => anyhow::bail!(
            "specd convert writes llama and gemma3 GGUFs as HF directories, not {a:?}: run the GGUF itself"
        ),
    }
    let mut config = LlamaConfig::from_gguf(&meta, t.has("output"))?;
    let scaled = config.rope_freq_factors.is_some() || config.rope_attn_factor.is_some();
    if scaled || super::load::rope_freqs(&t, &config)?.is_some() {
        anyhow::bail!(
            "{} carries a scaled rope (rope_freqs.weight as Llama 3.1's, or rope.scaling.*), which specd's config.json does not state: run the GGUF itself",
            gguf.display()
        );
    }
    let tokenizer = Tokenizer::from_gguf_file(gguf)?;
    let mut tensors: Vec<(String, Array)> = Vec::new();
    let embed = t.dense("token_embd")?;
    if config.vocab_size == 0 {
        config.vocab_size = embed.dim(0) as usize;
    }
    tensors.push(("model.embed_tokens.weight".into(), embed));
    let gemma = config.arch == Arch::Gemma3;
    if gemma {
        for i in 0..config.num_hidden_layers {
            for (g, h) in GEMMA3_LAYER_NAMES {
                let mut w = t.dense(&format!("blk.{i}.{g}"))?;
                if g.ends_with("norm") {
                    w = gemma_norm(w)?;
                }
                tensors.push((format!("model.layers.{i}.{h}.weight"), w));
            }
        }
    }
    for i in (0..config.num_hidden_layers).filter(|_| !gemma) {
        for (g, h) in LAYER_NAMES {
            let mut w = t.dense(&format!("blk.{i}.{g}"))?;
            if g == "attn_q" {
                w = unpermute(&w, config.num_attention_heads)?;
            } else if g == "attn_k" {
                w = unpermute(&w, config.num_key_value_heads)?;
            }
            tensors.push((format!("model.layers.{i}.{h}.weight"), w));
        }
    }
    let norm = t.dense("output_norm")?;
    let norm = if gemma { gemma_norm(norm)? } else { norm };
    tensors.push(("model.norm.weight".into(), norm));
    if !config.tie_word_embeddings {
        tensors.push(("lm_head.weight".into(), t.dense("output")?));
    }
    // The converted model is HF-layout (rotate-half rope).
    config.rope_traditional = false;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let arrays: Vec<&Array> = tensors.iter().map(|(_, a)| a).collect();
    specd_mlx::eval(&arrays)?;
    io::save_safetensors(
        &out.join("model.safetensors"),
        &tensors,
        &[("format".into(), "pt".into())],
    )
    .context("writing model.safetensors")?;
    let cfg = config.to_hf_json(&tokenizer.eos_ids(), tokenizer.bos_id());
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(&cfg)?)?;
    tokenizer
        .write_hf_files(out)
        .context("writing tokenizer files")?;
    Ok(())
}
