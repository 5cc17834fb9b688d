"""Long-context ropes against references: Phi-3.5's `longrope`, Phi-4-mini's
longrope over part of each head (`partial_rotary_factor`), Qwen 2.5's
`yarn` (on Qwen2, and on Qwen3 where a q norm comes before the rope).

Each is a tiny random checkpoint (hf_checkpoints.py, mlx-lm's own model
classes) whose original context is 32 positions, so the scaling bites
within the 96-position prompt; the same weights as an F32 GGUF the way
llama.cpp's converter writes them (gguf_checkpoints.py: longrope's
`rope_factors_long`/`_short` and `rope.scaling.attn_factor`,
`rope.dimension_count` for the partial rope, yarn's `rope.scaling.*`).

- The HF directory against mlx-lm (SuScaledRoPE, YarnRoPE) within 1e-4 x
  the logit range at every position, greedy tokens equal; the GGUF against
  the directory (same bound) and against llama.cpp (llama-cpp-python, all
  logits, F32 KV cache, a context of 256 > 32, so llama.cpp picks the long
  factors as specd does) within 1e-3 x the range.
- The same references without the scaling are far off, so a loader that
  ignores it fails the comparisons above.
- Phi-4-mini 4-bit (MLX layout) runs specd's own kernels: the partial rope
  kernel and the attention factor folded into quantized scales, against
  mlx-lm; greedy with `ngram` and `self:1` equals plain decoding.
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

ORIGINAL = 32
SCALED = ["phi3.5", "phi4-mini", "qwen2-yarn", "qwen3-yarn"]


def longrope(pairs: int) -> dict:
    """A longrope `rope_scaling` (Phi-3.5's form): short factors near 1,
    long ones up to 8, one per rotated pair."""
    return dict(type="longrope",
                short_factor=[1.0 + 0.1 * i / pairs for i in range(pairs)],
                long_factor=[1.0 + 7.0 * i / pairs for i in range(pairs)])


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ropes")
    w = hf_checkpoints.write_checkpoint
    # Heads of 32: 16 rotated pairs, Phi-4-mini's 3/4 of them 12.
    phi35 = dict(original_max_position_embeddings=ORIGINAL, rope_scaling=longrope(16))
    phi4 = dict(original_max_position_embeddings=ORIGINAL, rope_scaling=longrope(12),
                partial_rotary_factor=0.75, sliding_window=None)
    yarn = dict(rope_scaling=dict(type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL))
    out = {
        "phi3.5": w(root / "phi3.5", "phi3", **phi35),
        "phi4-mini": w(root / "phi4-mini", "phi3", **phi4),
        "qwen2-yarn": w(root / "qwen2-yarn", "qwen2", **yarn),
        # Qwen3's q norm comes between the matmul and the rope: the
        # attention factor folds into the norm there.
        "qwen3-yarn": w(root / "qwen3-yarn", "qwen3", **yarn),
        "phi4-mini-4bit": w(root / "phi4-mini-4bit", "phi3", quantize=dict(group_size=64, bits=4),
                            **phi4),
    }
    g = gguf_checkpoints.write_gguf
    for name in SCALED:
        pre = "qwen2" if name.startswith("qwen") else "gpt-2"
        out[f"{name}.gguf"] = g(out[name], root / f"{name}.gguf", pre=pre)
        out[f"{name}-unscaled.gguf"] = g(out[name], root / f"{name}-unscaled.gguf", rope_freqs=False,
                                         pre=pre)
    return out


@pytest.mark.parametrize("name", SCALED)
def test_scaled_rope_matches_mlx_lm_gguf_and_llama_cpp(models, tmp_path, name):
    d, path = models[name], models[f"{name}.gguf"]
    hf = specd_logits(d, tmp_path)
    want = mlx_logits(d)
    assert_close(f"{name} HF dir vs mlx-lm", hf, want, MLX_TOL)
    # mlx-lm without the scaling: far off, so ignoring it fails above.
    unscaled = mlx_logits(d, rope_scaling=None)
    r = rel_diff(unscaled, want)
    print(f"{name}: mlx-lm unscaled differs by {r:.3g} of the range")
    assert r > 30 * MLX_TOL and rel_diff(hf, unscaled) > 30 * MLX_TOL, r
    if name.endswith("yarn"):
        # The frequencies alone (mscale 0: no attention factor) are off too.
        scaling = json.loads((d / "config.json").read_text())["rope_scaling"]
        r = rel_diff(mlx_logits(d, rope_scaling=dict(scaling, mscale=0.0)), want)
        print(f"{name}: without the attention factor {r:.3g} of the range off")
        assert r > 30 * MLX_TOL, r
    got = specd_logits(path, tmp_path)
    assert_close(f"{name} GGUF vs HF dir", got, hf, MLX_TOL)
    lcpp = gguf_checkpoints.llama_cpp_logits(path, IDS)
    assert_close(f"{name} GGUF vs llama.cpp", got, lcpp, LLAMA_CPP_TOL)
    # llama.cpp on the file without the scaling: far off too.
    bare = gguf_checkpoints.llama_cpp_logits(models[f"{name}-unscaled.gguf"], IDS)
    r = rel_diff(bare, lcpp)
    print(f"{name}: llama.cpp with and without the scaling {r:.3g} of the range apart")
    assert r > 30 * LLAMA_CPP_TOL and rel_diff(got, bare) > 30 * LLAMA_CPP_TOL, r


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
def test_phi4_mini_4bit_matches_mlx_lm(models, tmp_path, kernels):
    d = models["phi4-mini-4bit"]
    assert_close(f"phi4-mini 4-bit ({kernels})", specd_logits(d, tmp_path, kernels), mlx_logits(d),
                 MLX_TOL)


def test_phi4_mini_greedy_speculation_equals_plain(models, tmp_path):
    assert_greedy_speculation_is_plain(models["phi4-mini-4bit"], tmp_path, "phi4-mini-4bit")


@pytest.mark.parametrize("arch", ["phi3.5", "phi4-mini", "qwen2-yarn"])
def test_random_long_rope_gguf_runs_in_specd_and_llama_cpp(tmp_path, arch):
    """`random-model --arch ... --gguf` (Q4_1) is what llama.cpp reads as
    that model (test_architectures.assert_random_checkpoint)."""
    assert_random_checkpoint(arch, tmp_path)
