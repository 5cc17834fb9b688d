"""Tiny HF checkpoints (hf_checkpoints.py) written again as GGUF files, the
way llama.cpp's convert_hf_to_gguf.py writes them (that script needs torch,
which the test venv does not hold, so its rules are followed here with the
`gguf` package):

- tensor names: `token_embd`, `blk.N.attn_q|attn_k|attn_v|attn_output`,
  `attn_norm`, `ffn_norm`, `ffn_gate|ffn_up|ffn_down`, `attn_q_norm` /
  `attn_k_norm` (Qwen3), `.bias` on q/k/v (Qwen2), `output_norm`, `output`
  (absent when tied), `rope_freqs` (Llama 3's scaling, as
  `LlamaModel.generate_extra_tensors` computes it);
- Phi-3: its fused `qkv_proj` as `attn_qkv` and `gate_up_proj` as `ffn_up`
  (Phi3MiniModel), `phi3.attention.sliding_window`;
- Gemma 3: norms stored as 1 + w (Gemma3Model adds the one),
  `post_attention_norm`, `ffn_norm` (HF's pre_feedforward_layernorm),
  `post_ffw_norm`, `gemma3.attention.sliding_window`, the head size as
  `attention.key_length` (llama.cpp fixes the pattern at every 6th layer
  global and the local rope base at 10000);
- Gemma 2 (Gemma2Model): Gemma 3's names and 1 + w norms without q/k
  norms, `gemma2.attn_logit_softcapping`, `gemma2.final_logit_softcapping`,
  `gemma2.attention.sliding_window`, the head size as `attention.key_length`
  and no rope keys (llama.cpp's base 10000; its window on the even layers,
  its attention scale 1 / sqrt(head size) but for the 46-layer 27B);
- Granite (GraniteModel, a LlamaModel): q/k permuted as llama's,
  `granite.embedding_scale`, `residual_scale`, `attention.scale`,
  `logit_scale` from the config's multipliers;
- SmolLM3 (SmolLM3Model, a LlamaModel): llama's names and permutation
  and no key for its NoPE layers (llama.cpp leaves every 4th layer
  unroped);
- OLMo 2 (Olmo2Model): `post_attention_norm`, `post_ffw_norm` (its only
  norms), full-width `attn_q_norm`/`attn_k_norm`, q/k unpermuted (llama.cpp
  runs it with NEOX rope);
- q/k permutation: only `llama` (and `granite`, `smollm3`) permutes q and k (`LlamaModel.permute`, for
  llama.cpp's interleaved rope); `qwen2`/`qwen3` keep HF's rotate-half
  layout (llama.cpp runs them, and phi3, with NEOX rope);
- metadata: `{arch}.context_length`, `embedding_length`, `block_count`,
  `feed_forward_length`, `attention.head_count(_kv)`,
  `attention.layer_norm_rms_epsilon`, `rope.freq_base`,
  `rope.dimension_count`, `attention.key_length`/`value_length`; the byte-level
  BPE as `tokenizer.ggml.model = gpt2` with its tokens, types and merges.

Weights are written in float32 (F32 tensors): llama.cpp then computes with
the same numbers specd does, and its logits are a reference for specd's.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

# llama.cpp's token types.
NORMAL, CONTROL = 1, 3


def llama3_factors(scaling: dict, head_dim: int, base: float) -> np.ndarray:
    """`rope_freqs.weight` for a llama3 `rope_scaling` (convert_hf_to_gguf.py's rule)."""
    factor = scaling.get("factor", 8.0)
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old = scaling.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (base ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (k: n_head = kv heads)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(d: Path) -> dict[str, np.ndarray]:
    import mlx.core as mx

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        for k, v in mx.load(str(f)).items():
            out[k] = np.array(v.astype(mx.float32))
    return out


def write_tokenizer(w, d: Path, pre: str) -> None:
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    specials = {t["id"]: t["content"] for t in tok.get("added_tokens", [])}
    n = max(list(vocab.values()) + list(specials)) + 1
    tokens = [""] * n
    for t, i in vocab.items():
        tokens[i] = t
    for i, t in specials.items():
        tokens[i] = t
    types = [CONTROL if i in specials else NORMAL for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    inv = {t: i for i, t in enumerate(tokens)}
    w.add_eos_token_id(inv[cfg["eos_token"]])
    w.add_add_bos_token(False)
    if cfg.get("chat_template"):
        w.add_chat_template(cfg["chat_template"])


def write_gguf(d: Path, out: Path, rope_freqs: bool = True, pre: str = "gpt-2",
               softcaps: tuple[float, float] | None = None) -> Path:
    """The HF checkpoint `d` (float weights) as an F32 GGUF at `out`, its
    architecture from config.json's model_type (llama, mistral: `llama`;
    qwen2; qwen3). `rope_freqs=False` leaves a llama3, longrope or yarn
    scaling out (a file as a converter that ignores it would write);
    `softcaps` replaces a Gemma 2's (attention, final) soft-caps.

    Phi-3's longrope as Phi3MiniModel writes it: `rope_factors_long`/`_short`
    tensors, `rope.scaling.attn_factor` = sqrt(1 + ln(s) / ln(original)) for
    s = max_position_embeddings / original, the original context, and
    `rope.dimension_count` = int(partial_rotary_factor * hidden) // heads;
    yarn as Qwen2Model does: `rope.scaling.type` yarn, its factor and the
    original context."""
    import gguf

    cfg = json.loads((d / "config.json").read_text())
    mt = cfg["model_type"]
    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
            "gemma3_text": "gemma3", "gemma2": "gemma2", "granite": "granite",
            "smollm3": "smollm3", "olmo2": "olmo2"}[mt]
    gemma = arch in ("gemma3", "gemma2")
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") if mt != "qwen2" else None
    head_dim = head_dim or cfg["hidden_size"] // heads
    base = cfg.get("rope_theta", 10000.0)
    w = gguf.GGUFWriter(str(out), arch)
    # Not the architecture's name: llama.cpp's vocabulary loader looks up
    # Phi-3's own tokens ("</s>") in a model whose name says phi3.
    w.add_name("tiny random")
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    rot = head_dim
    if arch == "phi3":
        rot = int(cfg.get("partial_rotary_factor", 1.0) * cfg["hidden_size"]) // heads
    if arch != "gemma2":  # Gemma2Model writes no rope keys
        w.add_rope_freq_base(base)
        w.add_rope_dimension_count(rot)
    if head_dim != cfg["hidden_size"] // heads or arch in ("qwen3", "gemma3", "gemma2"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    if arch == "granite":
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    if arch in ("phi3", "gemma3", "gemma2"):
        # Phi-4-mini has none: the converter writes 0.
        w.add_sliding_window(cfg.get("sliding_window") or 0)
    if arch == "gemma2":
        attn_cap, final_cap = softcaps or (cfg["attn_logit_softcapping"], cfg["final_logit_softcapping"])
        w.add_attn_logit_softcapping(attn_cap)
        w.add_final_logit_softcapping(final_cap)
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    long_factors = None
    if rope_freqs and kind == "longrope":
        orig = cfg["original_max_position_embeddings"]
        s = cfg["max_position_embeddings"] / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(s) / math.log(orig)) if s > 1 else 1.0)
        w.add_rope_scaling_orig_ctx_len(orig)
        long_factors = [np.asarray(scaling[k], dtype=np.float32) for k in ("long_factor", "short_factor")]
        assert len(long_factors[0]) == rot // 2
    if rope_freqs and kind == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(scaling["factor"])
        w.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    write_tokenizer(w, d, pre)

    t = hf_tensors(d)
    w.add_tensor("token_embd.weight", t.pop("model.embed_tokens.weight"))
    if rope_freqs and kind == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_factors(scaling, head_dim, base))
    if long_factors is not None:
        w.add_tensor("rope_factors_long.weight", long_factors[0])
        w.add_tensor("rope_factors_short.weight", long_factors[1])
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.qkv_proj": "attn_qkv",  # Phi-3's fused q/k/v
        "mlp.gate_up_proj": "ffn_up",  # Phi-3's fused gate/up, the gate first
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "post_attention_layernorm": "post_attention_norm" if gemma or arch == "olmo2" else "ffn_norm",
        # Gemma 3's MLP input norm and its norm after the MLP.
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in names.items():
            for kind in ("weight", "bias"):
                x = t.pop(f"model.layers.{i}.{hf}.{kind}", None)
                if x is None:
                    continue
                if arch in ("llama", "granite", "smollm3") and gg in ("attn_q", "attn_k"):
                    x = permute(x, heads if gg == "attn_q" else kv)
                if gemma and gg.endswith("norm"):
                    x = x + 1  # Gemma's 1 + w, as Gemma3Model.modify_tensors adds it
                w.add_tensor(f"blk.{i}.{gg}.{kind}", x)
    norm = t.pop("model.norm.weight")
    w.add_tensor("output_norm.weight", norm + 1 if gemma else norm)
    if "lm_head.weight" in t and not cfg.get("tie_word_embeddings", False):
        w.add_tensor("output.weight", t.pop("lm_head.weight"))
    t.pop("lm_head.weight", None)
    assert not t, f"tensors left unwritten: {sorted(t)}"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    """llama.cpp's logits (llama-cpp-python, every position, F32 KV cache)
    over the token ids."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=max(256, len(ids) + 8), n_batch=512, logits_all=True,
                verbose=False, type_k=0, type_v=0, flash_attn=False, seed=0)
    llm.eval(ids)
    out = np.array(llm.scores[: len(ids)], dtype=np.float64)
    llm.close()
    return out
