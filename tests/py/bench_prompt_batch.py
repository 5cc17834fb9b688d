#!/usr/bin/env python3
"""One completions request of N token-id prompts (lm-eval's
`local-completions` batch) against the same N prompts as N requests one
after another, on a running `specd serve`: lm-eval's loglikelihood body
(`max_tokens: 1, logprobs: 1, echo: true`) and a greedy generation of 32
tokens. Checks that each prompt's text is the same both ways and reports
the wall times (best of `--trials`), their ratio, and the most prompts one
batched step held. Example:

    target/release/specd serve --port 18126 &
    .venv/bin/python tests/py/bench_prompt_batch.py --url http://127.0.0.1:18126
"""
from __future__ import annotations

import argparse
import time

import httpx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:11435")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--trials", type=int, default=2)
    a = ap.parse_args()
    texts = [f"Question {i}: what is {i} plus {i + 1}? Answer: the sum of these two numbers is"
             for i in range(a.prompts)]
    ids = [httpx.post(a.url + "/tokenize", json={"model": "default", "prompt": t}).json()["tokens"] for t in texts]

    def post(body: dict) -> dict:
        r = httpx.post(a.url + "/v1/completions", timeout=600, json={"model": "default", **body})
        r.raise_for_status()
        return r.json()

    kinds = {
        "loglikelihood": {"temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True},
        "generation 32 tokens": {"temperature": 0, "max_tokens": 32, "seed": 1234, "ignore_eos": True,
                                 "drafter": "none"},
    }
    for name, body in kinds.items():
        post(dict(body, prompt=ids[:1]))  # warm
        best_b = best_s = float("inf")
        for _ in range(a.trials):
            t = time.perf_counter()
            b = post(dict(body, prompt=ids))
            tb = time.perf_counter() - t
            t = time.perf_counter()
            s = [post(dict(body, prompt=[p])) for p in ids]
            ts = time.perf_counter() - t
            best_b, best_s = min(best_b, tb), min(best_s, ts)
            assert [c["text"] for c in b["choices"]] == [x["choices"][0]["text"] for x in s], name
        most = max(x["batch_max_sequences"] for x in b["speculation"])
        print(f"{name}: {a.prompts} prompts in one request {best_b:.2f}s, {a.prompts} requests one after "
              f"another {best_s:.2f}s, ratio {best_s / best_b:.2f}x; batch_max_sequences {most}")


if __name__ == "__main__":
    main()
