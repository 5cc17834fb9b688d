#!/usr/bin/env python3
"""Pipeline ranks against one process (issue 54), on this machine.

For each model: one `specd serve` with SPECD_THREADS=2, then the same on 2
ranks with SPECD_THREADS=1 each (loopback ring), alternated `--repeats`
times. Each runs 1 stream and N concurrent streams of greedy completions that
ignore EOS (`--max-tokens` each, drafter none): aggregate decode tok/s.
Also each process's resident memory once warm, and rank 0's and rank 1's
own accounts of their time (the lines they print at exit), per frame (a
batched step is two frames, its micro-batches): rank 0's layers, its
sends and its wait for the rows back, rank 1's layers, and the time in
the sends and receives proper.

    .venv/bin/python scripts/bench_ranks.py [--models smollm2:135m,gemma3:270m]
        [--streams 8] [--max-tokens 128] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("SPECD_BIN", ROOT / "target" / "release" / "specd"))
PROMPTS = ["Tell me a story about a lighthouse.", "Explain how rain forms.", "Write a poem about the sea.",
           "Describe a busy market.", "What makes a good friend?", "Tell me about the moon.",
           "Write a letter to a pen pal.", "Describe your favourite meal."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_ready(url: str, procs: list[subprocess.Popen], logs: list[Path]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for p, log in zip(procs, logs):
            if p.poll() is not None:
                sys.exit(f"a server exited:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit("no server came up")


def start(model: str, ranks: int, tmp: Path, halves: bool = True) -> tuple[str, list[subprocess.Popen], list[Path]]:
    port = free_port()
    args = [str(BIN), "serve", "--model", model, "--port", str(port), "--policy-dir", str(tmp / "pol")]
    env = dict(os.environ)
    procs, logs = [], []
    if ranks == 1:
        env["SPECD_THREADS"] = "2"
        logs.append(tmp / "solo.log")
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=open(logs[0], "w")))
    else:
        hosts = tmp / "hosts.json"
        hosts.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(ranks)]))
        for r in reversed(range(ranks)):
            e = dict(env, SPECD_THREADS="1", MLX_RANK=str(r), MLX_HOSTFILE=str(hosts),
                     SPECD_RANK_MICRO_BATCHES="1" if halves else "0")
            log = tmp / f"rank{r}.log"
            logs.insert(0, log)
            procs.insert(0, subprocess.Popen(args, env=e, stdout=subprocess.DEVNULL, stderr=open(log, "w")))
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, procs, logs)
    return url, procs, logs


def chat(url: str, model: str, prompt: str, max_tokens: int) -> int:
    # Completions, not chat: Gemma 3 270M is a base model (no template).
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, "drafter": "none"}
    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


def load(url: str, model: str, streams: int, max_tokens: int) -> float:
    """Aggregate tok/s of `streams` clients, 2 requests each."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(streams) as ex:
        toks = sum(ex.map(lambda i: chat(url, model, PROMPTS[i % len(PROMPTS)], max_tokens),
                          range(2 * streams)))
    return toks / (time.monotonic() - t0)


def stop(procs: list[subprocess.Popen]) -> None:
    procs[0].terminate()
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()


def ring_times(logs: list[Path]) -> dict:
    text0, text1 = logs[0].read_text(), logs[1].read_text()
    m0 = re.search(r"rank 0: (\d+) frames through the ring: its layers ([\d.]+) s, sending ([\d.]+) s, "
                   r"waiting for the rows back ([\d.]+) s", text0)
    m1 = re.search(r"rank 1: stopped after (\d+) frames: waiting ([\d.]+) s, receiving rows ([\d.]+) s, "
                   r"its layers ([\d.]+) s, sending ([\d.]+) s", text1)
    if not (m0 and m1):
        return {}
    steps = int(m0.group(1))
    local, send, back = map(float, m0.groups()[1:])
    r1_recv, r1_layers, r1_send = float(m1.group(3)), float(m1.group(4)), float(m1.group(5))
    ms = lambda s: 1000 * s / max(steps, 1)  # noqa: E731
    return {"frames": steps, "rank0_layers_ms": ms(local), "rank0_send_ms": ms(send),
            "rank0_wait_ms": ms(back), "rank1_layers_ms": ms(r1_layers),
            "rank1_recv_ms": ms(r1_recv), "rank1_send_ms": ms(r1_send),
            # The sends and receives proper (rows ready on both sides).
            "transfer_ms": ms(send + r1_recv + r1_send)}


CONFIGS = [("1 rank x 2 threads", 1, True), ("2 ranks x 1 thread", 2, True),
           ("2 ranks, no micro-batches", 2, False)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2:135m,gemma3:270m")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    rows = []
    for model in a.models.split(","):
        res = {c[0]: {"one": [], "many": [], "rss": []} for c in CONFIGS}
        ring = {}
        for rep in range(a.repeats):
            for name, ranks, halves in CONFIGS:
                with tempfile.TemporaryDirectory() as d:
                    tmp = Path(d)
                    url, procs, logs = start(model, ranks, tmp, halves)
                    load(url, model, 1, 16)  # warm-up
                    r = res[name]
                    r["one"].append(load(url, model, 1, a.max_tokens))
                    r["many"].append(load(url, model, a.streams, a.max_tokens))
                    r["rss"].append([rss_mib(p.pid) for p in procs])
                    stop(procs)
                    if ranks == 2 and halves:
                        ring = ring_times(logs)
                print(f"{model} rep {rep} {name}: 1 stream {r['one'][-1]:.1f} tok/s, "
                      f"{a.streams} streams {r['many'][-1]:.1f} tok/s, RSS MiB {r['rss'][-1]}", flush=True)
        rows.append((model, res, ring))
    print()
    print(f"| model | run | 1 stream tok/s | vs 1 rank | {a.streams} streams tok/s | vs 1 rank | RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for model, res, _ in rows:
        base = res[CONFIGS[0][0]]
        for name, *_ in CONFIGS:
            r = res[name]
            one, many = max(r["one"]), max(r["many"])
            print(f"| {model} | {name} | {one:.1f} | {one / max(base['one']):.2f}x | {many:.1f} | "
                  f"{many / max(base['many']):.2f}x | {', '.join(f'{x:.0f}' for x in r['rss'][-1])} |")
    print()
    for model, _, ring in rows:
        print(f"{model}: ring per frame (last 2-rank run, both loads): " + ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in ring.items()))


if __name__ == "__main__":
    main()
