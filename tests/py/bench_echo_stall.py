#!/usr/bin/env python3
"""How long a decoding stream stalls while an echo request (completions
`echo` + `logprobs`, the prompt's logprobs: lm-eval's loglikelihood) of a
long prompt is admitted, for one or more `specd` binaries, interleaved in
one run (A B A B ...) so the machine's load hits them alike.

Per trial: a greedy raw `/api/generate` stream decodes; once it has sent
`--warm` tokens, the echo request is posted from a second thread. Reported
per binary (medians over the trials): the stream's median inter-token gap
before the echo, its longest gap while the echo is in flight, and the echo
request's latency; with `--plain`, also for the same prompt sent as a plain
completion of one token (its prefill alone, the floor an echo request's
stall can reach under the same `--step-tokens`). Example:

    .venv/bin/python tests/py/bench_echo_stall.py --bin before=OLD/specd --bin after=target/release/specd --plain
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import Server  # noqa: E402

STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
LIST = "The planets of the solar system, in order from the sun, are"
CODE = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def trial(url: str, model: str, prompt: str, tokens: int, warm: int, kind: str, nonce: int) -> dict:
    body = {"model": model, "prompt": STORY, "raw": True, "stream": True,
            "options": {"temperature": 0, "num_predict": tokens, "drafter": "none"}}
    echo: dict = {}
    # A prompt no earlier request began with: nothing comes from the prefix
    # cache (an echo request skips it; a plain one would hit it).
    prompt = f"Trial {nonce}, {kind}. {prompt}"

    def score() -> None:
        echo["start"] = time.perf_counter()
        req = {"model": model, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
        if kind == "plain":
            # The same prompt without its logprobs: only its prefill.
            req = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        r = httpx.post(url + "/v1/completions", timeout=600, json=req)
        echo["end"] = time.perf_counter()
        r.raise_for_status()
        echo["prompt_tokens"] = r.json()["usage"]["prompt_tokens"]

    arrivals: list[float] = []
    thread = threading.Thread(target=score)
    with httpx.stream("POST", url + "/api/generate", json=body, timeout=600) as resp:
        if resp.status_code != 200:
            raise SystemExit(f"/api/generate: {resp.status_code} {resp.read().decode()}")
        for line in resp.iter_lines():
            if not line or json.loads(line).get("done"):
                continue
            arrivals.append(time.perf_counter())
            if len(arrivals) == warm:
                thread.start()
    if len(arrivals) < warm:
        raise SystemExit(f"the stream sent {len(arrivals)} tokens, fewer than --warm {warm}")
    thread.join()
    if "end" not in echo:
        raise SystemExit("the echo request failed")
    gaps = list(zip(arrivals, arrivals[1:]))
    before = [b - a for a, b in gaps if b <= echo["start"]]
    during = [b - a for a, b in gaps if b > echo["start"] and a < echo["end"]]
    if echo["end"] > arrivals[-1]:
        raise SystemExit(f"the stream ended before the echo request: raise --tokens above {tokens}")
    return {
        "itl_before": statistics.median(before),
        "max_gap_during": max(during),
        "echo_seconds": echo["end"] - echo["start"],
        "prompt_tokens": echo["prompt_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True, help="NAME=PATH of a specd binary")
    ap.add_argument("--model", default="smollm2:135m")
    ap.add_argument("--repeat", type=int, default=29, help="copies of the prompt text (about 52 tokens each)")
    ap.add_argument("--tokens", type=int, default=400, help="tokens the decoding stream asks for")
    ap.add_argument("--warm", type=int, default=20, help="tokens streamed before the echo request")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--plain", action="store_true", help="also time the prompt as a plain completion")
    ap.add_argument("serve_args", nargs="*", help="extra `specd serve` flags (after --)")
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.bin]
    prompt = " ".join([STORY, LIST, CODE] * a.repeat)
    kinds = ["echo", "plain"] if a.plain else ["echo"]
    results: dict[tuple[str, str], list[dict]] = {(n, k): [] for n, _ in bins for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        servers = {}
        try:
            for name, exe in bins:
                d = Path(tmp) / name
                d.mkdir()
                servers[name] = Server(*a.serve_args, policy_dir=d / "policies", log=d / "serve.log",
                                       exe=Path(exe)).start()
            for nonce in range(a.trials):
                for name, _ in bins:
                    for kind in kinds:
                        results[(name, kind)].append(
                            trial(servers[name].url, a.model, prompt, a.tokens, a.warm, kind, nonce))
        finally:
            for srv in servers.values():
                srv.stop()
    print(f"{'binary':<8} {'kind':<6} {'prompt':>6} {'itl_before_ms':>13} {'max_gap_during_ms':>17} {'req_s':>7}")
    for (name, kind), rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{name:<8} {kind:<6} {int(med['prompt_tokens']):>6} {1000 * med['itl_before']:>13.1f} "
              f"{1000 * med['max_gap_during']:>17.1f} {med['echo_seconds']:>7.2f}")


if __name__ == "__main__":
    main()
