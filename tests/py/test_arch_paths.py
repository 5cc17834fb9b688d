"""Each architecture's MLX 4-bit checkpoint on specd's other paths:
`--kernels mlx` and two pipeline ranks.

The tiny random checkpoints are hf_checkpoints.py's (mlx-lm's own model
classes, quantized as mlx-community's): Llama 3 with its `llama3` rope
scaling (factors that bite from position ~5 on), Qwen2 (q/k/v biases),
Qwen3 (q/k norms), Phi-3 (fused q/k/v and gate/up; a window of 16 on
every layer here) and Gemma 3 (a window of 16 on every 2nd layer here), SmolLM3 (its 4th, last layer without rope: on
rank 1 of two) and OLMo 2 (post-norms, full-width q/k norms).
Gemma 2 has the same checks in test_gemma2.py.

- specd's kernels against MLX's ops (`--kernels mlx`) on the same file:
  every position of 96 (across the windows) within 1e-4 x the logit
  range, the same argmax (test_architectures.py's bound).
- `generate` with `--drafter ngram` on two ranks (test_ranks.py's, on
  loopback; rank 1 runs the last layer, rounds that reject drafts roll
  its caches back) prints what one process prints, byte for byte.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hf_checkpoints  # noqa: E402
from test_architectures import MLX_TOL, assert_close, specd_logits  # noqa: E402
from test_ranks import generate_ranks, generate_solo  # noqa: E402

ARCHS = ["llama3", "qwen2", "qwen3", "phi3", "gemma3", "smollm3", "olmo2"]
WINDOW = 16
# Config fields each checkpoint changes: windows short enough that the
# 96 logits positions and the generated text cross them.
CHANGES = {"phi3": dict(sliding_window=WINDOW), "gemma3": dict(sliding_window=WINDOW)}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("arch-paths")
    q4 = dict(group_size=64, bits=4)
    return {a: hf_checkpoints.write_checkpoint(root / a, a, quantize=q4, **CHANGES.get(a, {}))
            for a in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_mlx_matches_specd_kernels(models, tmp_path, arch):
    d = models[arch]
    assert_close(f"{arch} 4-bit specd kernels vs --kernels mlx", specd_logits(d, tmp_path),
                 specd_logits(d, tmp_path, "mlx"), MLX_TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_two_ranks_equal_one_process(models, tmp_path, arch):
    args = ["--model", str(models[arch]), "--max-tokens", "48", "--drafter", "ngram",
            "the fox and the dog and the fox and the"]
    solo = generate_solo(args)
    two, _, log1 = generate_ranks(tmp_path, args)
    assert "rank 1: stopped after" in log1, log1
    assert two == solo, f"{arch}: two ranks printed {two!r}, one process {solo!r}"
    # 48 tokens of a byte-level vocabulary: well over 40 characters.
    assert len(solo) > 40, solo
