#!/usr/bin/env python3
"""Replicas behind vllm-router, measured (docs/serving.md: "Behind a router").

    .venv/bin/python scripts/bench_router.py [--conversations 12] [--turns 4]
        [--replicas 3] [--policies cache_aware,round_robin] [--repeats 1]
        [--think 1.0] [--router vllm|sglang] [--scaling] [--overhead]

Routing policies: vllm-router's `cache_aware` matches a prefix tree over
the request's text (for chat requests its routing text may not hold the
conversation: measure it), `consistent_hash` keys on the X-Session-ID
header (each conversation sends its own), `round_robin`.

A multi-turn workload: C conversations run at once, each a client that
sends its turns one after another; a turn's prompt is a long per-
conversation system message, the earlier turns (questions and the
answers it got) and a new question. For each routing policy it starts N
fresh `specd serve` replicas (empty prefix caches) and `vllm-router
--policy P` in front, runs the workload through the router, and reports
the prompt tokens the replicas served from their prefix caches (their
own `specd_prompt_cached_tokens_total`), time to first token p50/p99 and
aggregate tokens/s.

--overhead: the same workload on one replica, direct and through the
router. --scaling: round_robin over 1, 2 and N replicas (on a 2-core
machine they share the cores: that is not scaling, and the table says
tok/s per core too).

Needs the venv (vllm-router, httpx: `make test` installs them) and the
release binary (SPECD_BIN or target/release/specd).
"""
from __future__ import annotations

import argparse
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SPECD = Path(os.environ.get("SPECD_BIN", ROOT / "target" / "release" / "specd"))
ROUTER = Path(sys.executable).parent / "vllm-router"


def router_command(kind: str, port: int, urls: list, policy: str) -> list:
    """vllm-router, or the SGLang model gateway (sglang-router): both pinned in the test venv."""
    if kind == "vllm":
        exe = [str(ROUTER)]
    else:
        exe = [sys.executable, "-m", "sglang_router.launch_router"]
    extra = ["--log-level", "warning"] if kind == "vllm" else []
    return exe + ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
                  "--policy", policy, "--prometheus-host", "127.0.0.1",
                  "--prometheus-port", str(free_port())] + extra
MODEL = "smollm2:135m"
TOPICS = ["the sea", "mountains", "bread", "trains", "bees", "winter", "libraries", "rivers",
          "gardens", "clocks", "bridges", "music", "forests", "deserts", "cities", "islands"]
QUESTIONS = ["Tell me one fact about it.", "Why does that matter?", "Give an example.",
             "Summarize in one sentence.", "What is a common mistake about it?",
             "Name a related topic."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, path: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


class Replicas:
    def __init__(self, n: int, tmp: Path, policy: str | None, router: str = "vllm"):
        self.procs, self.urls = [], []
        for i in range(n):
            port = free_port()
            d = tmp / f"r{i}-{port}"
            d.mkdir()
            p = subprocess.Popen([str(SPECD), "serve", "--port", str(port), "--policy-dir",
                                  str(d / "policies")], stdout=open(d / "log", "wb"),
                                 stderr=subprocess.STDOUT)
            self.procs.append(p)
            self.urls.append(f"http://127.0.0.1:{port}")
        for u, p in zip(self.urls, self.procs):
            wait_up(u, "/health", p)
        self.url = self.urls[0]
        self.router = None
        if policy:
            port = free_port()
            self.router = subprocess.Popen(
                router_command(router, port, self.urls, policy),
                stdout=open(tmp / f"router-{port}.log", "wb"), stderr=subprocess.STDOUT)
            self.url = f"http://127.0.0.1:{port}"
            wait_up(self.url, "/v1/models", self.router)

    def counters(self) -> tuple[int, int]:
        """Prompt tokens and prompt tokens from the prefix cache, over the replicas."""
        total = cached = 0
        for u in self.urls:
            m = httpx.get(u + "/metrics", timeout=10).text
            total += int(float(re.search(r"^specd_prompt_tokens_total (\S+)", m, re.M).group(1)))
            cached += int(float(re.search(r"^specd_prompt_cached_tokens_total (\S+)", m, re.M).group(1)))
        return total, cached

    def stop(self) -> None:
        for p in ([self.router] if self.router else []) + self.procs:
            p.terminate()
        for p in ([self.router] if self.router else []) + self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def turn(url: str, messages: list, max_tokens: int, session: str = "") -> tuple[float, int, str]:
    """One streamed turn: (time to first token, completion tokens, text).
    `session` goes in X-Session-ID, what vllm-router's consistent_hash keys on."""
    t0 = time.monotonic()
    ttft, text, tokens = None, [], 0
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    headers = {"X-Session-ID": session} if session else {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=600) as r:
        r.raise_for_status()
        import json
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("choices"):
                piece = d["choices"][0]["delta"].get("content") or ""
                if piece and ttft is None:
                    ttft = time.monotonic() - t0
                text.append(piece)
            if d.get("usage"):
                tokens = d["usage"]["completion_tokens"]
    return (ttft if ttft is not None else time.monotonic() - t0), tokens, "".join(text)


def workload(url: str, conversations: int, turns: int, max_tokens: int, think: float) -> dict:
    ttfts, tokens, errors = [], [0], []
    lock = threading.Lock()

    def conversation(i: int) -> None:
        topic = TOPICS[i % len(TOPICS)]
        system = (f"You are a patient teacher. This conversation (number {i}) is about {topic}. "
                  + " ".join(f"Rule {k}: answer plainly about {topic}, in short sentences, "
                             f"without lists, and stay on {topic}." for k in range(12)))
        messages = [{"role": "system", "content": system}]
        # Users read and type: a seeded pause before each turn, so turns of
        # different conversations do not reach a round-robin router in
        # lockstep (which would pin each conversation to one replica).
        rng = random.Random(i)
        for t in range(turns):
            time.sleep(rng.uniform(0, think))
            messages.append({"role": "user", "content": QUESTIONS[(i + t) % len(QUESTIONS)]})
            try:
                ttft, n, text = turn(url, messages, max_tokens, f"conversation-{i}")
            except httpx.HTTPError as e:
                with lock:
                    errors.append(repr(e))
                return
            messages.append({"role": "assistant", "content": text})
            with lock:
                ttfts.append(ttft)
                tokens[0] += n

    t0 = time.monotonic()
    threads = [threading.Thread(target=conversation, args=(i,)) for i in range(conversations)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    ttfts.sort()
    return {
        "turns": len(ttfts), "errors": len(errors), "wall": wall,
        "tok_s": tokens[0] / wall,
        "ttft_p50": statistics.median(ttfts) if ttfts else float("nan"),
        "ttft_p99": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan"),
    }


def run(n: int, policy: str | None, a, tmp: Path) -> dict:
    r = Replicas(n, tmp, policy, a.router)
    try:
        before = r.counters()
        res = workload(r.url, a.conversations, a.turns, a.max_tokens, a.think)
        after = r.counters()
        res["prompt_tokens"] = after[0] - before[0]
        res["reused"] = after[1] - before[1]
        return res
    finally:
        r.stop()


def row(label: str, r: dict) -> str:
    share = r["reused"] / r["prompt_tokens"] if r["prompt_tokens"] else 0
    return (f"| {label} | {r['turns']} | {r['errors']} | {r['prompt_tokens']} | {r['reused']} "
            f"({share:.0%}) | {r['ttft_p50'] * 1000:.0f} | {r['ttft_p99'] * 1000:.0f} | "
            f"{r['tok_s']:.1f} | {r['tok_s'] / (os.cpu_count() or 1):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--think", type=float, default=1.0,
                    help="most seconds a user pauses before a turn (uniform, seeded)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each routing policy, alternated")
    ap.add_argument("--policies", default="cache_aware,round_robin")
    ap.add_argument("--router", choices=["vllm", "sglang"], default="vllm",
                    help="vllm-router or the SGLang model gateway")
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--scaling", action="store_true")
    a = ap.parse_args()
    if not ROUTER.exists():
        raise SystemExit(f"{ROUTER} is missing: run this with the venv's python (make test installs vllm-router)")
    print(f"{a.conversations} conversations x {a.turns} turns, {a.max_tokens} tokens a turn, "
          f"pauses up to {a.think} s, {os.cpu_count()} cores")
    print("| setup | turns | errors | prompt tokens | reused from prefix caches | TTFT p50 ms | "
          "TTFT p99 ms | tok/s | tok/s per core |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for _ in range(a.repeats):
            for p in [p for p in a.policies.split(",") if p]:
                print(row(f"{a.replicas} replicas, {a.router} {p}", run(a.replicas, p, a, tmp)),
                      flush=True)
        if a.overhead:
            print(row("1 replica, direct", run(1, None, a, tmp)), flush=True)
            print(row("1 replica, through the router", run(1, "round_robin", a, tmp)), flush=True)
        if a.scaling:
            for n in sorted({1, 2, a.replicas}):
                print(row(f"{n} replica(s), round_robin", run(n, "round_robin", a, tmp)), flush=True)


if __name__ == "__main__":
    main()
