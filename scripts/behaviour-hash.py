#!/usr/bin/env python3
"""Hashes of what specd does, for "behaviour must not change" checks: run
it before and after a refactor (issue "One home for each idea") or before a
default changes, and compare the lines.

Each entry runs one command with `--weights quantized --kernels specd`
pinned and hashes (sha256 of canonical JSON) what it produced: the tokens,
the stats counters and the round traces (`--record`), with every field
that is a time dropped (keys containing "seconds", and the schedule's
timing inputs). Entries whose counters or rounds depend on time (the
`throughput` and `bandit` schedules size drafts from measured costs;
concurrent requests share steps as they happen to arrive) hash their tokens
only, and say so. Covered: both model families; every drafter (none, ngram,
suffix, self:N, model:PATH); every built-in schedule and acceptance; greedy
and seeded runs; Gemma's rotating cache past its 512-token window; 8
concurrent mixed-policy HTTP requests; structured output with logprobs; a
preemption under a tight KV budget.

    scripts/behaviour-hash.py [--bin target/release/specd] [--json OUT] [--only SUBSTR]

Prints `HASH16  name  (what is hashed)` per entry and `ALL  HASH16`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIN = ["--weights", "quantized", "--kernels", "specd"]
TIMING_KEYS = {"draft_seconds_per_token", "verify_seconds_by_len"}

GROUNDED = ("Copy the list exactly.\nList: apples, pears, plums, cherries, grapes, lemons, limes, "
            "apples, pears, plums.\nCopy:")
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
STORY = "Once upon a time, in a small village by the sea,"


def untimed(v):
    """`v` without its time fields, recursively."""
    if isinstance(v, dict):
        return {k: untimed(x) for k, x in v.items() if "seconds" not in k and k not in TIMING_KEYS}
    if isinstance(v, list):
        return [untimed(x) for x in v]
    return v


def digest(v) -> str:
    return hashlib.sha256(json.dumps(v, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Runner:
    def __init__(self, exe: Path, work: Path):
        self.exe, self.work, self.n = exe, work, 0

    def specd(self, *args) -> subprocess.CompletedProcess:
        p = subprocess.run([str(self.exe), *PIN, *map(str, args)], capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            sys.exit(f"behaviour-hash: {' '.join(map(str, args))[:200]} failed: {p.stderr[-2000:]}")
        return p

    def generate(self, model: str, prompt: str, *flags, tokens_only: bool = False) -> dict:
        self.n += 1
        stats, rec = self.work / f"{self.n}.json", self.work / f"{self.n}.jsonl"
        p = self.specd("generate", "--model", model, "--max-tokens", 48, "--stats-json", stats,
                       "--record", rec, *flags, prompt)
        out = {"text": p.stdout}
        if not tokens_only:
            out["stats"] = untimed(json.loads(stats.read_text()))
            out["rounds"] = [untimed(json.loads(line)) for line in rec.read_text().splitlines()]
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, exe: Path, work: Path, *args):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(work / f"serve-{self.port}.log", "wb")
        self.proc = subprocess.Popen([str(exe), *PIN, "serve", "--port", str(self.port), "--policy-dir",
                                      str(work / "policies"), *args], stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(900):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        sys.exit("behaviour-hash: the server did not come up")

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=1800) as r:
            return json.loads(r.read())

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def together(server: Server, bodies: list[dict]) -> list[dict]:
    out: list = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def go(i):
        barrier.wait()
        out[i] = server.post("/api/generate", bodies[i])

    ts = [threading.Thread(target=go, args=(i,)) for i in range(len(bodies))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def entries(r: Runner, model_path: str, gemma: str):
    m = "smollm2:135m"
    const = ["--schedule", "constant", "--schedule-config", '{"k": 4}']
    for d in ["none", "ngram", "suffix", "self:8", f"model:{model_path}"]:
        name = "model:PATH" if d.startswith("model:") else d
        yield f"smollm2 greedy drafter {name}", "tokens+stats+rounds", lambda d=d: r.generate(
            m, GROUNDED, "--drafter", d, *const)
    for s in ["constant", "heuristic", "heuristic-c", "heuristic-transient", "adaedl"]:
        yield f"smollm2 greedy ngram schedule {s}", "tokens+stats+rounds", lambda s=s: r.generate(
            m, CODE, "--drafter", "ngram", "--schedule", s)
    for s in ["throughput", "bandit"]:
        yield f"smollm2 greedy ngram schedule {s}", "tokens (drafts sized by time)", lambda s=s: r.generate(
            m, CODE, "--drafter", "ngram", "--schedule", s, tokens_only=True)
    for a in ["greedy", "rejection", "typical"]:
        temp = "0" if a == "greedy" else "0.8"
        yield f"smollm2 seeded t={temp} acceptance {a}", "tokens+stats+rounds", lambda a=a, temp=temp: r.generate(
            m, STORY, "--drafter", "ngram", *const, "--acceptance", a, "--temperature", temp, "--seed", 3)
    yield "smollm2 seeded plain", "tokens+stats+rounds", lambda: r.generate(
        m, STORY, "--drafter", "none", "--temperature", "0.7", "--seed", 11)
    for d in ["none", "ngram", "suffix"]:
        yield f"gemma greedy drafter {d}", "tokens+stats+rounds", lambda d=d: r.generate(
            gemma, GROUNDED, "--drafter", d, *const)
    yield "gemma seeded t=0.8 rejection", "tokens+stats+rounds", lambda: r.generate(
        gemma, STORY, "--drafter", "ngram", *const, "--temperature", "0.8", "--seed", 5)
    long = "Repeat the list.\n" + ", ".join(["alpha", "beta", "gamma", "delta", "epsilon", "zeta"] * 100) + ","
    yield "gemma past its window (rotating cache) ngram", "tokens+stats+rounds", lambda: r.generate(
        gemma, long, "--drafter", "ngram", *const)


def http_entries(exe: Path, work: Path, model_path: str):
    s = Server(exe, work, "--draft-model", f"twin={model_path}")
    try:
        mix = [
            (GROUNDED, {"drafter": "ngram", "schedule": "constant", "schedule_config": {"k": 4}}),
            (GROUNDED, {"drafter": "suffix"}),
            (CODE, {"drafter": "self:8", "schedule": "heuristic"}),
            (CODE, {"drafter": "model:twin"}),
            (STORY, {"drafter": "none"}),
            # Seeded sampling draws as many numbers as the drafts ask for, so
            # these two pin schedules that do not size drafts by time (the
            # default, throughput, does: under load their tokens moved).
            (STORY, {"drafter": "ngram", "temperature": 0.8, "seed": 4, "acceptance": "rejection",
                     "schedule": "constant", "schedule_config": {"k": 3}}),
            (CODE, {"drafter": "ngram", "acceptance": "typical", "temperature": 0.6, "seed": 9,
                    "schedule": "heuristic"}),
            (GROUNDED, {"drafter": "ngram", "schedule": "throughput"}),
        ]
        bodies = [{"model": "smollm2:135m", "prompt": p, "raw": True, "stream": False,
                   "options": {"temperature": 0, "num_predict": 40, **o}} for p, o in mix]
        got = together(s, bodies)
        yield "http 8 concurrent mixed policies", "tokens", [g["context"] for g in got]
        schema = {"type": "object", "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
                  "required": ["city", "year"], "additionalProperties": False}
        r = s.post("/v1/chat/completions", {
            "model": "smollm2:135m", "temperature": 0, "max_tokens": 48, "logprobs": True, "top_logprobs": 3,
            "messages": [{"role": "user", "content": "Where and when was the printing press invented?"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
            "drafter": "ngram", "schedule": "constant", "schedule_config": {"k": 4}})
        c = r["choices"][0]
        yield "http structured output + logprobs", "text+logprobs+stats", {
            "content": c["message"]["content"], "logprobs": c["logprobs"], "stats": untimed(r["speculation"])}
    finally:
        s.close()
    tight = Server(exe, work, "--kv-budget", "4000000")
    try:
        bodies = [{"model": "smollm2:135m", "prompt": f"{STORY} ({i})", "raw": True, "stream": False,
                   "options": {"temperature": 0, "num_predict": 120, "drafter": "ngram"}} for i in range(4)]
        got = together(tight, bodies)
        pre = sum(g["speculation"]["preemptions"] for g in got)
        yield "http preemption under --kv-budget 4000000", f"tokens; {pre} preemptions", [g["context"] for g in got]
    finally:
        tight.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("SPECD_BIN", str(ROOT / "target" / "release" / "specd")))
    ap.add_argument("--json", help="also write {name: hash} here")
    ap.add_argument("--only", help="only the entries whose name contains this")
    a = ap.parse_args()
    exe = Path(a.bin)
    # Binaries from before `--kernels` existed run specd's kernels anyway.
    helptext = subprocess.run([str(exe), "--help"], capture_output=True, text=True).stdout
    if "--kernels" not in helptext:
        PIN[:] = ["--weights", "quantized"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        r = Runner(exe, work)
        model_path = r.specd("pull", "--path", "smollm2:135m").stdout.strip()
        gemma = r.specd("pull", "--path", "gemma3:270m").stdout.strip()
        hashes = {}

        def record(name, what, value):
            h = digest(value)[:16]
            hashes[name] = h
            print(f"{h}  {name}  ({what})", flush=True)

        for name, what, run in entries(r, model_path, gemma):
            if a.only and a.only not in name:
                continue
            record(name, what, run())
        if not a.only or "http" in a.only:
            for name, what, value in http_entries(exe, work, model_path):
                record(name, what, value)
        total = digest(hashes)[:16]
        print(f"ALL  {total}")
        if a.json:
            Path(a.json).write_text(json.dumps({"entries": hashes, "all": total}, indent=1))


if __name__ == "__main__":
    main()
