"""`specd bench anchors`: our speed next to mlx-lm in one run (llama.cpp's run
is in test_anchor_engines.py), and a missing anchor is an error that says how
to install it, never a silent skip."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import server_bin


def anchors(*args: str, python: str = sys.executable, timeout: float = 240) -> subprocess.CompletedProcess:
    exe = server_bin()
    assert exe.exists(), f"{exe} is missing: build it first (cargo build --release -p specd)"
    env = dict(os.environ, SPECD_PYTHON=python)
    return subprocess.run([str(exe), "bench", "anchors", "--no-install", "--json", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_ours_and_mlx_lm_side_by_side():
    r = anchors("--only", "ours,mlx-lm", "--max-tokens", "16", "--prefill-tokens", "128",
                "--reps", "1", "--verify-reps", "3")
    assert r.returncode == 0, f"bench anchors failed:\n{r.stdout}\n{r.stderr}"
    rep = json.loads(r.stdout)
    assert [e["engine"] for e in rep["engines"]] == ["ours", "mlx-lm"]
    assert rep["max_tokens"] == 16 and rep["prefill_prompt_tokens"] == 128
    assert rep["decode_prompt_tokens"] > 10
    assert rep["converted"] and os.path.isfile(os.path.join(rep["converted"], "config.json"))
    for e in rep["engines"]:
        assert e["error"] is None, e
        assert e["prefill"]["prompt_tokens"] == 128
        assert e["prefill"]["tokens_per_second"] > 0, e
        assert 0 < e["decode"]["generated_tokens"] <= 16, e
        assert e["decode"]["tokens_per_second"] > 0, e
        assert 0.0 <= e["cpu_others"] <= 1.0, e  # how much other work skewed it
    mlx = rep["engines"][1]
    assert mlx["version"] and mlx["model"] == rep["converted"]
    # Greedy on the same weights, from the same token ids: the first tokens agree.
    assert mlx["same_tokens_as_ours"] >= 4, mlx
    for what in ("decode", "prefill"):
        ours = rep["engines"][0][what]["tokens_per_second"]
        theirs = mlx[what]["tokens_per_second"]
        assert abs(rep["ratios"][what]["mlx-lm"] - ours / theirs) < 1e-9
    assert 0.0 <= rep["cpu_busy_at_start"] <= 1.0 and 0.0 <= rep["cpu_others_during_run"] <= 1.0
    v = rep["verify"]
    assert v["context"] == 128
    assert [p["tokens"] for p in v["points"]] == [1, 2, 3, 4, 5, 6, 7, 8, 16]
    assert v["points"][0]["relative"] == 1.0
    assert all(p["ms"] > 0 and p["relative"] > 0 for p in v["points"])


def test_missing_anchor_is_an_error_with_install_hint(tmp_path):
    # A python that sees no site-packages: neither mlx-lm nor llama-cpp-python imports.
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    r = anchors("--only", "llama.cpp,mlx-lm", "--max-tokens", "4", "--prefill-tokens", "32",
                python=str(bare), timeout=120)
    assert r.returncode != 0, r.stdout
    rep = json.loads(r.stdout)
    assert [e["engine"] for e in rep["engines"]] == ["mlx-lm", "llama.cpp"]
    for e in rep["engines"]:
        assert "not importable" in e["error"], e
        assert "pip install" in e["install"], e
        assert e["decode"] is None and e["prefill"] is None
    assert "llama-cpp-python" in rep["engines"][1]["install"]
    assert "could not run" in r.stderr
    assert rep["verify"] is None and rep["ratios"] == {}
