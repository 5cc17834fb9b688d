"""The portable path, `--kernels mlx`: MLX's own ops only (quantized matmul
on MLX's layout, fast:: norms, rope and attention), the path CUDA and Metal
builds run, here on the CPU.

- its logits match specd's kernels within PORTABLE_ATOL on both families
  (the numpy references and mlx-lm's greedy text are checked in
  test_foundation.py and test_gemma.py, parametrized by kernels);
- batching, every drafter, prefix reuse, structured output, logprobs and a
  rotating cache past its window (a tiny random Mistral with a 16-token
  window: MLX's CPU quantized matmul is slow) run on it and keep the promise
  of docs/portable.md: greedy speculation gives plain decoding's tokens, or
  first differs where plain decoding's top-2 margin is a near-tie (< 0.01);
- it builds none of specd's own kernel ops (the server's
  specd_own_kernel_ops gauge stays 0), so it cannot quietly use them.
"""
from __future__ import annotations

import json
import re
import threading

import httpx
import numpy as np
import pytest

from specd_paths import GEMMA, MODEL, model_path, run

NEAR_TIE = 0.01
# Largest |logit difference| between the two paths over every position of a
# prompt (measured 1.6e-4 on smollm2 and 4.5e-5 on Gemma: docs/portable.md;
# Gemma's Q6_K tensors, groups of 16 that MLX's quantized matmul does not
# take, are dequantized to their exact values on the portable path).
PORTABLE_ATOL = 1e-3
PROMPT = "The history of the printing press begins in"


def logits_all(model: str, kernels: str, tmp_path, text: str = PROMPT) -> tuple[list, np.ndarray]:
    out = tmp_path / f"logits-{kernels}.json"
    p = run("debug", "logits", "--kernels", kernels, "--model", model, "--all", "--json", out, text)
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    return d["prompt_ids"], np.asarray(d["logits"], dtype=np.float64)


@pytest.mark.parametrize("model", [MODEL, GEMMA])
def test_portable_logits_match_specd_kernels(model, tmp_path):
    ids, mine = logits_all(model, "specd", tmp_path)
    ids2, theirs = logits_all(model, "mlx", tmp_path)
    assert ids == ids2 and mine.shape == theirs.shape and mine.shape[0] == len(ids)
    assert np.all(np.isfinite(theirs))
    diff = np.abs(mine - theirs)
    print(f"{model}: {len(ids)} positions, max |diff| {diff.max():.3g}, mean {diff.mean():.3g}")
    assert diff.max() < PORTABLE_ATOL, f"max |logit diff| {diff.max():.3g}"
    assert diff.max() > 0, "the two paths gave identical logits: is --kernels mlx taking effect?"
    for row, (a, b) in enumerate(zip(mine, theirs)):
        top2 = np.sort(a)[-2:]
        if a.argmax() != b.argmax():
            assert top2[1] - top2[0] < NEAR_TIE, f"position {row}: argmax differs, margin {top2[1] - top2[0]}"


@pytest.mark.parametrize("flags,words", [
    (["--kernels", "mlx", "--weights", "int8"], ["int8", "--kernels specd"]),
    (["--kernels", "mlx", "--kv-f16", "on"], ["kv-f16", "--kernels specd"]),
    (["--kernels", "cuda"], ["cuda", "specd or mlx"]),
])
def test_bad_kernel_choices_are_one_clear_error(flags, words):
    p = run(*flags, "generate", "--max-tokens", "1", "hi")
    err = p.stderr.strip()
    assert p.returncode != 0 and "panicked" not in err, err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for w in words:
        assert w in err, (w, err)


def metrics(server) -> str:
    r = httpx.get(server.url + "/metrics", timeout=30)
    assert r.status_code == 200
    return r.text


def gauge(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} is not in /metrics"
    return float(m.group(1))


def complete(server, model: str, prompt: str, n: int, **extra) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 2, **extra}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def assert_promise(plain: dict, spec: dict, what: str) -> None:
    """Speculation's tokens are plain decoding's, or first differ where
    plain decoding's top-2 margin (its logprobs' top two: the log-softmax
    shift cancels) is a near-tie; from there on the texts may part."""
    a = plain["choices"][0]["logprobs"]
    b = spec["choices"][0]["logprobs"]["tokens"]
    first = next((i for i, (x, y) in enumerate(zip(a["tokens"], b)) if x != y), None)
    if first is None:
        assert len(a["tokens"]) == len(b) or spec["choices"][0]["finish_reason"] == "stop", what
        return
    top = sorted(a["top_logprobs"][first].values(), reverse=True)
    margin = top[0] - top[1]
    print(f"{what}: first difference at {first}, plain's margin {margin:.5f}")
    assert margin < NEAR_TIE, f"{what}: differs from plain decoding at {first} where the margin is {margin:.4f}"


GROUNDED = (
    "Copy the list exactly.\nList: apples, pears, plums, cherries, grapes, lemons, limes.\n"
    "Copy: apples, pears, plums,"
)
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
RUNS = [
    (GROUNDED, {"drafter": "ngram"}),
    (GROUNDED, {"drafter": "suffix", "schedule": "throughput"}),
    (CODE, {"drafter": "ngram", "schedule": "constant", "schedule_config": {"k": 4}}),
    (CODE, {"drafter": "self:8"}),
    (GROUNDED, {"drafter": "model:twin", "schedule": "constant", "schedule_config": {"k": 3}}),
    ("The capital of France is", {"drafter": "none"}),
]


def test_portable_server_batches_speculates_and_builds_no_kernel_op(start_server):
    server = start_server("--kernels", "mlx", "--draft-model", f"twin={model_path(MODEL)}")
    text = metrics(server)
    assert 'specd_kernels_info{kernels="mlx"} 1' in text, text[-2000:]
    n = 16
    plain = {p: complete(server, MODEL, p, n, drafter="none") for p in {p for p, _ in RUNS}}
    # Every run at once: they share steps (verify rows beside decode rows),
    # and the prompts are in the prefix cache from the plain runs.
    got: list = [None] * len(RUNS)
    barrier = threading.Barrier(len(RUNS))

    def go(i: int) -> None:
        barrier.wait()
        prompt, extra = RUNS[i]
        got[i] = complete(server, MODEL, prompt, n, **extra)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(RUNS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    drafted = 0
    for (prompt, extra), r in zip(RUNS, got):
        assert r is not None, extra
        s = r["speculation"]
        assert s["policy_failure"] is None and "near_ties" in s, s
        drafted += s["drafted"]
        assert_promise(plain[prompt], r, json.dumps(extra))
    assert drafted > 0, "no run drafted anything"
    assert max(r["speculation"]["batch_steps"] for r in got) > 0, "no request shared a step"
    assert max(r["speculation"]["cached_tokens"] for r in got) > 0, "no request reused a cached prefix"

    # Structured output and logprobs on the portable path.
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
              "required": ["city", "year"], "additionalProperties": False}
    r = httpx.post(server.url + "/v1/chat/completions", timeout=600, json={
        "model": MODEL, "temperature": 0, "max_tokens": 48, "logprobs": True, "top_logprobs": 2,
        "messages": [{"role": "user", "content": "Where and when was the printing press invented?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        "drafter": "ngram"})
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    answer = json.loads(c["message"]["content"])
    assert set(answer) == {"city", "year"} and isinstance(answer["year"], int), answer
    assert c["logprobs"]["content"] and all(e["logprob"] <= 0 for e in c["logprobs"]["content"])

    # None of that built one of specd's own kernel ops.
    assert gauge(metrics(server), "specd_own_kernel_ops") == 0


def test_portable_gemma_speculates_and_batches(start_server):
    """Gemma 3 (q/k norms, GeGLU, local and global layers) on the portable
    path: speculative runs, alone and two at once, keep the promise."""
    server = start_server("--model", GEMMA, "--kernels", "mlx")
    prompt = "red green blue red green blue red green blue red green blue red"
    n = 16
    plain = complete(server, GEMMA, prompt, n, drafter="none")
    both: list = [None, None]

    def go(i: int) -> None:
        both[i] = complete(server, GEMMA, prompt, n, drafter=["ngram", "suffix"][i])

    ts = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=900)
    for r, what in zip(both, ["ngram", "suffix"]):
        assert r is not None, what
        assert_promise(plain, r, f"gemma {what}")
    assert sum(r["speculation"]["drafted"] for r in both) > 0
    assert gauge(metrics(server), "specd_own_kernel_ops") == 0


WINDOW = 16


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """A tiny random Mistral whose layers attend through a 16-token window
    (a rotating cache), 4-bit groups of 64 as mlx-community's."""
    import hf_checkpoints

    d = tmp_path_factory.mktemp("windowed") / "mistral-w16"
    return hf_checkpoints.write_checkpoint(d, "mistral", quantize=dict(group_size=64, bits=4),
                                           sliding_window=WINDOW)


def generate(model, kernels: str, drafter: str, tmp_path, n: int = 48) -> tuple[str, dict]:
    stats = tmp_path / f"{kernels}-{drafter}.json"
    p = run("generate", "--kernels", kernels, "--model", model, "--max-tokens", n, "--drafter", drafter,
            "--stats-json", stats, "The quick brown fox jumps over the lazy dog and runs away")
    assert p.returncode == 0, p.stderr
    return p.stdout, json.loads(stats.read_text())


@pytest.mark.parametrize("drafter", ["ngram", "self:1", "suffix"])
def test_portable_rotating_cache_rolls_back_past_its_window(windowed, tmp_path, drafter):
    """Past the window the rotating cache overwrites its oldest rows, and a
    rejected draft must restore them: speculative tokens equal plain ones
    (the random weights' top-2 margins are whole units, so no near-ties),
    and the portable path's tokens equal specd's kernels'."""
    plain, _ = generate(windowed, "mlx", "none", tmp_path)
    spec, st = generate(windowed, "mlx", drafter, tmp_path)
    print(f"{drafter}: {st['rounds']} rounds, {st['drafted']} drafted, {st['accepted']} accepted")
    assert st["prompt_tokens"] + st["generated_tokens"] > 3 * WINDOW, st
    assert st["drafted"] > 0 and st["drafted"] > st["accepted"], "no draft was rejected: rollback untested"
    assert spec == plain
    own, _ = generate(windowed, "specd", "none", tmp_path)
    assert own == plain


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
def test_windowed_model_matches_mlx_lm_past_its_window(windowed, tmp_path, kernels):
    """Each position attends to the last WINDOW tokens, itself included, as
    Hugging Face's Mistral and mlx-lm's RotatingKVCache do (specd's llama
    path once saw one more past the window): greedy tokens equal mlx-lm's
    with every layer sliding."""
    import hf_checkpoints
    from compare import mlx_lm_greedy

    model = hf_checkpoints.load_mlx(windowed)
    # mlx-lm's llama takes the window from `layer_types`, which also needs
    # a full-attention layer to build: every layer made sliding afterwards.
    for layer in model.model.layers:
        layer.use_sliding = True
    model.model.swa_idx = 0
    out = tmp_path / "gen.json"
    p = run("debug", "generate", "--kernels", kernels, "--model", windowed, "--max-tokens", 48,
            "--json", out, "The quick brown fox jumps over the lazy dog and runs away")
    assert p.returncode == 0, p.stderr
    got = json.loads(out.read_text())
    assert len(got["prompt_ids"]) + 48 > 3 * WINDOW
    want, margins = mlx_lm_greedy(model, got["prompt_ids"], 48)
    print(f"min top-2 margin {min(margins):.4f}")
    assert got["generated_ids"] == want

