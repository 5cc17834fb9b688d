"""Published draft-head layouts on tiny random checkpoints, as the Qwen and
Mistral loaders are tested (hf_checkpoints.py).

A MiMo checkpoint (Qwen2 trunk, `model_type: mimo`) carries its MTP layer
as `model.mtp_layers.0.*`; specd serves the trunk and drafts with the layer
(`--drafter mtp`). Its names and math are vLLM's
(vllm/model_executor/models/mimo_mtp.py): `input_proj` over
`[hidden_layernorm(h); token_layernorm(e)]` where h is the trunk's output
after its final norm, a Qwen2 decoder layer (`mtp_block`: q/k/v biases),
`final_layernorm`, the trunk's head. The reference here runs the trunk and
that layer with mlx-lm's own Qwen2 classes. An EAGLE head, and a MiMo layer
missing a tensor, are refused with errors that say so.
"""
from __future__ import annotations

import json
import shutil
import subprocess

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


def test_an_eagle_head_is_refused_with_a_clear_error(tmp_path):
    head = tmp_path / "eagle"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000, "hidden_size": 576}))
    r = run("generate", "--drafter", f"mtp:{head}", "--max-tokens", "2", "hi")
    assert r.returncode != 0
    assert "EAGLE" in r.stderr and "not EAGLE-3 heads yet" in r.stderr, r.stderr[-2000:]
