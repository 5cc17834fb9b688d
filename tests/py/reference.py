#!/usr/bin/env python3
"""An independent numpy reference of a llama-architecture GGUF model.

Reads the GGUF with the `gguf` package (metadata and raw tensor bytes only),
dequantizes Q4_0 / Q4_1 / Q8_0 / F16 / F32 blocks here in numpy, and runs the
llama forward in float64: RMSNorm, RoPE, grouped-query attention with a causal
mask, SwiGLU MLP, final norm, tied (or separate) output head.

GGUF stores attn_q / attn_k permuted for llama.cpp's "normal" rope, which
rotates adjacent pairs (x[2i], x[2i+1]) of each head -- MLX's
`traditional=True`. This reference uses the GGUF weights as they are with that
interleaved rotation; it never un-permutes (specd's converter does, so the two
paths are independent).

Nothing here comes from specd: it is the yardstick the end-to-end tests
compare specd's logits against.

    python reference.py MODEL.gguf 1,2,3     # prints argmax and top-5 logits
"""
from __future__ import annotations

import sys

import numpy as np

import gguf

# Block layouts (ggml): elements per block, bytes per block.
QK = 32


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 stored as 2 uint8 columns -> float64 column."""
    return raw.copy().view("<f2").astype(np.float64)


def dequant_q8_0(data: np.ndarray, n_per_row: int) -> np.ndarray:
    # block: f16 d, int8 q[32]; x = d * q
    blocks = data.reshape(-1, 34)
    d = _f16(blocks[:, :2])
    q = blocks[:, 2:].view(np.int8).astype(np.float64)
    return (d * q).reshape(-1, n_per_row)


def dequant_q4_0(data: np.ndarray, n_per_row: int) -> np.ndarray:
    # block: f16 d, u8 qs[16]; element j < 16 is the low nibble of qs[j],
    # element j + 16 the high nibble; x = d * (q - 8)
    blocks = data.reshape(-1, 18)
    d = _f16(blocks[:, :2])
    qs = blocks[:, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
    return (d * (q - 8.0)).reshape(-1, n_per_row)


def dequant_q4_1(data: np.ndarray, n_per_row: int) -> np.ndarray:
    # block: f16 d, f16 m, u8 qs[16]; nibbles as in Q4_0; x = d * q + m
    blocks = data.reshape(-1, 20)
    d = _f16(blocks[:, :2])
    m = _f16(blocks[:, 2:4])
    qs = blocks[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
    return (d * q + m).reshape(-1, n_per_row)


def tensor_f64(t) -> np.ndarray:
    """A GGUF tensor as float64 in row-major [rows, n_per_row] (HF [out, in])."""
    n_per_row = int(t.shape[0])  # gguf lists dims fastest-first
    kind = t.tensor_type
    T = gguf.GGMLQuantizationType
    if kind == T.F32:
        return np.asarray(t.data, dtype=np.float64).reshape(-1, n_per_row).squeeze(0) \
            if len(t.shape) == 1 else np.asarray(t.data, dtype=np.float64).reshape(-1, n_per_row)
    if kind == T.F16:
        a = np.asarray(t.data).view("<f2").astype(np.float64)
        return a if len(t.shape) == 1 else a.reshape(-1, n_per_row)
    raw = np.asarray(t.data, dtype=np.uint8).reshape(-1)
    if kind == T.Q8_0:
        return dequant_q8_0(raw, n_per_row)
    if kind == T.Q4_1:
        return dequant_q4_1(raw, n_per_row)
    if kind == T.Q4_0:
        return dequant_q4_0(raw, n_per_row)
    raise NotImplementedError(f"tensor {t.name}: type {kind.name} is not implemented here")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def attention(q, k, v, mask) -> np.ndarray:
    """Grouped-query attention of `q` [T, heads, d] over `k`, `v` [T,
    kv_heads, d] under the additive `mask` [T, T]: [T, heads * d]."""
    T, nh, hd = q.shape
    rep = nh // k.shape[1]
    o = np.empty((T, nh, hd))
    for head in range(nh):
        kv = head // rep
        s = q[:, head, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o[:, head, :] = s @ v[:, kv, :]
    return o.reshape(T, nh * hd)


class Reference:
    """The model in float64 numpy arrays."""

    def __init__(self, path: str):
        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"{path}: architecture {arch!r}, want llama")
        self.n_layers = int(_field(r, "llama.block_count"))
        self.hidden = int(_field(r, "llama.embedding_length"))
        self.n_heads = int(_field(r, "llama.attention.head_count"))
        self.n_kv = int(_field(r, "llama.attention.head_count_kv", self.n_heads))
        self.head_dim = int(_field(r, "llama.rope.dimension_count", self.hidden // self.n_heads))
        self.eps = float(_field(r, "llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(_field(r, "llama.rope.freq_base", 10000.0))
        self.tensors = {t.name: t for t in r.tensors}
        self._cache: dict[str, np.ndarray] = {}
        self.reader = r

    def w(self, name: str) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = tensor_f64(self.tensors[name])
        return self._cache[name]

    def rms_norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope_interleaved(self, x, positions):
        """x: [T, heads, head_dim]; rotates pairs (2i, 2i+1) by pos * theta^(-2i/d)."""
        d = self.head_dim
        inv = self.theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # [d/2]
        ang = positions[:, None].astype(np.float64) * inv[None, :]  # [T, d/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def logits(self, ids) -> np.ndarray:
        """Logits [T, vocab] for every position of `ids` (float64)."""
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        embd = self.w("token_embd.weight")
        x = embd[ids]  # [T, hidden]
        pos = np.arange(T)
        causal = np.triu(np.full((T, T), -np.inf), k=1)
        for i in range(self.n_layers):
            p = f"blk.{i}."
            h = self.rms_norm(x, self.w(p + "attn_norm.weight"))
            q = (h @ self.w(p + "attn_q.weight").T).reshape(T, nh, hd)
            k = (h @ self.w(p + "attn_k.weight").T).reshape(T, nkv, hd)
            v = (h @ self.w(p + "attn_v.weight").T).reshape(T, nkv, hd)
            q = self.rope_interleaved(q, pos)
            k = self.rope_interleaved(k, pos)
            o = attention(q, k, v, causal)
            x = x + o @ self.w(p + "attn_output.weight").T
            h = self.rms_norm(x, self.w(p + "ffn_norm.weight"))
            g = h @ self.w(p + "ffn_gate.weight").T
            u = h @ self.w(p + "ffn_up.weight").T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ self.w(p + "ffn_down.weight").T
        x = self.rms_norm(x, self.w("output_norm.weight"))
        head = self.w("output.weight") if "output.weight" in self.tensors else embd
        return x @ head.T


def cli(argv, make) -> int:
    """`python FILE MODEL.gguf IDS`: the argmax and the top 5 logits after
    IDS (comma-separated), from the reference `make(MODEL)`."""
    if len(argv) != 3:
        print(sys.modules[make.__module__].__doc__, file=sys.stderr)
        return 2
    last = make(argv[1]).logits([int(t) for t in argv[2].split(",")])[-1]
    top = np.argsort(-last)[:5]
    print("argmax", int(top[0]))
    for t in top:
        print(int(t), float(last[t]))
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv, Reference))
