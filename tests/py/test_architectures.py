"""Llama 3.x rope scaling, Qwen2/Qwen3 GGUFs and Gemma 3 HF directories,
against references.

Each model is a tiny random checkpoint that hf_checkpoints.py writes with
mlx-lm's own model classes; gguf_checkpoints.py writes the same weights as
an F32 GGUF the way llama.cpp's converter would (names, q/k permutation for
llama only, Llama 3's `rope_freqs.weight`).

- Llama 3 scaling (`rope_scaling: llama3`, factors that bite from position
  ~5 on): every position's logits against mlx-lm's llama (float32 and MLX
  4-bit, both kernel paths) within 1e-4 x the logit range; the GGUF with
  `rope_freqs.weight` against llama.cpp (llama-cpp-python, all logits, F32
  KV cache) within 1e-3 x the range, and against the HF directory. The
  same references without the scaling differ far beyond those bounds, so a
  loader that ignores it fails here.
- Qwen2 (q/k/v biases), Qwen3 (q/k norms, its own head size) and Phi-3
  (fused q/k/v and gate/up, split at load) as GGUF: the same logits as
  their HF directories (which match mlx-lm) and as llama.cpp on the file.
- Gemma 3 from a `gemma3_text` config.json (what `specd convert` writes):
  against mlx-lm's gemma3_text.
- Greedy with `--drafter ngram` and `self:1` equals plain decoding on each;
  concurrent requests share batched steps and keep their solo tokens.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gguf_checkpoints  # noqa: E402
import hf_checkpoints  # noqa: E402
from compare import assert_batched_equals_solo  # noqa: E402
from test_foundation import run_specd  # noqa: E402

MLX_TOL = 1e-4  # x the logit range, as test_hf_models.py
LLAMA_CPP_TOL = 1e-3  # x the logit range: another engine's float32 arithmetic
# Prompt ids: no special tokens (ids 0..2), 96 positions (the llama3
# factors change the rotation from position ~5 on).
IDS = [3 + (i * 37 + 11) % (hf_checkpoints.VOCAB - 3) for i in range(96)]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("archs")
    w = hf_checkpoints.write_checkpoint
    out = {
        "llama3": w(root / "llama3", "llama3"),
        "llama3-4bit": w(root / "llama3-4bit", "llama3", quantize=dict(group_size=64, bits=4)),
        "qwen2": w(root / "qwen2", "qwen2"),
        "qwen3": w(root / "qwen3", "qwen3"),
        "gemma3": w(root / "gemma3", "gemma3"),
        "phi3": w(root / "phi3", "phi3"),
        # Six layers, a window of 16: the prompt crosses it; llama.cpp's
        # Gemma 3 pattern (every 6th layer global).
        # (Hidden 64: sqrt(64) = 8 is Gemma's embedding scale in float32,
        # as llama.cpp has it, and in bfloat16, as mlx-lm and HF do.)
        "gemma3-swa": w(root / "gemma3-swa", "gemma3", num_hidden_layers=6, sliding_window=16,
                        sliding_window_pattern=6, hidden_size=64),
    }
    g = gguf_checkpoints.write_gguf
    out["llama3.gguf"] = g(out["llama3"], root / "llama3.gguf")
    out["llama3-unscaled.gguf"] = g(out["llama3"], root / "llama3-unscaled.gguf", rope_freqs=False)
    out["qwen2.gguf"] = g(out["qwen2"], root / "qwen2.gguf", pre="qwen2")
    out["qwen3.gguf"] = g(out["qwen3"], root / "qwen3.gguf", pre="qwen2")
    out["phi3.gguf"] = g(out["phi3"], root / "phi3.gguf")
    out["gemma3-swa.gguf"] = g(out["gemma3-swa"], root / "gemma3-swa.gguf")
    return out


def specd_logits(model: Path, tmp_path: Path, kernels: str = "specd") -> np.ndarray:
    out = tmp_path / f"{model.name}-{kernels}.json"
    run_specd("debug", "logits", "--kernels", kernels, "--model", model, "--all", "--ids",
              ",".join(map(str, IDS)), "--json", out, check=True)
    got = json.loads(out.read_text())
    assert got["prompt_ids"] == IDS
    return np.asarray(got["logits"], dtype=np.float64)


def mlx_logits(d: Path, **config_changes) -> np.ndarray:
    """mlx-lm's logits of checkpoint `d` (float32), config.json changed as given."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    mx.set_default_device(mx.cpu)
    model, _ = load_model(Path(d), model_config=config_changes)
    model.set_dtype(mx.float32)
    out = model(mx.array(IDS)[None])[0].astype(mx.float32)
    mx.eval(out)
    return np.array(out, dtype=np.float64)


def rel_diff(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape == (len(IDS), hf_checkpoints.VOCAB), (got.shape, want.shape)
    return float(np.abs(got - want).max() / (want.max() - want.min()))


def assert_close(name: str, got: np.ndarray, want: np.ndarray, tol: float) -> None:
    r = rel_diff(got, want)
    print(f"{name}: max |diff| / range = {r:.3g} (bound {tol})")
    assert r < tol, f"{name}: max |logit diff| is {r:.3g} of the range, bound {tol}"
    assert (got.argmax(-1) == want.argmax(-1)).all(), name


# ---------------------------------------------------------------------------
# Llama 3.x rope scaling


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
@pytest.mark.parametrize("name", ["llama3", "llama3-4bit"])
def test_llama3_scaling_matches_mlx_lm(models, tmp_path, name, kernels):
    got = specd_logits(models[name], tmp_path, kernels)
    want = mlx_logits(models[name])
    assert_close(f"{name} ({kernels})", got, want, MLX_TOL)
    # mlx-lm without the scaling: far off, so ignoring it fails above.
    unscaled = mlx_logits(models[name], rope_scaling=None)
    r = rel_diff(unscaled, want)
    print(f"{name}: unscaled rope differs by {r:.3g} of the range")
    assert r > 30 * MLX_TOL, r
    assert rel_diff(got, unscaled) > 30 * MLX_TOL


def test_llama3_gguf_rope_freqs_match_llama_cpp(models, tmp_path):
    path = models["llama3.gguf"]
    got = specd_logits(path, tmp_path)
    want = gguf_checkpoints.llama_cpp_logits(path, IDS)
    assert_close("llama3 GGUF vs llama.cpp", got, want, LLAMA_CPP_TOL)
    # The GGUF (permuted q/k, rope_freqs) is the HF directory's model.
    assert_close("llama3 GGUF vs HF dir", got, specd_logits(models["llama3"], tmp_path), MLX_TOL)
    # llama.cpp without rope_freqs: far off, so a loader ignoring the
    # tensor fails above; specd follows the file either way.
    unscaled = gguf_checkpoints.llama_cpp_logits(models["llama3-unscaled.gguf"], IDS)
    r = rel_diff(unscaled, want)
    print(f"llama.cpp with and without rope_freqs: {r:.3g} of the range apart")
    assert r > 30 * LLAMA_CPP_TOL, r
    assert_close("unscaled GGUF vs llama.cpp", specd_logits(models["llama3-unscaled.gguf"], tmp_path),
                 unscaled, LLAMA_CPP_TOL)


# ---------------------------------------------------------------------------
# Qwen2 / Qwen3 / Phi-3 GGUFs


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "phi3"])
def test_gguf_matches_hf_dir_and_llama_cpp(models, tmp_path, name):
    path = models[f"{name}.gguf"]
    got = specd_logits(path, tmp_path)
    hf = specd_logits(models[name], tmp_path)
    assert_close(f"{name} HF dir vs mlx-lm", hf, mlx_logits(models[name]), MLX_TOL)
    assert_close(f"{name} GGUF vs HF dir", got, hf, MLX_TOL)
    assert_close(f"{name} GGUF vs llama.cpp", got, gguf_checkpoints.llama_cpp_logits(path, IDS), LLAMA_CPP_TOL)


# ---------------------------------------------------------------------------
# Gemma 3 from a Hugging Face directory


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
def test_gemma3_hf_dir_matches_mlx_lm(models, tmp_path, kernels):
    d = models["gemma3"]
    assert json.loads((d / "config.json").read_text())["model_type"] == "gemma3_text"
    assert_close(f"gemma3 ({kernels})", specd_logits(d, tmp_path, kernels), mlx_logits(d), MLX_TOL)


def test_gemma3_window_crossing_matches_mlx_lm_and_llama_cpp(models, tmp_path):
    """96 positions through a window of 16 on five local layers of six: the
    HF directory against mlx-lm's gemma3_text (its window mask), the same
    weights as a GGUF against the directory and against llama.cpp."""
    d, path = models["gemma3-swa"], models["gemma3-swa.gguf"]
    hf = specd_logits(d, tmp_path)
    assert_close("gemma3 window HF vs mlx-lm", hf, mlx_logits(d), MLX_TOL)
    # Without the window (all global) the logits differ: the window bites.
    wide = mlx_logits(d, sliding_window=4096)
    assert rel_diff(wide, hf) > 30 * MLX_TOL, rel_diff(wide, hf)
    got = specd_logits(path, tmp_path)
    assert_close("gemma3 window GGUF vs HF dir", got, hf, MLX_TOL)
    # 3x the bound of the SwiGLU models (which agree with llama.cpp to
    # ~4e-7): ggml's CPU GELU looks its result up in a float16 table, so
    # Gemma's GeGLU rounds there to ~1e-3. The gap (1.6e-3 of the range at
    # most) is there from position 0 on, before the window cuts.
    assert_close("gemma3 window GGUF vs llama.cpp", got, gguf_checkpoints.llama_cpp_logits(path, IDS),
                 3 * LLAMA_CPP_TOL)


# ---------------------------------------------------------------------------
# Mistral: a window on every layer


def mlx_lm_windowed_llama(d: Path) -> np.ndarray:
    """mlx-lm's llama with every layer windowed at the config's
    `sliding_window`: it windows only layers that `layer_types` names
    `sliding_attention` and needs one `full_attention` entry to build, so
    the last layer is built full and then switched to the window mask."""
    import mlx.core as mx
    from mlx_lm.utils import load_model

    mx.set_default_device(mx.cpu)
    cfg = json.loads((d / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    types = ["sliding_attention"] * (n - 1) + ["full_attention"]
    model, _ = load_model(Path(d), model_config={"layer_types": types})
    model.model.layers[-1].use_sliding = True
    model.set_dtype(mx.float32)
    out = model(mx.array(IDS)[None])[0].astype(mx.float32)
    mx.eval(out)
    return np.array(out, dtype=np.float64)


def test_mistral_window_crossing_matches_mlx_lm_and_gguf_follows_llama_cpp(tmp_path):
    """A Mistral directory (`sliding_window` 16, every layer) over 96
    positions: specd against mlx-lm's llama with every layer windowed, on
    both kernel paths, float32 and 4-bit; without the window the logits move far more. A
    `llama` GGUF has no window key that llama.cpp reads (its llama graph
    attends to the whole context), so the same weights as a GGUF run
    without one in specd too, as in llama.cpp."""
    d = hf_checkpoints.write_checkpoint(tmp_path / "mistral-swa", "mistral", sliding_window=16)
    want = mlx_lm_windowed_llama(d)
    for kernels in ["specd", "mlx"]:
        assert_close(f"mistral window ({kernels}) vs mlx-lm", specd_logits(d, tmp_path, kernels),
                     want, MLX_TOL)
    wide = mlx_logits(d)  # mlx-lm's llama without layer_types: no window
    print(f"mistral: the window moves mlx-lm's logits by {rel_diff(wide, want):.3g} of the range")
    assert rel_diff(wide, want) > 30 * MLX_TOL, rel_diff(wide, want)
    # 4-bit: specd's windowed kernels (float32 runs on MLX's ops).
    q = hf_checkpoints.write_checkpoint(tmp_path / "mistral-swa-4bit", "mistral", sliding_window=16,
                                        quantize=dict(group_size=64, bits=4))
    assert_close("mistral window 4-bit vs mlx-lm", specd_logits(q, tmp_path),
                 mlx_lm_windowed_llama(q), MLX_TOL)
    path = gguf_checkpoints.write_gguf(d, tmp_path / "mistral.gguf")
    got = specd_logits(path, tmp_path)
    assert_close("mistral GGUF vs llama.cpp", got, gguf_checkpoints.llama_cpp_logits(path, IDS),
                 LLAMA_CPP_TOL)
    assert_close("mistral GGUF vs mlx-lm without a window", got, wide, MLX_TOL)


# ---------------------------------------------------------------------------
# speculation keeps the tokens


@pytest.mark.parametrize("name", ["llama3-4bit", "qwen2.gguf", "qwen3.gguf", "phi3.gguf", "gemma3"])
def test_greedy_speculation_equals_plain(models, tmp_path, name):
    assert_greedy_speculation_is_plain(models[name], tmp_path, name)


def assert_greedy_speculation_is_plain(model: Path, tmp_path: Path, name: str) -> None:
    """Greedy with `--drafter ngram` and `self:1` gives plain decoding's 48
    tokens, and each drafted something (shared by every architecture's file)."""
    runs = {}
    for dr in ["none", "ngram", "self:1"]:
        stats = tmp_path / f"{dr}.json"
        p = run_specd("generate", "--model", model, "--max-tokens", 48, "--drafter", dr,
                      "--stats-json", stats, "the fox and the dog and the fox and the", check=True)
        runs[dr] = (p.stdout, json.loads(stats.read_text()))
    plain = runs["none"][0]
    for dr in ["ngram", "self:1"]:
        spec, st = runs[dr]
        print(f"{name} {dr}: {st['drafted']} drafted, {st['accepted']} accepted")
        assert st["generated_tokens"] == 48, st
        assert st["drafted"] > 0, st
        assert spec == plain, dr


# ---------------------------------------------------------------------------
# random checkpoints of every architecture (`specd debug random-model`)


@pytest.mark.parametrize("arch", ["llama", "llama3", "qwen2", "qwen3", "phi3"])
def test_random_gguf_runs_in_specd_and_llama_cpp(tmp_path, arch):
    """`random-model --gguf` writes what llama.cpp reads as this
    architecture (Q4_1 weights, Q8_0 embedding, the tokenizer in the
    metadata), and both engines compute the same model: within 3% of the
    logit range (llama.cpp's Q4_1 matmuls round the activations to 8 bits,
    specd's do not). The HF directory of the same family runs in specd.
    (Gemma 3 is left out: the tiny shape's 2 layers hold no global layer,
    which llama.cpp's Gemma 3 graph does not handle.)"""
    assert_random_checkpoint(arch, tmp_path)


def assert_random_checkpoint(arch: str, tmp_path: Path, shape: str | None = None,
                             against_mlx_lm: bool = False) -> None:
    """`random-model --arch ARCH [--shape S] --gguf` (Q4_1, Q8_0 embedding)
    is what llama.cpp reads as that architecture: the two engines within 3%
    of the logit range (llama.cpp's Q4_1 matmuls round the activations to 8
    bits, specd's do not), the same argmax at more than 80% of positions.
    The HF directory of the same checkpoint runs in specd; with
    `against_mlx_lm`, its logits are mlx-lm's within MLX_TOL and its greedy
    tokens equal (shared by every architecture's file)."""
    d, path = tmp_path / arch, tmp_path / f"{arch}.gguf"
    shaped = ["--shape", shape] if shape else []
    run_specd("debug", "random-model", "--arch", arch, *shaped, "--gguf", "--out", path, check=True)
    run_specd("debug", "random-model", "--arch", arch, *shaped, "--out", d, check=True)
    def rel(got, want):  # rel_diff without its vocabulary check: shapes have their own
        return float(np.abs(got - want).max() / (want.max() - want.min()))

    got = specd_logits(path, tmp_path)
    want = gguf_checkpoints.llama_cpp_logits(path, IDS)
    r = rel(got, want)
    agree = (got.argmax(-1) == want.argmax(-1)).mean()
    print(f"random {arch} GGUF: specd vs llama.cpp {r:.3g} of the range, argmax agrees at {agree:.0%}")
    assert r < 3e-2 and agree > 0.8, (r, agree)
    hf = specd_logits(d, tmp_path)
    assert hf.shape == got.shape
    if against_mlx_lm:
        want = mlx_logits(d)
        r = rel(hf, want)
        print(f"random {arch} dir: specd vs mlx-lm {r:.3g} of the range")
        assert r < MLX_TOL and (hf.argmax(-1) == want.argmax(-1)).all(), r


MIX = [
    ("the fox and the dog and the fox and the", {"num_predict": 24, "drafter": "none"}),
    ("red green blue red green blue red green", {"num_predict": 20, "drafter": "ngram"}),
    ("once upon a time there was", {"num_predict": 16, "drafter": "self:1"}),
]


@pytest.mark.parametrize("name", ["llama3-4bit", "phi3.gguf", "gemma3-swa"])
def test_requests_share_steps_and_keep_their_solo_tokens(models, start_server, name):
    """The batched step (Llama 3's scaled rope folded into the q/k/v matmul
    at each row's own position; Phi-3's split tensors; Gemma 3's windows)
    gives every request its solo tokens."""
    server = start_server("--model", str(models[name]))
    assert_batched_equals_solo(server.url, "default", MIX, need=2)
