"""Qwen2, Qwen3, Mistral (and llama with biases) from Hugging Face directories, against mlx-lm.

No checkpoint of these families can be downloaded here, so each test model
is a tiny one with random weights that `hf_checkpoints.py` writes with
mlx-lm's own model classes (and a llama with `attention_bias`) (3 layers, a 512-token byte-level BPE made with
the `tokenizers` package), plus one MLX 4-bit quantized Qwen2 (mlx-lm's
`quantize_model`, bfloat16 scales like mlx-community's) and one Qwen3 with
per-layer quantization (8-bit embedding and head, 4-bit elsewhere).

- every prompt position's logits: max |specd - mlx-lm| below 1e-4 of the
  logit range, and the prompt's token ids equal the `tokenizers` package's
  (also on 13 harder strings);
- 64 greedy tokens equal mlx-lm's (with its KV cache), token for token, the
  Qwen and llama prompts through their ChatML template;
- greedy speculation (ngram, self:1) equals plain decoding, from the CLI, over
  HTTP (with the prefix cache) and in `specd bench spec`;
- bad models are one clear error: an unknown model_type, a missing tensor,
  a wrong shape, tensors of another architecture, a quantization mode specd
  does not read;
- chat on a model without a chat template is an error (CLI, and HTTP 400),
  while raw completion works.

These tests fail (never skip) when the binary, MLX or mlx-lm is missing.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hf_checkpoints  # noqa: E402
from compare import mlx_lm_greedy  # noqa: E402
from test_foundation import assert_clean_error, run_specd  # noqa: E402

# The bound: max |logit difference| below this fraction of the range.
REL_TOL = 1e-4
GREEDY_TOKENS = 64

# name -> (architecture, mlx-lm quantize_model arguments or None)
MODELS = {
    "qwen2": ("qwen2", None),
    "qwen3": ("qwen3", None),
    "mistral": ("mistral", None),
    "llama-bias": ("llama-bias", None),
    "qwen2-4bit": ("qwen2", dict(group_size=64, bits=4)),
    "qwen3-mixed": ("qwen3", "mixed"),
}

PROMPT = "The quick brown fox, don't stop: 1492 ships sailed west!\n\tCaf\u00e9 \u65e5\u672c 3.14"


def mixed_quantization():
    """mlx-lm per-layer quantization: 8-bit groups of 32 on the embedding
    and head, the default 4-bit groups of 64 elsewhere."""

    def predicate(path, module):
        if path in ("model.embed_tokens", "lm_head"):
            return {"group_size": 32, "bits": 8, "mode": "affine"}
        return True

    return dict(group_size=64, bits=4, quant_predicate=predicate)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    try:
        import mlx.core  # noqa: F401
        import mlx_lm  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as e:  # a failure, not a skip: setup installs them
        pytest.fail(f"mlx / mlx-lm / tokenizers are not importable ({e}): pip install -r tests/py/requirements.txt")
    root = tmp_path_factory.mktemp("hf-models")
    out = {}
    for name, (arch, quant) in MODELS.items():
        if quant == "mixed":
            quant = mixed_quantization()
        out[name] = hf_checkpoints.write_checkpoint(root / name, arch, quantize=quant)
    cfg = json.loads((out["qwen3-mixed"] / "config.json").read_text())
    assert cfg["quantization"]["model.embed_tokens"]["bits"] == 8, cfg["quantization"]
    return out


@pytest.fixture(scope="module")
def mlx_models(checkpoints):
    return {name: hf_checkpoints.load_mlx(d) for name, d in checkpoints.items()}


def tokenize(d: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(d / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def mlx_logits(model, ids) -> np.ndarray:
    import mlx.core as mx

    out = model(mx.array(ids)[None])[0].astype(mx.float32)
    mx.eval(out)
    return np.array(out)


# ---------------------------------------------------------------------------
# logits and greedy tokens against mlx-lm


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
@pytest.mark.parametrize("name", list(MODELS))
def test_logits_match_mlx_lm(checkpoints, mlx_models, tmp_path, name, kernels):
    d = checkpoints[name]
    out = tmp_path / "logits.json"
    run_specd("debug", "logits", "--kernels", kernels, "--model", d, "--all", "--json", out, PROMPT, check=True)
    got = json.loads(out.read_text())
    ids = got["prompt_ids"]
    assert ids == tokenize(d, PROMPT), "specd's tokenizer encodes the prompt unlike the tokenizers package"
    mine = np.asarray(got["logits"], dtype=np.float64)
    want = mlx_logits(mlx_models[name], ids).astype(np.float64)
    assert mine.shape == want.shape == (len(ids), hf_checkpoints.VOCAB), (mine.shape, want.shape)
    diff = np.abs(mine - want).max()
    span = want.max() - want.min()
    top = np.sort(want, axis=-1)[:, -2:]
    print(f"{name}: {len(ids)} positions, max |diff| {diff:.3g}, range {span:.3g} (rel {diff / span:.3g}), "
          f"min top-2 margin {(top[:, 1] - top[:, 0]).min():.3f}")
    assert diff < REL_TOL * span, f"max |logit diff| {diff:.3g} >= {REL_TOL} x range {span:.3g}"
    assert (mine.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_tokens_match_mlx_lm(checkpoints, mlx_models, tmp_path, name, kernels):
    d = checkpoints[name]
    chat = hf_checkpoints.ARCHS[MODELS[name][0]]["chat"] is not None
    text = "Write a story about the quick brown fox."
    out = tmp_path / "gen.json"
    args = ["debug", "generate", "--kernels", kernels, "--model", d, "--max-tokens", GREEDY_TOKENS, "--json", out]
    run_specd(*args, *(["--chat"] if chat else []), text, check=True)
    got = json.loads(out.read_text())
    prompt_ids, mine = got["prompt_ids"], got["generated_ids"]
    # The chat template (ChatML, from tokenizer_config.json) as the
    # tokenizers package encodes its rendering; special tokens are one id.
    rendered = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n" if chat else text
    assert prompt_ids == tokenize(d, rendered)
    want, margins = mlx_lm_greedy(mlx_models[name], prompt_ids, GREEDY_TOKENS)
    print(f"{name}: top-2 margins over {GREEDY_TOKENS} steps: min {min(margins):.3f}, "
          f"median {np.median(margins):.3f}; specd {got['text']!r}")
    # The scaled weights give whole-unit margins, not near-ties everywhere
    # (docs/architecture.md's near-tie is 0.01); the tokens must then agree
    # exactly.
    assert np.median(margins) > 0.1, margins
    assert len(mine) == GREEDY_TOKENS, got
    assert mine == want, f"\nspecd:  {mine}\nmlx-lm: {want}"


TOKENIZER_STRINGS = [
    "Hello world",
    "  leading spaces and  double  spaces",
    "trailing spaces   ",
    "line one\nline two\r\n\n\nthree",
    "tabs\tand\t\tmore",
    "I'M sure you'LL see it's fine, they'd've said",
    "numbers 1234567890 and 3.14159 and -42",
    "x=foo(bar[1], {'k': 2});  // done",
    "na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u00fcber",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002\u4e2d\u6587",
    "emoji \U0001F600\U0001F680 and \u2014 dashes",
    "<|im_start|>user\nhi<|im_end|>",
    "decomposed e\u0301 (NFC makes it \u00e9)",
]


@pytest.mark.parametrize("name", ["qwen2", "mistral"])
def test_token_ids_match_tokenizers_package(checkpoints, tmp_path, name):
    """specd's tokenizer on the byte-level BPE with Qwen2's (or GPT-2's)
    split regex gives the `tokenizers` package's ids, special tokens as one
    id each."""
    d = checkpoints[name]
    for i, text in enumerate(TOKENIZER_STRINGS):
        out = tmp_path / f"{i}.json"
        run_specd("debug", "logits", "--model", d, "--json", out, text, check=True)
        got = json.loads(out.read_text())["prompt_ids"]
        assert got == tokenize(d, text), f"{text!r}"


# ---------------------------------------------------------------------------
# speculation on a quantized Qwen2


@pytest.mark.parametrize("kernels", ["specd", "mlx"])
@pytest.mark.parametrize("drafter", ["ngram", "self:1"])
def test_greedy_speculation_equals_plain(checkpoints, tmp_path, drafter, kernels):
    """On both paths: the random weights' margins are whole units, so the
    portable path's promise (equal, or apart from a near-tie on) is equality."""
    d = checkpoints["qwen2-4bit"]
    runs = {}
    for dr in ["none", drafter]:
        stats = tmp_path / f"{dr}.json"
        p = run_specd("--kernels", kernels, "generate", "--model", d, "--max-tokens", GREEDY_TOKENS, "--drafter", dr,
                      "--stats-json", stats, "The quick brown fox", check=True)
        runs[dr] = (p.stdout, json.loads(stats.read_text()))
    (plain, _), (spec, st) = runs["none"], runs[drafter]
    print(f"{drafter}: {st['rounds']} rounds, {st['drafted']} drafted, {st['accepted']} accepted")
    assert st["generated_tokens"] == GREEDY_TOKENS
    assert st["drafted"] > 0 and st["accepted"] > 0, st
    assert spec == plain


# ---------------------------------------------------------------------------
# bad models: one clear error


def copy_model(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def edit_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


def edit_weights(d: Path, edit) -> None:
    import mlx.core as mx

    w = dict(mx.load(str(d / "model.safetensors")))
    edit(w)
    mx.save_safetensors(str(d / "model.safetensors"), w)


def test_error_unknown_architecture(checkpoints, tmp_path):
    d = copy_model(checkpoints["qwen2"], tmp_path / "m")
    edit_config(d, model_type="gpt_neox")
    p = run_specd("generate", "--model", d, "--max-tokens", "1", "hello")
    assert_clean_error(p, "gpt_neox", "llama", "mistral", "qwen2", "qwen3")


def test_error_missing_tensor(checkpoints, tmp_path):
    d = copy_model(checkpoints["qwen2"], tmp_path / "m")
    edit_weights(d, lambda w: w.pop("model.layers.1.self_attn.k_proj.bias"))
    p = run_specd("generate", "--model", d, "--max-tokens", "1", "hello")
    assert_clean_error(p, "config.json", "model.layers.1.self_attn.k_proj.bias")


def test_error_wrong_shape(checkpoints, tmp_path):
    d = copy_model(checkpoints["mistral"], tmp_path / "m")
    edit_config(d, intermediate_size=384)
    p = run_specd("generate", "--model", d, "--max-tokens", "1", "hello")
    assert_clean_error(p, "config.json", "shape", "384")


def test_error_weights_of_another_architecture(checkpoints, tmp_path):
    """A Qwen3 checkpoint labelled llama would run without its q/k norms."""
    d = copy_model(checkpoints["qwen3"], tmp_path / "m")
    edit_config(d, model_type="llama")
    p = run_specd("generate", "--model", d, "--max-tokens", "1", "hello")
    assert_clean_error(p, "config.json", "unused", "self_attn.k_norm")


def test_error_unsupported_quantization_mode(checkpoints, tmp_path):
    d = copy_model(checkpoints["qwen2-4bit"], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    edit_config(d, quantization={**cfg["quantization"], "mode": "mxfp4"})
    p = run_specd("generate", "--model", d, "--max-tokens", "1", "hello")
    assert_clean_error(p, "mxfp4")


# ---------------------------------------------------------------------------
# chat on a model without a template


def test_chat_without_template_is_an_error(checkpoints):
    d = checkpoints["mistral"]
    p = run_specd("generate", "--model", d, "--chat", "--max-tokens", "4", "hello")
    assert_clean_error(p, "no chat template")
    p = run_specd("generate", "--model", d, "--max-tokens", "4", "hello", check=True)
    assert p.stdout


def test_chat_without_template_is_http_400(checkpoints, start_server):
    srv = start_server("--model", str(checkpoints["mistral"]))
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                   json={"model": "default", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
    assert r.status_code == 400, r.text
    assert "no chat template" in r.text, r.text
    r = httpx.post(srv.url + "/api/generate", timeout=60,
                   json={"model": "default", "prompt": "hello", "stream": False, "options": {"num_predict": 4}})
    assert r.status_code == 400 and "no chat template" in r.text, r.text
    # Completion mode works.
    r = httpx.post(srv.url + "/api/generate", timeout=60,
                   json={"model": "default", "prompt": "hello", "raw": True, "stream": False,
                         "options": {"num_predict": 4}})
    assert r.status_code == 200, r.text
    assert r.json()["eval_count"] == 4, r.json()
    r = httpx.post(srv.url + "/v1/completions", timeout=60,
                   json={"model": "default", "prompt": "hello", "max_tokens": 4})
    assert r.status_code == 200, r.text


def test_server_prefix_cache_and_speculation(checkpoints, start_server):
    """Over HTTP on the quantized Qwen2: the chat template applies, a repeated
    conversation reuses the prefix cache, and speculation gives plain's text."""
    srv = start_server("--model", str(checkpoints["qwen2-4bit"]))

    def chat(drafter):
        r = httpx.post(srv.url + "/api/chat", timeout=120, json={
            "model": "default", "stream": False,
            "messages": [{"role": "user", "content": "Write a story about the quick brown fox."}],
            "options": {"num_predict": 32, "drafter": drafter, "temperature": 0, "repeat_penalty": 1},
        })
        assert r.status_code == 200, r.text
        return r.json()

    first, again, spec = chat("none"), chat("none"), chat("self:1")
    assert first["eval_count"] == 32, first
    assert again["speculation"]["cached_tokens"] > 0, again["speculation"]
    assert again["message"]["content"] == first["message"]["content"]
    assert spec["speculation"]["accepted"] > 0, spec["speculation"]
    assert spec["message"]["content"] == first["message"]["content"]


def test_bench_spec_on_a_model_without_template(checkpoints):
    """`specd bench spec` gives a base model its prompts raw (no chat mode)
    and speculation keeps plain's tokens there too (sliding-window cache)."""
    p = run_specd("bench", "spec", "--model", checkpoints["mistral"], "--drafters", "ngram,self:1",
                  "--schedules", "throughput", "--prompts", "grounded", "--max-tokens", "24", check=True)
    rows = [line.split() for line in p.stdout.splitlines() if line.startswith("grounded")]
    assert len(rows) == 3, p.stdout
    for r in rows:
        assert r[-1] == "5/5", f"speculation changed the tokens: {r}"
