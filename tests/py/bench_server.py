"""Benchmark: `specd serve` over HTTP vs `specd generate`, same prompt.

    .venv/bin/python tests/py/bench_server.py [--runs 3] [--tokens 64]

Reports, per run (interleaved, medians at the end):
- CLI: decode tok/s and (prompt + decode) seconds from `--stats-json`;
- HTTP (streaming /api/chat, NDJSON): time to first token (request sent ->
  first content chunk received), client-side decode tok/s (tokens after the
  first / time from first to last chunk), end-to-end tok/s (tokens / request
  wall time), and the server's own decode tok/s.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import MODEL, Server, server_bin  # noqa: E402

PROMPT = "Write a short story about a dragon who learns to bake bread."


def cli_run(tokens: int, prompt: str = PROMPT) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([str(server_bin()), "generate", "--chat", "--max-tokens", str(tokens),
                        "--stats-json", f.name, prompt], check=True, capture_output=True)
        s = json.load(open(f.name))
    return {"decode_tps": s["generated_tokens"] / s["decode_seconds"],
            "e2e_tps": s["generated_tokens"] / (s["prompt_seconds"] + s["decode_seconds"]),
            "tokens": s["generated_tokens"], "ttft": None}


def http_run(url: str, tokens: int, prompt: str = PROMPT) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "options": {"num_predict": tokens, "temperature": 0}}
    t0 = time.perf_counter()
    first = last = None
    final = None
    with httpx.stream("POST", url + "/api/chat", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line:
                continue
            m = json.loads(line)
            now = time.perf_counter()
            if m.get("done"):
                final = m
                break
            if m["message"]["content"]:
                first = first or now
                last = now
    t_end = time.perf_counter()
    n = final["eval_count"]
    return {"ttft": first - t0, "decode_tps": (n - 1) / (last - first),
            "e2e_tps": n / (t_end - t0), "tokens": n,
            "server_decode_tps": n / (final["eval_duration"] / 1e9)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    d = Path(tempfile.mkdtemp())
    with Server(policy_dir=d / "policies", log=d / "serve.log") as srv:
        http_run(srv.url, 8)  # warm-up
        cli, web = [], []
        for i in range(a.runs):
            # A new prompt each run: the server's prefix cache only reuses
            # the shared chat-template prefix, as for a new conversation.
            prompt = f"{PROMPT} (Story number {i + 1}.)"
            cli.append(cli_run(a.tokens, prompt))
            web.append(http_run(srv.url, a.tokens, prompt))
            print(f"run {i}: cli {cli[-1]}\n       http {web[-1]}", flush=True)
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    print(f"\nmedians over {a.runs} runs, {a.tokens} tokens max:")
    print(f"  cli  decode {med(cli, 'decode_tps'):.2f} tok/s, prompt+decode {med(cli, 'e2e_tps'):.2f} tok/s")
    print(f"  http decode {med(web, 'decode_tps'):.2f} tok/s (client side), server {med(web, 'server_decode_tps'):.2f},"
          f" end-to-end {med(web, 'e2e_tps'):.2f} tok/s, time to first token {med(web, 'ttft') * 1000:.0f} ms")
    print(f"  ratio http/cli decode {med(web, 'decode_tps') / med(cli, 'decode_tps'):.3f},"
          f" end-to-end {med(web, 'e2e_tps') / med(cli, 'e2e_tps'):.3f}")


if __name__ == "__main__":
    main()
