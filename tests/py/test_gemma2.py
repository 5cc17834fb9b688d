"""Gemma 2 from HF directories and GGUF files, against mlx-lm and llama.cpp.

The tiny random checkpoint (hf_checkpoints.py, written with mlx-lm's own
gemma2 class) has soft-caps that bite on its weights (attention 3, logits
60), `query_pre_attn_scalar` 48 (not the head size, 64), three layers.
Copies of it differ in config.json only: a window of 16 (on layers 0 and
2, as Gemma 2's even layers) and llama.cpp's attention scale (1 / sqrt of
the head size, what a GGUF of a non-27B Gemma 2 means).

- HF directory (float32: MLX's ops, the capped attention built from them;
  MLX 4-bit and 8-bit: specd's kernels; 4-bit on `--kernels mlx`) against mlx-lm's gemma2
  over 96 positions with the window out of reach (mlx-lm's gemma2 has
  none): < 1e-4 x the logit range, the same argmax. mlx-lm without either
  cap is far off, so a forward that ignores one fails.
- The window of 16: the F32 GGUF (gguf_checkpoints.py, Gemma2Model's
  names, 1 + w norms and keys) gives the directory's logits, and
  llama.cpp's (llama-cpp-python, all logits, F32 KV cache) over 96
  positions that cross the window; the window moves the logits far beyond
  that bound. The 4-bit copy across the window: specd's kernels against
  `--kernels mlx`. A GGUF whose caps are 1e9 (none, in effect) moves llama.cpp
  far off, and specd follows the file's caps the same way.
- Greedy with `--drafter ngram` and `self:1` equals plain decoding across
  the window (4-bit, specd's kernels; F32 GGUF); two pipeline ranks print
  what one process prints; concurrent requests keep their solo tokens; `specd debug random-model --arch gemma2 --gguf` runs
  in llama.cpp.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gguf_checkpoints  # noqa: E402
import hf_checkpoints  # noqa: E402
from compare import assert_batched_equals_solo  # noqa: E402
from test_architectures import (  # noqa: E402
    IDS, LLAMA_CPP_TOL, MIX, MLX_TOL, assert_close, assert_greedy_speculation_is_plain,
    assert_random_checkpoint, mlx_logits, rel_diff,
    specd_logits,
)

def config_copy(src: Path, dst: Path, **changes) -> Path:
    """`src` with config.json's fields changed (the same weights)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma2")
    w = hf_checkpoints.write_checkpoint
    out = {
        "gemma2": w(root / "gemma2", "gemma2"),
        "gemma2-4bit": w(root / "gemma2-4bit", "gemma2", quantize=dict(group_size=64, bits=4)),
        "gemma2-8bit": w(root / "gemma2-8bit", "gemma2", quantize=dict(group_size=32, bits=8)),
    }
    head_dim = hf_checkpoints.ARCHS["gemma2"]["config"]["head_dim"]
    swa = dict(sliding_window=16, query_pre_attn_scalar=head_dim)
    out["gemma2-swa"] = config_copy(out["gemma2"], root / "gemma2-swa", **swa)
    out["gemma2-swa-4bit"] = config_copy(out["gemma2-4bit"], root / "gemma2-swa-4bit", **swa)
    g = gguf_checkpoints.write_gguf
    out["gemma2-swa.gguf"] = g(out["gemma2-swa"], root / "gemma2-swa.gguf")
    out["gemma2-uncapped.gguf"] = g(out["gemma2-swa"], root / "gemma2-uncapped.gguf", softcaps=(1e9, 1e9))
    return out


@pytest.mark.parametrize("name,kernels", [("gemma2", "specd"), ("gemma2-4bit", "specd"),
                                          ("gemma2-4bit", "mlx"), ("gemma2-8bit", "specd")])
def test_gemma2_hf_dir_matches_mlx_lm(models, tmp_path, name, kernels):
    d = models[name]
    assert json.loads((d / "config.json").read_text())["model_type"] == "gemma2"
    got = specd_logits(d, tmp_path, kernels)
    want = mlx_logits(d)
    assert_close(f"{name} ({kernels})", got, want, MLX_TOL)
    # Either cap left out moves mlx-lm's logits far beyond the bound.
    for cap in ["attn_logit_softcapping", "final_logit_softcapping"]:
        r = rel_diff(mlx_logits(d, **{cap: 1e9}), want)
        print(f"{name}: without {cap} mlx-lm moves by {r:.3g} of the range")
        assert r > 30 * MLX_TOL, (cap, r)


def test_gemma2_window_gguf_matches_hf_dir_and_llama_cpp(models, tmp_path):
    d, path = models["gemma2-swa"], models["gemma2-swa.gguf"]
    hf = specd_logits(d, tmp_path)
    got = specd_logits(path, tmp_path)
    assert_close("gemma2 window GGUF vs HF dir", got, hf, MLX_TOL)
    llama_cpp = gguf_checkpoints.llama_cpp_logits(path, IDS)
    assert_close("gemma2 window GGUF vs llama.cpp", got, llama_cpp, LLAMA_CPP_TOL)
    # specd's capped attention kernel (4-bit) across the window against the
    # same checkpoint on MLX's ops (`--kernels mlx`, the capped attention
    # built from them).
    q = models["gemma2-swa-4bit"]
    assert_close("gemma2 window 4-bit kernels vs mlx", specd_logits(q, tmp_path),
                 specd_logits(q, tmp_path, "mlx"), MLX_TOL)
    # The window bites: without it (mlx-lm, llama.cpp's scale) the logits
    # move far more than the bounds above.
    wide = mlx_logits(d)
    print(f"gemma2: the window moves the logits by {rel_diff(wide, hf):.3g} of the range")
    assert rel_diff(wide, hf) > 30 * LLAMA_CPP_TOL
    # llama.cpp honours the file's caps, and so does specd: without them
    # both move far off, together.
    uncapped = gguf_checkpoints.llama_cpp_logits(models["gemma2-uncapped.gguf"], IDS)
    r = rel_diff(uncapped, llama_cpp)
    print(f"llama.cpp with and without the soft-caps: {r:.3g} of the range apart")
    assert r > 30 * LLAMA_CPP_TOL, r
    assert_close("uncapped GGUF vs llama.cpp", specd_logits(models["gemma2-uncapped.gguf"], tmp_path),
                 uncapped, LLAMA_CPP_TOL)


@pytest.mark.parametrize("name", ["gemma2-swa-4bit", "gemma2-swa.gguf"])
def test_gemma2_greedy_speculation_equals_plain(models, tmp_path, name):
    assert_greedy_speculation_is_plain(models[name], tmp_path, name)


def test_gemma2_on_two_ranks_equals_one(models, tmp_path):
    """Pipeline ranks (test_ranks.py's two on loopback): rank 1 runs layer
    2 (windowed) past the window, rounds rejecting drafts roll its caches
    back; the text is one process's, byte for byte."""
    from test_ranks import generate_ranks, generate_solo

    args = ["--model", str(models["gemma2-swa-4bit"]), "--max-tokens", "48", "--drafter", "ngram",
            "the fox and the dog and the fox and the"]
    solo = generate_solo(args)
    two, _, log1 = generate_ranks(tmp_path, args)
    assert two == solo and len(solo) > 40
    assert "rank 1: stopped after" in log1, log1


def test_gemma2_requests_share_steps_and_keep_their_solo_tokens(models, start_server):
    """The batched step over Gemma 2's windowed and global layers (4-bit,
    specd's kernels) gives every request its solo tokens."""
    server = start_server("--model", str(models["gemma2-swa-4bit"]))
    assert_batched_equals_solo(server.url, "default", MIX, need=2)


def test_gemma2_random_gguf_runs_in_specd_and_llama_cpp(tmp_path):
    """`random-model --arch gemma2 --gguf` (Q4_1, Q8_0 embedding, the caps
    and window in its metadata) is what llama.cpp reads as Gemma 2
    (test_architectures.assert_random_checkpoint)."""
    assert_random_checkpoint("gemma2", tmp_path)
