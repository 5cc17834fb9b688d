//! EAGLE-3 heads (Li et al., 2025), with the names and math vLLM loads and
//! runs them by (`vllm/model_executor/models/llama_eagle3.py`, and the
//! layer taps of `vllm/model_executor/models/llama.py`).
//!
//! The head reads the target's residual stream at three layer boundaries
//! (low, middle, high: `eagle_aux_hidden_state_layer_ids`, by default
//! `[2, n / 2, n - 3]` of n layers), concatenated and projected by `fc` to
//! one feature f. Its one decoder layer takes the next token's embedding e
//! and f together: q/k/v read `[input_layernorm(e); hidden_norm(f)]`
//! (twice the hidden size), the attention's residual is f, then the MLP
//! as in a llama layer. Its output before the final norm is the feature
//! of the next chained step; after `norm`, `lm_head` gives logits over a
//! draft vocabulary whose id i is the target's `i + d2t[i]`.
use super::{check_draft_ids, HeadFormat, LayerShape, MtpConfig, MtpHead, Tensors};
use crate::cache::LayerCache;
use crate::llama::AttnOp;
use crate::{Linear, Llama, LlamaConfig};
use anyhow::{bail, ensure, Context, Result};
use specd_mlx::{io, ops, Array, Dtype};
use std::collections::HashMap;
use std::path::Path;

pub struct Eagle3 {
    /// The target's layer boundaries it reads, in this order.
    pub taps: Vec<usize>,
    /// `[hidden, taps * target hidden]`: the target's rows to a feature.
    pub fc: Linear,
    fc_in: i32,
    pub hidden_norm: Array,
    /// The attention's residual is the normed feature
    /// (`norm_before_residual`), not the feature.
    pub norm_before_residual: bool,
}

/// The config of an EAGLE-3 head: vLLM's and SpecForge's name the
/// architecture `*Eagle3*`, or carry an `eagle_config`.
pub(super) fn claims(raw: &serde_json::Value) -> bool {
    arch(raw).contains("eagle3") || raw.get("eagle_config").is_some()
}

/// An EAGLE-1/2 head's config (an `*Eagle*` architecture that is not
/// EAGLE-3's: [`claims`] is asked first).
pub(super) fn claims_older(raw: &serde_json::Value) -> bool {
    arch(raw).contains("eagle")
}

/// Refuses an EAGLE-1/2 head by name ([`claims_older`]).
pub(super) fn refuse_older(
    dir: &Path,
    _text: &str,
    raw: &serde_json::Value,
    _target: &Llama,
) -> Result<MtpHead> {
    bail!(
        "{} is an EAGLE-1/2 head ({}): specd loads its own heads (\"specd-mtp\"), EAGLE-3 heads and the MTP layers inside MiMo checkpoints",
        dir.display(),
        arch(raw)
    )
}

/// The config's first architecture, lowercased.
fn arch(raw: &serde_json::Value) -> String {
    raw["architectures"][0]
        .as_str()
        .unwrap_or("")
        .to_lowercase()
}

impl HeadFormat for Eagle3 {
    fn taps(&self) -> &[usize] {
        &self.taps
    }

    /// The features are the target's tapped rows `[1, T, taps * target
    /// hidden]`, or a chained step's own output `[1, T, hidden]`.
    fn rows(
        &self,
        m: &Llama,
        e: &Array,
        features: &Array,
        caches: &mut [Box<dyn LayerCache>],
    ) -> Result<Array> {
        let d = m.config.hidden_size as i32;
        let t = e.dim(1);
        let f = match features.dim(2) {
            w if w == self.fc_in => self.fc.forward(features)?,
            w if w == d => features.clone(),
            w => bail!("EAGLE-3 features {w} wide, not {} or {d}", self.fc_in),
        };
        let l = &m.layers[0];
        let hf = m.rms_norm(&f, &self.hidden_norm)?;
        let x = ops::concatenate(&[&m.rms_norm(e, &l.attn_norm)?, &hf], 2)?;
        let residual = if self.norm_before_residual { hf } else { f };
        // The llama layer's parts, not the layer itself: its q/k/v read
        // `[attn_norm(e); hidden_norm(f)]` (2 * hidden wide) while its
        // residual is f, so no one input `x` is both the normed matmul
        // input and the residual, as `Llama::layers` takes it.
        let probe: &mut crate::Probe<'_> = &mut crate::no_probe;
        let qkv = m.qkv_rows(l, &x, None, probe)?;
        let (q, k, v) = (&qkv.0, &qkv.1, &qkv.2);
        let seq = &mut [(&mut caches[0], (0, t))];
        let rope = Some(m.config.rope_theta);
        let o = m.attend_each(0, (q, k, v), seq, rope, AttnOp::Plain, probe)?;
        Ok(m.layer_rest(l, &o, &residual, probe)?)
    }
}

/// An EAGLE-3 head from `dir` (config.json `text`, parsed as `raw`) for
/// `target`: its safetensors, names as published (`midlayer.*` or
/// `layers.0.*`, `fc`, `norm`, `lm_head`, `d2t`, optionally
/// `embed_tokens`).
pub(super) fn load(
    dir: &Path,
    text: &str,
    raw: &serde_json::Value,
    target: &Llama,
) -> Result<MtpHead> {
    load_head(dir, text, raw, target)
        .with_context(|| format!("the EAGLE-3 head in {}", dir.display()))
}

fn load_head(dir: &Path, text: &str, raw: &serde_json::Value, target: &Llama) -> Result<MtpHead> {
    let t = &target.config;
    ensure!(
        target.first_layer == 0 && target.local_end() == target.layer_count(),
        "an EAGLE-3 head reads layers other pipeline ranks hold: run it in one process"
    );
    ensure!(
        matches!(t.arch, crate::Arch::Llama),
        "EAGLE-3 heads are run for llama-family targets (this model is {:?})",
        t.arch
    );
    if raw["norm_before_fc"].as_bool() == Some(true) {
        bail!("norm_before_fc = true is not supported");
    }
    let hc = LlamaConfig::from_hf_json(text).context("its config.json")?;
    ensure!(
        hc.num_hidden_layers == 1,
        "it has {} layers (specd runs EAGLE-3 heads of one layer)",
        hc.num_hidden_layers
    );
    ensure!(!hc.o_bias, "an o_proj bias is not supported");
    ensure!(
        hc.vocab_size == t.vocab_size,
        "it was trained for another model: its vocab_size is {}, the model's {}",
        hc.vocab_size,
        t.vocab_size
    );
    let target_hidden = raw["target_hidden_size"]
        .as_u64()
        .map_or(t.hidden_size, |x| x as usize);
    ensure!(
        target_hidden == t.hidden_size,
        "it was trained for another model: its target_hidden_size is {target_hidden}, the model's hidden_size {}",
        t.hidden_size
    );
    let taps = taps(raw, t.num_hidden_layers)?;
    let draft_vocab = raw["draft_vocab_size"]
        .as_u64()
        .map_or(hc.vocab_size, |x| x as usize);

    let tensors = Tensors::new(read_tensors(dir)?, dir.display().to_string(), target);
    let h = hc.hidden_size;
    let shape = LayerShape {
        prefix: "layers.0.".into(),
        hidden: h,
        qkv_in: 2 * h,
        ffn: hc.intermediate_size,
        qkv_bias: hc.qkv_bias,
    };
    let layer = tensors.layer(&shape, &hc)?;
    let hidden_norm = tensors.vector("layers.0.hidden_norm.weight", h)?;
    let fc_in = taps.len() * t.hidden_size;
    let mut fc = tensors.linear("fc.weight", h, fc_in)?;
    let embed = match tensors.map.contains_key("embed_tokens.weight") {
        true => tensors.linear("embed_tokens.weight", t.vocab_size, h)?,
        false => {
            ensure!(
                h == t.hidden_size,
                "its hidden_size {h} is not the model's {} and it has no embed_tokens.weight of its own",
                t.hidden_size
            );
            target.embed.clone()
        }
    };
    let lm_head = tensors.linear("lm_head.weight", draft_vocab, h)?;
    let draft_ids = match tensors.map.get("d2t") {
        Some(d2t) => {
            let off = d2t.as_type(Dtype::Int32)?.to_vec_i32()?;
            let ids = (off.iter().enumerate())
                .map(|(i, &o)| u32::try_from(i as i64 + o as i64))
                .collect::<std::result::Result<Vec<u32>, _>>()
                .context("d2t maps a draft id below 0")?;
            check_draft_ids(&ids, draft_vocab, t.vocab_size).context("its d2t")?;
            // An identity map is the whole vocabulary.
            (!ids.iter().enumerate().all(|(i, &x)| i as u32 == x)).then_some(ids)
        }
        None => {
            ensure!(
                draft_vocab == t.vocab_size,
                "it has no d2t map for its draft vocabulary of {draft_vocab}"
            );
            None
        }
    };
    let config = MtpConfig {
        format: "eagle3".into(),
        version: 1,
        hidden_size: h,
        num_attention_heads: hc.num_attention_heads,
        num_key_value_heads: hc.num_key_value_heads,
        head_dim: hc.head_dim,
        intermediate_size: hc.intermediate_size,
        target_vocab_size: t.vocab_size,
        draft_vocab_size: draft_vocab,
        training: serde_json::Value::Null,
    };
    let norm = tensors.vector("norm.weight", h)?;
    let body_config = LlamaConfig {
        num_hidden_layers: 1,
        vocab_size: draft_vocab,
        tie_word_embeddings: false,
        sliding_window: None,
        ..hc
    };
    let body = tensors.body(body_config, embed, layer, norm, lm_head)?;
    if tensors.quantize {
        fc = fc.pack(false)?;
    }
    Ok(MtpHead {
        config,
        body,
        draft_ids,
        format: Box::new(Eagle3 {
            taps,
            fc,
            fc_in: fc_in as i32,
            hidden_norm,
            norm_before_residual: raw["norm_before_residual"].as_bool() == Some(true),
        }),
    })
}

/// The boundaries the head reads (of a target with `n` layers): its
/// config's `eagle_aux_hidden_state_layer_ids` (at the top or in
/// `eagle_config`), else vLLM's default `[2, n / 2, n - 3]`.
fn taps(raw: &serde_json::Value, n: usize) -> Result<Vec<usize>> {
    const KEY: &str = "eagle_aux_hidden_state_layer_ids";
    let named = raw
        .get(KEY)
        .or_else(|| raw["eagle_config"].get(KEY))
        .filter(|v| !v.is_null());
    let taps = match named {
        None => {
            ensure!(n >= 4, "a model of {n} layers has no default EAGLE-3 taps");
            vec![2, n / 2, n - 3]
        }
        Some(v) => v
            .as_array()
            .with_context(|| format!("{KEY} is not a list"))?
            .iter()
            .map(|x| x.as_u64().map(|x| x as usize))
            .collect::<Option<Vec<usize>>>()
            .with_context(|| format!("{KEY} is not a list of layer numbers"))?,
    };
    ensure!(!taps.is_empty(), "{KEY} is empty");
    if let Some(k) = taps.iter().find(|&&k| k > n) {
        bail!("{KEY} names boundary {k}, past the model's {n} layers");
    }
    Ok(taps)
}

/// Every tensor of `dir`'s safetensors, named as vLLM's loader names them
/// after its renames (`midlayer.` is `layers.0.`; a leading `model.` is
/// dropped).
fn read_tensors(dir: &Path) -> Result<HashMap<String, Array>> {
    let files = crate::load::safetensors_files(dir)?;
    if files.is_empty() {
        bail!(
            "{} has no .safetensors file (a head saved as pytorch_model.bin must be converted to safetensors first)",
            dir.display()
        );
    }
    let mut map = HashMap::new();
    for f in &files {
        let tf = io::load_safetensors(f).with_context(|| format!("loading {}", f.display()))?;
        for (k, a) in tf.tensors {
            let k = k.strip_prefix("model.").unwrap_or(&k);
            let k = match k.strip_prefix("midlayer.") {
                Some(rest) => format!("layers.0.{rest}"),
                None => k.to_string(),
            };
            if k.ends_with(".scales") {
                bail!("{k}: quantized EAGLE-3 heads are not supported (specd quantizes the head itself)");
            }
            map.insert(k, a);
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn eagle3_configs_are_claimed_and_older_eagles_told_apart() {
        let eagle3 = json!({"architectures": ["LlamaForCausalLMEagle3"]});
        let by_config = json!({"architectures": ["LlamaForCausalLM"], "eagle_config": {}});
        let eagle1 = json!({"architectures": ["EagleLlamaForCausalLM"]});
        let plain = json!({"architectures": ["LlamaForCausalLM"]});
        assert!(claims(&eagle3) && claims(&by_config));
        assert!(!claims(&eagle1) && !claims(&plain));
        assert!(claims_older(&eagle1) && !claims_older(&plain));
        // EAGLE-3 is asked first ([`super::FOREIGN`]): its config claims
        // the older format's test too.
        assert!(claims_older(&eagle3));
        let first = super::super::FOREIGN
            .iter()
            .position(|f| (f.claims)(&eagle3));
        assert_eq!(first, Some(0));
    }
}
