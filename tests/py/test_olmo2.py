"""OLMo 2 (`olmo2`): llama's weights with norms after attention and after
the MLP (none before them) and q/k RMS norms over the whole projection.

A tiny random checkpoint (hf_checkpoints.py, mlx-lm's olmo2, norms away
from 1); the same weights as an F32 GGUF (gguf_checkpoints.py:
`post_attention_norm`, `post_ffw_norm`, full-width `attn_q_norm` /
`attn_k_norm`, q/k unpermuted).

- The HF directory (float32 and MLX 4-bit, both kernel paths) against
  mlx-lm within 1e-4 x the logit range at every position, greedy equal;
  the GGUF against the directory and against llama.cpp (all logits, F32
  KV) within 1e-3 x.
- Greedy with `ngram` and `self:1` equals plain decoding (4-bit);
  `random-model --arch olmo2` matches mlx-lm as a directory and runs in
  llama.cpp and specd alike as a GGUF.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gguf_checkpoints  # noqa: E402
import hf_checkpoints  # noqa: E402
from test_architectures import (  # noqa: E402
    assert_greedy_speculation_is_plain, assert_random_checkpoint,
    IDS, LLAMA_CPP_TOL, MLX_TOL, assert_close, mlx_logits, specd_logits)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("olmo2")
    w = hf_checkpoints.write_checkpoint
    out = {
        "olmo2": w(root / "olmo2", "olmo2"),
        "olmo2-4bit": w(root / "olmo2-4bit", "olmo2", quantize=dict(group_size=64, bits=4)),
    }
    out["olmo2.gguf"] = gguf_checkpoints.write_gguf(out["olmo2"], root / "olmo2.gguf")
    return out


def test_olmo2_matches_mlx_lm_gguf_and_llama_cpp(models, tmp_path):
    d, path = models["olmo2"], models["olmo2.gguf"]
    hf = specd_logits(d, tmp_path)
    assert_close("olmo2 HF dir vs mlx-lm", hf, mlx_logits(d), MLX_TOL)
    got = specd_logits(path, tmp_path)
    assert_close("olmo2 GGUF vs HF dir", got, hf, MLX_TOL)
    assert_close("olmo2 GGUF vs llama.cpp", got, gguf_checkpoints.llama_cpp_logits(path, IDS),
                 LLAMA_CPP_TOL)


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
def test_olmo2_4bit_matches_mlx_lm(models, tmp_path, kernels):
    d = models["olmo2-4bit"]
    assert_close(f"olmo2 4-bit ({kernels})", specd_logits(d, tmp_path, kernels), mlx_logits(d),
                 MLX_TOL)


def test_olmo2_greedy_speculation_equals_plain(models, tmp_path):
    assert_greedy_speculation_is_plain(models["olmo2-4bit"], tmp_path, "olmo2-4bit")


def test_random_olmo2_matches_mlx_lm_and_runs_in_llama_cpp(tmp_path):
    assert_random_checkpoint("olmo2", tmp_path, shape="small", against_mlx_lm=True)
