"""SmolLM3 (`smollm3`): llama whose NoPE layers attend without rope (HF
`no_rope_layers`: 1 ropes, 0 does not; llama.cpp, reading no key for it,
leaves every 4th layer unroped).

A tiny random 4-layer checkpoint (hf_checkpoints.py, mlx-lm's smollm3), its
4th layer NoPE; the same weights as an F32 GGUF (gguf_checkpoints.py: q/k
permuted as llama's, architecture `smollm3`).

- The HF directory (float32 and MLX 4-bit, both kernel paths; the 4-bit
  one runs the fused q/k/v + rope op on its roped layers only) against
  mlx-lm within 1e-4 x the logit range at every position, greedy tokens
  equal; the GGUF against the directory and against llama.cpp (all
  logits, F32 KV) within 1e-3 x.
- mlx-lm with every layer roped is far off, so a loader that ropes the
  NoPE layers fails above; a checkpoint whose *first* layer is the NoPE
  one matches mlx-lm too, so the list is read, not the every-4th rule.
- Greedy with `ngram` and `self:1` equals plain decoding (4-bit);
  `random-model --arch smollm3` (4 layers) matches mlx-lm as a directory
  and runs in llama.cpp and specd alike as a GGUF.
"""
from __future__ import annotations

import json
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
    root = tmp_path_factory.mktemp("smollm3")
    w = hf_checkpoints.write_checkpoint
    out = {
        "smollm3": w(root / "smollm3", "smollm3"),
        "smollm3-4bit": w(root / "smollm3-4bit", "smollm3", quantize=dict(group_size=64, bits=4)),
        "smollm3-first": w(root / "smollm3-first", "smollm3", no_rope_layers=[0, 1, 1, 1]),
    }
    out["smollm3.gguf"] = gguf_checkpoints.write_gguf(out["smollm3"], root / "smollm3.gguf")
    return out


def test_smollm3_matches_mlx_lm_gguf_and_llama_cpp(models, tmp_path):
    d, path = models["smollm3"], models["smollm3.gguf"]
    hf = specd_logits(d, tmp_path)
    want = mlx_logits(d)
    assert_close("smollm3 HF dir vs mlx-lm", hf, want, MLX_TOL)  # greedy equal too
    roped = mlx_logits(d, no_rope_layers=[1, 1, 1, 1])
    r = rel_diff(roped, want)
    print(f"smollm3: mlx-lm with every layer roped {r:.3g} of the range off")
    assert r > 30 * MLX_TOL, r
    got = specd_logits(path, tmp_path)
    assert_close("smollm3 GGUF vs HF dir", got, hf, MLX_TOL)
    assert_close("smollm3 GGUF vs llama.cpp", got, gguf_checkpoints.llama_cpp_logits(path, IDS),
                 LLAMA_CPP_TOL)


def test_smollm3_reads_its_no_rope_list(models, tmp_path):
    d = models["smollm3-first"]
    want = mlx_logits(d)
    assert rel_diff(want, mlx_logits(d, no_rope_layers=[1, 1, 1, 0])) > 30 * MLX_TOL
    assert_close("smollm3 (first layer NoPE) vs mlx-lm", specd_logits(d, tmp_path), want, MLX_TOL)


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
def test_smollm3_4bit_matches_mlx_lm(models, tmp_path, kernels):
    d = models["smollm3-4bit"]
    assert_close(f"smollm3 4-bit ({kernels})", specd_logits(d, tmp_path, kernels), mlx_logits(d),
                 MLX_TOL)


def test_smollm3_greedy_speculation_equals_plain(models, tmp_path):
    assert_greedy_speculation_is_plain(models["smollm3-4bit"], tmp_path, "smollm3-4bit")


def test_random_smollm3_matches_mlx_lm_and_runs_in_llama_cpp(tmp_path):
    # `small`: 4 layers, so the 4th is NoPE.
    assert_random_checkpoint("smollm3", tmp_path, shape="small", against_mlx_lm=True)
    assert json.loads((tmp_path / "smollm3" / "config.json").read_text())["no_rope_layers"] == [1, 1, 1, 0]
