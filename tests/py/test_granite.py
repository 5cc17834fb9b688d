"""Granite 3 (`granite`): llama with an embedding multiplier, an attention
multiplier in place of 1 / sqrt(head_dim), a residual multiplier on what
attention and the MLP add, and logits divided by a scaling.

A tiny random checkpoint (hf_checkpoints.py, mlx-lm's granite) with Granite
3 2B's multipliers; the same weights as an F32 GGUF (gguf_checkpoints.py:
q/k permuted, `granite.embedding_scale`, `residual_scale`,
`attention.scale`, `logit_scale`).

- The HF directory (float32 and MLX 4-bit, both kernel paths) against
  mlx-lm within 1e-4 x the logit range at every position; the GGUF against
  the directory and against llama.cpp (all logits, F32 KV) within 1e-3 x.
- mlx-lm with the multipliers neutral is far off, so a loader that ignores
  them fails above.
- Greedy with `ngram` and `self:1` equals plain decoding (4-bit);
  `random-model --arch granite --gguf` runs in llama.cpp and specd alike.
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
    IDS, LLAMA_CPP_TOL, MLX_TOL, assert_close, mlx_logits, rel_diff, specd_logits)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("granite")
    w = hf_checkpoints.write_checkpoint
    out = {
        "granite": w(root / "granite", "granite"),
        "granite-4bit": w(root / "granite-4bit", "granite", quantize=dict(group_size=64, bits=4)),
    }
    out["granite.gguf"] = gguf_checkpoints.write_gguf(out["granite"], root / "granite.gguf")
    return out


def test_granite_matches_mlx_lm_gguf_and_llama_cpp(models, tmp_path):
    d, path = models["granite"], models["granite.gguf"]
    hf = specd_logits(d, tmp_path)
    want = mlx_logits(d)
    assert_close("granite HF dir vs mlx-lm", hf, want, MLX_TOL)
    head_dim = 128 // 4
    plain = mlx_logits(d, embedding_multiplier=1.0, attention_multiplier=head_dim ** -0.5,
                       residual_multiplier=1.0, logits_scaling=1.0)
    r = rel_diff(plain, want)
    print(f"granite: mlx-lm without the multipliers {r:.3g} of the range off")
    assert r > 30 * MLX_TOL, r
    got = specd_logits(path, tmp_path)
    assert_close("granite GGUF vs HF dir", got, hf, MLX_TOL)
    assert_close("granite GGUF vs llama.cpp", got, gguf_checkpoints.llama_cpp_logits(path, IDS),
                 LLAMA_CPP_TOL)


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
def test_granite_4bit_matches_mlx_lm(models, tmp_path, kernels):
    d = models["granite-4bit"]
    assert_close(f"granite 4-bit ({kernels})", specd_logits(d, tmp_path, kernels), mlx_logits(d),
                 MLX_TOL)


def test_granite_greedy_speculation_equals_plain(models, tmp_path):
    assert_greedy_speculation_is_plain(models["granite-4bit"], tmp_path, "granite-4bit")


def test_random_granite_gguf_runs_in_specd_and_llama_cpp(tmp_path):
    assert_random_checkpoint("granite", tmp_path)
