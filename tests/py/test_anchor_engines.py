"""The other engines specd is measured against, really run (short runs):

- `specd bench anchors --only ours,llama.cpp`: llama.cpp through
  llama-cpp-python (pinned in requirements.txt) on the same GGUF, next to
  ours in one run;
- `specd bench serve --anchor`: mlx-lm's own server (`mlx_lm.server`) on the
  `specd convert` directory at the same concurrencies as specd's batched
  engine, driven by `specd-anchors --serve`, with specd / mlx-lm per N.

Speeds are not asserted (the machine is shared): only that each engine ran,
produced the tokens asked for, and that the ratios are the ones printed.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from conftest import server_bin


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    exe = server_bin()
    assert exe.exists(), f"{exe} is missing: build it first (cargo build --release --workspace)"
    env = dict(os.environ, SPECD_PYTHON=sys.executable)
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_llama_cpp_next_to_ours():
    r = run("bench", "anchors", "--no-install", "--json", "--only", "ours,llama.cpp", "--max-tokens", "8",
            "--prefill-tokens", "32", "--reps", "1", "--verify-reps", "1")
    assert r.returncode == 0, f"bench anchors failed:\n{r.stdout}\n{r.stderr}"
    rep = json.loads(r.stdout)
    assert [e["engine"] for e in rep["engines"]] == ["ours", "llama.cpp"]
    ours, llama = rep["engines"]
    assert llama["error"] is None, llama
    assert llama["version"] == "0.3.16" and llama["model"] == rep["gguf"], llama
    assert llama["prefill"]["prompt_tokens"] == 32 and llama["prefill"]["tokens_per_second"] > 0
    assert 0 < llama["decode"]["generated_tokens"] <= 8 and llama["decode"]["tokens_per_second"] > 0
    # Greedy from the same ids on the same weights: at least the first token
    # agrees (llama.cpp's 8-bit activations may split near-ties later).
    assert llama["same_tokens_as_ours"] >= 1, llama
    ratio = ours["decode"]["tokens_per_second"] / llama["decode"]["tokens_per_second"]
    assert abs(rep["ratios"]["decode"]["llama.cpp"] - ratio) < 1e-9


def test_serve_anchor_is_mlx_lm_server_at_the_same_concurrencies():
    r = run("bench", "serve", "--concurrency", "1,2", "--drafters", "none", "--temperatures", "0",
            "--max-tokens", "8", "--anchor")
    assert r.returncode == 0, f"bench serve --anchor failed:\n{r.stdout}\n{r.stderr}"
    out = r.stdout
    assert "mlx_lm.server" in out, out
    # specd's own rows first (mode, drafter, N, requests, prompt tokens,
    # tokens, tok/s, ...), then mlx-lm's with specd's tok/s and the ratio.
    ours = {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"^greedy\s+none\s+(\d+)\s+\d+\s+\d+\s+\d+\s+([\d.]+)", out, re.M)}
    assert set(ours) == {1, 2}, out
    rows = re.findall(r"^mlx-lm\s+(\d+)\s+(\d+)\s+([\d.]+)\s.*\s([\d.]+)\s+([\d.]+)x$", out, re.M)
    assert [int(n) for n, *_ in rows] == [1, 2], out
    for n, tokens, tps, specd_tps, ratio in rows:
        n, tokens, tps, specd_tps, ratio = int(n), int(tokens), float(tps), float(specd_tps), float(ratio)
        assert tokens == 8 * n, f"mlx-lm's server returned {tokens} tokens for {n} x 8:\n{out}"
        assert tps > 0 and abs(specd_tps - ours[n]) < 0.06, out
        assert abs(ratio - ours[n] / tps) < 0.01 + 0.01 * ratio, out
