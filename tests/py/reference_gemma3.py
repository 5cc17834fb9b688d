#!/usr/bin/env python3
"""An independent numpy reference of a Gemma 3 GGUF model (float64).

Weights come from the `gguf` package: its reader for the bytes and
`gguf.quants.dequantize` for every block type (Q4_K, Q5_0, Q6_K, Q8_0, ...),
so nothing here shares code with specd's own block decoders.

The forward follows mlx-lm's gemma3_text.py:
  - embedding times sqrt(hidden) rounded to bfloat16 (25.25 for 640);
  - per layer: RMSNorm (the GGUF's weights already hold Gemma's 1 + w),
    q/k/v, an RMSNorm over each head of q and of k, NEOX (rotate-half) rope
    with base 10000 on local layers and `gemma3.rope.freq_base` on global
    ones (every 6th layer), attention scaled by head_dim ** -0.5, causal and
    on local layers limited to the last `sliding_window` positions, the
    output through post_attention_norm before the residual; then
    gelu_tanh(gate) * up, down, post_ffw_norm, the residual;
  - the final norm and the tied embedding as the head.

    python reference_gemma3.py MODEL.gguf 2,651,6037     # argmax and top-5
"""
from __future__ import annotations

import sys

import numpy as np

import gguf
from gguf import quants

import reference

SLIDING_WINDOW_PATTERN = 6
LOCAL_ROPE_BASE = 10000.0


def bf16_round(x: float) -> float:
    b = np.array([x], dtype=np.float32).view(np.uint32)[0]
    b = (int(b) + 0x7FFF + ((int(b) >> 16) & 1)) & 0xFFFF0000
    return float(np.array([b], dtype=np.uint32).view(np.float32)[0])


class Gemma3Reference:
    def __init__(self, path: str):
        r = gguf.GGUFReader(path)
        f = lambda k: r.fields[k].contents()  # noqa: E731
        if f("general.architecture") != "gemma3":
            raise ValueError(f"{path}: not a gemma3 GGUF")
        self.n_layers = int(f("gemma3.block_count"))
        self.hidden = int(f("gemma3.embedding_length"))
        self.n_heads = int(f("gemma3.attention.head_count"))
        self.n_kv = int(f("gemma3.attention.head_count_kv"))
        self.head_dim = int(f("gemma3.attention.key_length"))
        self.eps = float(f("gemma3.attention.layer_norm_rms_epsilon"))
        self.theta = float(f("gemma3.rope.freq_base"))
        self.window = int(f("gemma3.attention.sliding_window"))
        self.tensors = {t.name: t for t in r.tensors}
        self._cache: dict[str, np.ndarray] = {}

    def w(self, name: str) -> np.ndarray:
        if name not in self._cache:
            t = self.tensors[name]
            a = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
            self._cache[name] = a.reshape(-1, int(t.shape[0])) if len(t.shape) > 1 else a.reshape(-1)
        return self._cache[name]

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, base):
        """x: [T, heads, d], rotate-half pairs (i, i + d/2)."""
        d = self.head_dim
        inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def logits(self, ids) -> np.ndarray:
        """Logits [T, vocab] for every position of `ids`."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        embd = self.w("token_embd.weight")
        x = embd[ids] * bf16_round(self.hidden**0.5)
        pos = np.arange(T)
        dist = pos[:, None] - pos[None, :]
        for i in range(self.n_layers):
            p = f"blk.{i}."
            local = (i + 1) % SLIDING_WINDOW_PATTERN != 0
            visible = dist >= 0
            if local:
                visible &= dist < self.window
            mask = np.where(visible, 0.0, -np.inf)
            base = LOCAL_ROPE_BASE if local else self.theta
            h = self.rms(x, self.w(p + "attn_norm.weight"))
            q = (h @ self.w(p + "attn_q.weight").T).reshape(T, nh, hd)
            k = (h @ self.w(p + "attn_k.weight").T).reshape(T, nkv, hd)
            v = (h @ self.w(p + "attn_v.weight").T).reshape(T, nkv, hd)
            q = self.rope(self.rms(q, self.w(p + "attn_q_norm.weight")), pos, base)
            k = self.rope(self.rms(k, self.w(p + "attn_k_norm.weight")), pos, base)
            o = reference.attention(q, k, v, mask) @ self.w(p + "attn_output.weight").T
            x = x + self.rms(o, self.w(p + "post_attention_norm.weight"))
            h = self.rms(x, self.w(p + "ffn_norm.weight"))
            g = h @ self.w(p + "ffn_gate.weight").T
            u = h @ self.w(p + "ffn_up.weight").T
            gelu = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3)))
            d = (gelu * u) @ self.w(p + "ffn_down.weight").T
            x = x + self.rms(d, self.w(p + "post_ffw_norm.weight"))
        x = self.rms(x, self.w("output_norm.weight"))
        return x @ embd.T


if __name__ == "__main__":
    sys.exit(reference.cli(sys.argv, Gemma3Reference))
