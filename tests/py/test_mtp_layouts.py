"""Published draft-head layouts on tiny random checkpoints, as the Qwen and
Mistral loaders are tested (hf_checkpoints.py).

A MiMo checkpoint (Qwen2 trunk, `model_type: mimo`) carries its MTP layer
as `model.mtp_layers.0.*`; specd serves the trunk and drafts with the layer
(`--drafter mtp`). Its names and math are vLLM's
(vllm/model_executor/models/mimo_mtp.py): `input_proj` over
`[hidden_layernorm(h); token_layernorm(e)]` where h is the trunk's output
after its final norm, a Qwen2 decoder layer (`mtp_block`: q/k/v biases),
`final_layernorm`, the trunk's head. The reference here runs the trunk and
that layer with mlx-lm's own Qwen2 classes. EAGLE-3 heads (below) are
checked the same way against a qwen3 target. An EAGLE-1 head, and layers
missing a tensor or of another shape, are refused with errors that say so.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx

import numpy as np
import pytest

from conftest import server_bin
from hf_checkpoints import load_mlx, write_checkpoint



def mtp_tensors(config: dict, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, nh, nkv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    hd = h // nh
    ff = config["intermediate_size"]
    w = lambda *s: (rng.standard_normal(s) * 0.08).astype(np.float32)  # noqa: E731
    norm = lambda: (1.0 + 0.3 * rng.standard_normal(h)).astype(np.float32)  # noqa: E731
    p = "model.mtp_layers.0."
    return {
        p + "token_layernorm.weight": norm(),
        p + "hidden_layernorm.weight": norm(),
        p + "input_proj.weight": w(h, 2 * h),
        p + "final_layernorm.weight": (12.0 * norm()).astype(np.float32),
        p + "input_layernorm.weight": norm(),
        p + "self_attn.q_proj.weight": w(nh * hd, h),
        p + "self_attn.q_proj.bias": w(nh * hd) * 5,
        p + "self_attn.k_proj.weight": w(nkv * hd, h),
        p + "self_attn.k_proj.bias": w(nkv * hd) * 5,
        p + "self_attn.v_proj.weight": w(nkv * hd, h),
        p + "self_attn.v_proj.bias": w(nkv * hd) * 5,
        p + "self_attn.o_proj.weight": w(h, nh * hd),
        p + "post_attention_layernorm.weight": norm(),
        p + "mlp.gate_proj.weight": w(ff, h),
        p + "mlp.up_proj.weight": w(ff, h),
        p + "mlp.down_proj.weight": w(h, ff),
    }


@pytest.fixture(scope="module")
def mimo(tmp_path_factory):
    """(the qwen2 trunk's directory, the MiMo checkpoint's, the MTP tensors)."""
    from safetensors.numpy import load_file, save_file

    base = tmp_path_factory.mktemp("mimo")
    trunk = write_checkpoint(base / "trunk", "qwen2", seed=5)
    d = base / "mimo"
    shutil.copytree(trunk, d)
    config = json.loads((d / "config.json").read_text())
    extra = mtp_tensors(config)
    weights = load_file(str(d / "model.safetensors"))
    weights.update(extra)
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "mlx"})
    config.update(model_type="mimo", num_nextn_predict_layers=1, architectures=["MiMoForCausalLM"])
    (d / "config.json").write_text(json.dumps(config))
    return trunk, d, extra


def reference_rows(trunk, extra: dict, ids: list[int]) -> np.ndarray:
    """vLLM's MiMo MTP step over ids: row i reads the trunk's normed output
    at i and the token i + 1; logits over the vocabulary."""
    import importlib

    import mlx.core as mx

    model = load_mlx(trunk)
    inner = model.model
    h = inner(mx.array([ids[:-1]]))  # mlx-lm's Qwen2Model ends with its final norm
    mod = importlib.import_module("mlx_lm.models.qwen2")
    cfg = json.loads((trunk / "config.json").read_text())
    args = mod.ModelArgs.from_dict(cfg)
    block = mod.TransformerBlock(args)
    p = "model.mtp_layers.0."
    block.load_weights([(k[len(p):], mx.array(v)) for k, v in extra.items()
                        if not any(s in k for s in ("token_layernorm", "hidden_layernorm",
                                                    "input_proj", "final_layernorm"))])
    eps = cfg["rms_norm_eps"]
    t = lambda n: mx.array(extra[p + n])  # noqa: E731
    e = inner.embed_tokens(mx.array([ids[1:]]))
    x = mx.concatenate([mx.fast.rms_norm(h, t("hidden_layernorm.weight"), eps),
                        mx.fast.rms_norm(e, t("token_layernorm.weight"), eps)], axis=-1)
    x = x @ t("input_proj.weight").T
    out = block(x, mask="causal", cache=None)
    out = mx.fast.rms_norm(out, t("final_layernorm.weight"), eps)
    logits = inner.embed_tokens.as_linear(out)
    return np.array(logits[0].astype(mx.float32))


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(server_bin()), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_mimo_mtp_layer_matches_the_reference(mimo, tmp_path):
    trunk, d, extra = mimo
    ids = [5, 17, 42, 99, 7, 300, 12, 64, 128, 3, 77]
    out = tmp_path / "rows.json"
    r = run("debug", "mtp", "-m", d, "--ids", ",".join(map(str, ids)), "--logits", "--json", out)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(out.read_text())
    want = reference_rows(trunk, extra, ids)
    logits = np.array(got["logits"], dtype=np.float32)
    assert logits.shape == want.shape, (logits.shape, want.shape)
    scale = np.abs(want).max()
    assert scale > 5.0, "the reference logits should spread over units"
    err = np.abs(logits - want).max() / scale
    assert err < 2e-3, f"relative max error {err}"
    assert got["argmax"] == want.argmax(-1).tolist()


def test_mimo_checkpoint_serves_and_drafts_with_its_layer(mimo, tmp_path):
    _, d, _ = mimo
    sj = tmp_path / "s.json"
    plain = run("generate", "-m", d, "--max-tokens", "24", "--drafter", "none", "hello there")
    spec = run("generate", "-m", d, "--max-tokens", "24", "--drafter", "mtp", "--schedule", "constant",
               "--stats-json", sj, "hello there")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr[-2000:]
    assert spec.stdout == plain.stdout
    st = json.loads(sj.read_text())
    assert st["drafter"] == "mtp" and st["drafted"] > 0, st


def test_a_mimo_layer_missing_a_tensor_is_refused(mimo, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, d, _ = mimo
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    w = load_file(str(bad / "model.safetensors"))
    del w["model.mtp_layers.0.input_proj.weight"]
    save_file(w, str(bad / "model.safetensors"), metadata={"format": "mlx"})
    r = run("generate", "-m", bad, "--max-tokens", "2", "hi")
    assert r.returncode != 0
    assert "model.mtp_layers.0.input_proj.weight" in r.stderr, r.stderr[-2000:]


def test_an_eagle1_head_is_refused_with_a_clear_error(tmp_path):
    head = tmp_path / "eagle"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle"], "hidden_size": 576}))
    r = run("generate", "--drafter", f"mtp:{head}", "--max-tokens", "2", "hi")
    assert r.returncode != 0
    assert "EAGLE-1/2 head" in r.stderr, r.stderr[-2000:]


# EAGLE-3 (vllm/model_executor/models/llama_eagle3.py): the head reads the
# target's residual stream at three layer boundaries (vLLM's numbering:
# boundary k = the rows after k layers), `fc` makes one feature of them, and
# its layer's q/k/v read [input_layernorm(e); hidden_norm(f)] with f as the
# attention's residual. Boundaries 0 (the embedding) and 3 (the last layer's
# output) test both ends; the head's own head_dim differs from the target's.
EAGLE_TAPS = [0, 2, 3]


def eagle3_head(d, target_config: dict, seed: int = 11, **changes) -> tuple[dict, dict]:
    """Writes a tiny random EAGLE-3 head for the target into d, its
    tensors named as published (`midlayer.*`); returns (config, tensors)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    vocab, h = target_config["vocab_size"], target_config["hidden_size"]
    nh, nkv, hd, ff, dv = 4, 2, 32, 192, vocab // 2
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": h, "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd,
        "intermediate_size": ff, "num_hidden_layers": 1, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "vocab_size": vocab, "draft_vocab_size": dv,
        "max_position_embeddings": 2048, "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": EAGLE_TAPS, "use_aux_hidden_state": True},
    }
    cfg.update(changes)
    w = lambda *s: (rng.standard_normal(s) * 0.08).astype(np.float32)  # noqa: E731
    norm = lambda: (1.0 + 0.3 * rng.standard_normal(h)).astype(np.float32)  # noqa: E731
    ids = np.sort(rng.choice(vocab, dv, replace=False))
    t = {
        "midlayer.input_layernorm.weight": norm(),
        "midlayer.hidden_norm.weight": norm(),
        "midlayer.self_attn.q_proj.weight": w(nh * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": w(nkv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": w(nkv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": w(h, nh * hd),
        "midlayer.post_attention_layernorm.weight": norm(),
        "midlayer.mlp.gate_proj.weight": w(ff, h),
        "midlayer.mlp.up_proj.weight": w(ff, h),
        "midlayer.mlp.down_proj.weight": w(h, ff),
        "fc.weight": w(h, len(EAGLE_TAPS) * h),
        "norm.weight": (12.0 * norm()).astype(np.float32),
        "lm_head.weight": w(dv, h) * 3,
        "d2t": (ids - np.arange(dv)).astype(np.int64),
        "t2d": np.isin(np.arange(vocab), ids),
    }
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    save_file(t, str(d / "model.safetensors"))
    return cfg, t


@pytest.fixture(scope="module")
def eagle3(tmp_path_factory):
    """(the qwen3 target's directory, the head's, its config, its tensors)."""
    base = tmp_path_factory.mktemp("eagle3")
    target = write_checkpoint(base / "qwen3", "qwen3", seed=6)
    tc = json.loads((target / "config.json").read_text())
    cfg, t = eagle3_head(base / "head", tc)
    return target, base / "head", cfg, t


def eagle3_reference(target, cfg: dict, t: dict, ids: list[int]) -> np.ndarray:
    """vLLM's EAGLE-3 first step over ids, with mlx-lm's own qwen3 layers
    for the target and llama Attention/MLP for the head: row i reads the
    taps at position i and the token i + 1; logits over the draft vocabulary."""
    import importlib

    import mlx.core as mx
    import mlx.nn as nn

    inner = load_mlx(target).model
    x = inner.embed_tokens(mx.array([ids[:-1]]))
    bounds = [x]
    for layer in inner.layers:
        x = layer(x, mask="causal", cache=None)
        bounds.append(x)
    feats = mx.concatenate([bounds[k] for k in EAGLE_TAPS], axis=-1)
    llama = importlib.import_module("mlx_lm.models.llama")
    args = llama.ModelArgs.from_dict(cfg)
    h, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    attn = llama.Attention(args)
    attn.q_proj = nn.Linear(2 * h, nh * hd, bias=False)
    attn.k_proj = nn.Linear(2 * h, nkv * hd, bias=False)
    attn.v_proj = nn.Linear(2 * h, nkv * hd, bias=False)
    p = "midlayer."
    attn.load_weights([(k[len(p + "self_attn."):], mx.array(v)) for k, v in t.items()
                       if k.startswith(p + "self_attn.")])
    mlp = llama.MLP(args)
    mlp.load_weights([(k[len(p + "mlp."):], mx.array(v)) for k, v in t.items() if k.startswith(p + "mlp.")])
    eps = cfg["rms_norm_eps"]
    g = lambda n: mx.array(t[n])  # noqa: E731
    f = feats @ g("fc.weight").T
    e = inner.embed_tokens(mx.array([ids[1:]]))
    x = mx.concatenate([mx.fast.rms_norm(e, g(p + "input_layernorm.weight"), eps),
                        mx.fast.rms_norm(f, g(p + "hidden_norm.weight"), eps)], axis=-1)
    hs = attn(x, mask="causal", cache=None) + f
    out = mlp(mx.fast.rms_norm(hs, g(p + "post_attention_layernorm.weight"), eps)) + hs
    logits = mx.fast.rms_norm(out, g("norm.weight"), eps) @ g("lm_head.weight").T
    return np.array(logits[0].astype(mx.float32))


def test_eagle3_head_matches_the_reference(eagle3, tmp_path):
    target, head, cfg, t = eagle3
    ids = [5, 17, 42, 99, 7, 300, 12, 64, 128, 3, 77]
    out = tmp_path / "rows.json"
    r = run("debug", "mtp", "-m", target, "--head", head, "--ids", ",".join(map(str, ids)),
            "--logits", "--json", out)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(out.read_text())
    want = eagle3_reference(target, cfg, t, ids)
    logits = np.array(got["logits"], dtype=np.float32)
    assert logits.shape == want.shape == (len(ids) - 1, cfg["draft_vocab_size"]), (logits.shape, want.shape)
    scale = np.abs(want).max()
    assert scale > 5.0, "the reference logits should spread over units"
    err = np.abs(logits - want).max() / scale
    assert err < 2e-3, f"relative max error {err}"
    # Draft ids map to the target's through d2t.
    d2t = t["d2t"]
    assert got["argmax"] == [int(i + d2t[i]) for i in want.argmax(-1)]


def test_eagle3_head_on_a_quantized_target_runs_packed(tmp_path):
    """A quantized target runs specd's packed kernels: the head is kept in
    8 bits, its q/k/v fused over the 2H input and its tail one op."""
    target = write_checkpoint(tmp_path / "q4", "qwen3", quantize=dict(group_size=64, bits=4), seed=6)
    cfg, t = eagle3_head(tmp_path / "head", json.loads((target / "config.json").read_text()))
    ids = [5, 17, 42, 99, 7, 300, 12, 64, 128, 3, 77]
    out = tmp_path / "rows.json"
    r = run("debug", "mtp", "-m", target, "--head", tmp_path / "head", "--ids", ",".join(map(str, ids)),
            "--logits", "--json", out)
    assert r.returncode == 0, r.stderr[-3000:]
    want = eagle3_reference(target, cfg, t, ids)
    logits = np.array(json.loads(out.read_text())["logits"], dtype=np.float32)
    err = np.abs(logits - want).max() / np.abs(want).max()
    assert err < 0.05, f"relative max error {err} (an 8-bit head)"
    assert (logits.argmax(-1) == want.argmax(-1)).mean() >= 0.8
    plain = run("generate", "-m", target, "--max-tokens", "24", "--drafter", "none", "hello there")
    spec = run("generate", "-m", target, "--max-tokens", "24", "--drafter", f"mtp:{tmp_path / 'head'}",
               "--schedule", "constant", "hello there")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr[-2000:]
    assert spec.stdout == plain.stdout


def test_eagle3_head_drafts_alone_and_served_beside_others(eagle3, tmp_path, start_server):
    target, head, _, _ = eagle3
    sj = tmp_path / "s.json"
    plain = run("generate", "-m", target, "--max-tokens", "24", "--drafter", "none", "hello there")
    spec = run("generate", "-m", target, "--max-tokens", "24", "--drafter", f"mtp:{head}",
               "--schedule", "constant", "--stats-json", sj, "hello there")
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr[-2000:]
    assert spec.stdout == plain.stdout
    st = json.loads(sj.read_text())
    assert st["drafted"] > 0, st

    # Batched: the step taps the boundaries for the head's requests only.
    srv = start_server("--model", str(target), "--draft-head", f"e3={head}")
    prompts = ["hello there", "the quick brown fox", "def fibonacci(n):", "once upon a time"]
    opts = [{"drafter": "mtp:e3", "schedule": "constant"}, {"drafter": "ngram"},
            {"drafter": "mtp:e3", "schedule": "heuristic"}, {"drafter": "none"}]

    def ask(i: int, options: dict) -> dict:
        r = httpx.post(srv.url + "/api/generate", timeout=300, json={
            "model": "default", "prompt": prompts[i], "stream": False, "raw": True,
            "options": {"num_predict": 24, "temperature": 0, **options}})
        assert r.status_code == 200, r.text
        return r.json()

    solo = [ask(i, {"drafter": "none"})["response"] for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: ask(i, opts[i]), range(4)))
    for i, g in enumerate(got):
        assert g["response"] == solo[i], f"request {i} ({opts[i]}) differs from plain decoding"
    assert all(got[i]["speculation"]["drafted"] > 0 for i in (0, 2)), [g["speculation"] for g in got]


@pytest.mark.parametrize("change,message", [
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 9]}}, "names boundary 9, past the model's 3 layers"),
    ({"num_hidden_layers": 2}, "specd runs EAGLE-3 heads of one layer"),
    ({"vocab_size": 999}, "its vocab_size is 999"),
    ({"norm_before_fc": True}, "norm_before_fc = true is not supported"),
])
def test_a_wrong_eagle3_head_is_refused(eagle3, tmp_path, change, message):
    target, _, _, _ = eagle3
    tc = json.loads((target / "config.json").read_text())
    eagle3_head(tmp_path / "bad", tc, **change)
    r = run("generate", "-m", target, "--drafter", f"mtp:{tmp_path / 'bad'}", "--max-tokens", "2", "hi")
    assert r.returncode != 0
    assert "EAGLE-3 head" in r.stderr and message in r.stderr, r.stderr[-2000:]


def test_an_eagle3_head_missing_a_tensor_is_refused(eagle3, tmp_path):
    from safetensors.numpy import load_file, save_file

    target, head, _, _ = eagle3
    bad = tmp_path / "bad"
    shutil.copytree(head, bad)
    w = load_file(str(bad / "model.safetensors"))
    del w["fc.weight"]
    save_file(w, str(bad / "model.safetensors"))
    r = run("generate", "-m", target, "--drafter", f"mtp:{bad}", "--max-tokens", "2", "hi")
    assert r.returncode != 0
    assert "has no tensor fc.weight" in r.stderr, r.stderr[-2000:]
