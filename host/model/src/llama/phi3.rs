//! Phi-3: a llama whose q/k/v projection is one tensor (`qkv_proj`; GGUF
//! `attn_qkv`) and whose gate and up projections are one (`gate_up_proj`;
//! GGUF `ffn_up` of twice the MLP width, the gate first), with a sliding
//! window on every layer. The fused tensors are split into the llama names
//! as the model loads ([`fused_splits`]); specd fuses q/k/v and gate/up again
//! for its kernels, so the forward is llama's.
//!
//! Phi-3.5's and Phi-4-mini's `longrope` scaling and Phi-4-mini's partial
//! rotary rope are refused at load (`config.rs`, `load.rs`).
use crate::LlamaConfig;

/// The fused tensors of a layer and the names of their row ranges, in one
/// file layout: `(prefix, fused, [(name, rows)..])`.
fn parts(c: &LlamaConfig, gguf: bool) -> [(&'static str, Vec<(&'static str, i32)>); 2] {
    let (q, kv) = (
        (c.num_attention_heads * c.head_dim) as i32,
        (c.num_key_value_heads * c.head_dim) as i32,
    );
    let ff = c.intermediate_size as i32;
    match gguf {
        true => [
            (
                "attn_qkv",
                vec![("attn_q", q), ("attn_k", kv), ("attn_v", kv)],
            ),
            ("ffn_up", vec![("ffn_gate", ff), ("ffn_up", ff)]),
        ],
        false => [
            (
                "self_attn.qkv_proj",
                vec![
                    ("self_attn.q_proj", q),
                    ("self_attn.k_proj", kv),
                    ("self_attn.v_proj", kv),
                ],
            ),
            (
                "mlp.gate_up_proj",
                vec![("mlp.gate_proj", ff), ("mlp.up_proj", ff)],
            ),
        ],
    }
}

/// The splits of every fused q/k/v and gate/up tensor of the layers under
/// `layer_prefix` (`blk.` or `model.layers.`) into the llama names, rows in
/// order: `(fused base name, [(part base name, rows)..])`. The loader
/// applies them (quantized tensors with their scales and biases: rows are
/// output features, so the split is exact). `has` says whether a base name
/// exists: a file without fused tensors gets no split, and a GGUF's
/// `ffn_up` is split only where it is twice the MLP width and no
/// `ffn_gate` exists.
pub fn fused_splits(
    c: &LlamaConfig,
    layer_prefix: &str,
    has: impl Fn(&str) -> bool,
) -> Vec<(String, Vec<(String, i32)>)> {
    let gguf = layer_prefix == "blk.";
    let mut out = Vec::new();
    for i in 0..c.num_hidden_layers {
        for (fused, to) in parts(c, gguf) {
            let from = format!("{layer_prefix}{i}.{fused}");
            let gate = format!("{layer_prefix}{i}.{}", to[0].0);
            if !has(&from) || (gguf && to.len() == 2 && has(&gate)) {
                continue;
            }
            let to = to
                .iter()
                .map(|(n, rows)| (format!("{layer_prefix}{i}.{n}"), *rows))
                .collect();
            out.push((from, to));
        }
    }
    out
}
