"""Gemma 3 270M (a Q4_K_M GGUF) and GGUF block decoding, end to end.

- the weights specd's kernels run on (read back from the packed layout by
  `specd debug weights`) equal `gguf.quants.dequantize` exactly (bound 0),
  for every tensor type in the model file and, from random blocks in a GGUF
  this test writes, for every type specd reads (Q5_K appears in no file here);
- an unsupported quantization type and a truncated K-quant block are one
  clear error each;
- Gemma 3's first-position logits match an independent numpy forward of the
  same GGUF (tests/py/reference_gemma3.py) at the default model's tolerance.

Environment: SPECD_BIN and SPECD_HOME, as in specd_paths.py.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import reference_gemma3  # noqa: E402
from compare import (  # noqa: E402
    assert_batched_equals_solo, assert_logits_close, assert_same_greedy, mlx_lm_greedy,
)
from specd_paths import GEMMA  # noqa: E402
from specd_paths import run as specd  # noqa: E402

# As tests/py/test_foundation.py (float32 against float64 on the same weights).
LOGITS_ATOL = 1e-3
NEAR_TIE = 0.01




def kernel_weights(gguf_file: Path, tensor: str, cols: int, tmp: Path, rows: int | None = None) -> np.ndarray:
    out = tmp / f"{tensor}.f32"
    args = ["debug", "weights", "--gguf", gguf_file, "--tensor", tensor, "--out", out]
    if rows is not None:
        args += ["--rows", rows]
    p = specd(*args)
    assert p.returncode == 0, p.stderr
    print(p.stderr.strip())
    return np.fromfile(out, dtype="<f4").reshape(-1, cols)


def gguf_weights(t, rows: int | None = None) -> np.ndarray:
    cols = int(t.shape[0])
    data = t.data if rows is None else t.data[:rows]
    return quants.dequantize(data, t.tensor_type).reshape(-1, cols)


def test_kernel_weights_of_the_model_equal_gguf_dequantization(gemma_path, tmp_path):
    r = gguf.GGUFReader(str(gemma_path))
    by_type: dict = {}
    for t in r.tensors:
        if len(t.shape) == 2:
            by_type.setdefault(t.tensor_type, t)
    assert {T.Q4_K, T.Q5_0, T.Q6_K, T.Q8_0} <= set(by_type), sorted(k.name for k in by_type)
    for kind, t in by_type.items():
        rows = 1024 if t.name == "token_embd.weight" else None
        want = gguf_weights(t, rows)
        got = kernel_weights(gemma_path, t.name, int(t.shape[0]), tmp_path, rows)
        assert got.shape == want.shape, (t.name, got.shape, want.shape)
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max()
        print(f"{t.name} ({kind.name}): max |diff| {diff}")
        assert diff == 0.0, f"{t.name} ({kind.name}): max |diff| {diff}"


# Block layouts: bytes per block, and the offsets of float16 fields (set to
# finite values; random bytes there could be inf or NaN).
BLOCKS = {
    T.Q4_0: (18, [0]),
    T.Q4_1: (20, [0, 2]),
    T.Q5_0: (22, [0]),
    T.Q8_0: (34, [0]),
    T.Q4_K: (144, [0, 2]),
    T.Q5_K: (176, [0, 2]),
    T.Q6_K: (210, [208]),
}


def random_blocks(kind, rows: int, cols: int, rng) -> np.ndarray:
    size, halves = BLOCKS[kind]
    per_block = 256 if kind in (T.Q4_K, T.Q5_K, T.Q6_K) else 32
    n = rows * cols // per_block
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in halves:
        # Normal and subnormal magnitudes, both signs.
        h = (rng.uniform(-1, 1, n) * 10.0 ** rng.uniform(-7, -1, n)).astype("<f2")
        b[:, off : off + 2] = h.view(np.uint8).reshape(n, 2)
    return b.reshape(rows, -1)


def write_gguf(path: Path, tensors: dict) -> None:
    w = gguf.GGUFWriter(str(path), "test")
    for name, (kind, data) in tensors.items():
        w.add_tensor(name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_every_block_type_from_random_blocks_equals_gguf_dequantization(tmp_path):
    rng = np.random.default_rng(7)
    rows, cols = 48, 512
    tensors = {f"t_{k.name.lower()}.weight": (k, random_blocks(k, rows, cols, rng)) for k in BLOCKS}
    path = tmp_path / "blocks.gguf"
    write_gguf(path, tensors)
    for name, (kind, data) in tensors.items():
        want = quants.dequantize(data, kind).reshape(rows, cols)
        got = kernel_weights(path, name, cols, tmp_path)
        assert np.array_equal(got, want.astype(np.float32)), (
            f"{kind.name}: max |diff| {np.abs(got - want).max()}"
        )


def one_error(p: subprocess.CompletedProcess) -> str:
    assert p.returncode != 0
    assert "panicked" not in p.stderr, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_unsupported_type_and_truncated_block_are_one_clear_error(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "q2k.gguf"
    q2k = rng.integers(0, 256, size=(2, 84), dtype=np.uint8)
    write_gguf(path, {"w.weight": (T.Q2_K, q2k)})
    err = one_error(specd("debug", "weights", "--gguf", path, "--tensor", "w.weight", "--out", tmp_path / "o"))
    assert "q2_K" in err and "w.weight" in err and "not supported" in err, err

    path = tmp_path / "truncated.gguf"
    write_gguf(path, {"w.weight": (T.Q6_K, random_blocks(T.Q6_K, 4, 256, rng))})
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-100])
    err = one_error(specd("debug", "weights", "--gguf", cut, "--tensor", "w.weight", "--out", tmp_path / "o"))
    assert "truncated" in err and "w.weight" in err, err
    # The model loader says the same.
    err = one_error(specd("debug", "logits", "--model", cut, "--ids", "1", "--json", tmp_path / "l.json"))
    assert "truncated" in err, err


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
def test_gemma_first_position_logits_match_numpy_reference(gemma_path, tmp_path, kernels):
    """Both paths: on the portable one (`--kernels mlx`) the Q6_K tensors,
    whose groups of 16 MLX's quantized matmul does not take, are dequantized."""
    out = tmp_path / "logits.json"
    p = specd("debug", "logits", "--kernels", kernels, "--model", gemma_path, "--json", out, "The capital of France is")
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    ids, got = d["prompt_ids"], np.asarray(d["logits"], dtype=np.float64)
    assert ids[0] == 2 and len(ids) > 3, ids  # <bos> first
    want = reference_gemma3.Gemma3Reference(str(gemma_path)).logits(ids)[-1]
    assert got.shape == (262144,)
    assert_logits_close("gemma3", ids, got, want, LOGITS_ATOL, NEAR_TIE)


# ---------------------------------------------------------------------------
# mlx-lm (its gemma3_text) on `specd convert` output vs specd on the GGUF

GREEDY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The history of the printing press",
    "Once upon a time, in a small village by the sea,",
]
GREEDY_TOKENS = 24
GEMMA_EOS = {1, 106}  # <eos>, <end_of_turn>


@pytest.fixture(scope="module")
def mlx_lm_gemma(gemma_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma-converted")
    p = specd("convert", gemma_path, d)
    assert p.returncode == 0, p.stderr
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["model_type"] == "gemma3_text", cfg
    import mlx.core as mx
    from mlx_lm import load

    mx.set_default_device(mx.cpu)
    return load(str(d))


# specd's kernels on every prompt, the portable path on one.
GEMMA_RUNS = [("specd", t) for t in GREEDY_PROMPTS] + [("mlx", GREEDY_PROMPTS[1])]


@pytest.mark.parametrize("kernels,text", GEMMA_RUNS,
                         ids=[f"{k}-p{GREEDY_PROMPTS.index(t)}" for k, t in GEMMA_RUNS])
def test_mlx_lm_on_converted_gemma_matches_specd_greedy(gemma_path, mlx_lm_gemma, tmp_path, kernels, text):
    model, tokenizer = mlx_lm_gemma
    out = tmp_path / "gen.json"
    p = specd("debug", "generate", "--kernels", kernels, "--model", gemma_path, "--max-tokens", GREEDY_TOKENS,
              "--json", out, text)
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    prompt_ids, specd_ids = d["prompt_ids"], d["generated_ids"]
    assert list(tokenizer.encode(text)) == prompt_ids, "the converted tokenizer encodes the prompt differently"
    mlx_ids, margins = mlx_lm_greedy(model, prompt_ids, GREEDY_TOKENS, GEMMA_EOS)
    assert_same_greedy(mlx_ids, margins, specd_ids, NEAR_TIE)


# Gemma requests in one server: different drafters, schedules, a seeded
# sampled one (no drafter, so its rounds are those of its solo run).
GEMMA_MIX = [
    ("The capital of France is", {"num_predict": 16, "drafter": "none"}),
    ("def fibonacci(n):\n    ", {"num_predict": 20, "drafter": "ngram", "schedule": "throughput"}),
    ("red green blue red green blue red green", {"num_predict": 18, "drafter": "ngram",
                                                  "schedule": "constant", "schedule_config": {"k": 3}}),
    ("Once upon a time", {"num_predict": 14, "temperature": 0.8, "seed": 5, "drafter": "none"}),
]


def test_gemma_requests_share_steps_and_keep_their_solo_tokens(start_server, gemma_path):
    """Gemma 3's layers (sliding-window attention, q/k norms) run in the
    continuous-batching step: concurrent requests share steps and each gets
    exactly its solo tokens."""
    server = start_server("--model", GEMMA)
    assert_batched_equals_solo(server.url, GEMMA, GEMMA_MIX, need=len(GEMMA_MIX), timeout=600)
