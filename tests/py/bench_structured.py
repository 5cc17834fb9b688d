"""Benchmark: the cost of structured output (constrained decoding) against
unconstrained decoding, with and without speculation, on the same prompts.

    .venv/bin/python tests/py/bench_structured.py [--rounds 3] [--schemas 8]

Each round runs every schema's prompt four ways, interleaved (constrained or
not x drafter none or ngram), greedy, through /v1/chat/completions, and adds
up the server's own generated tokens and decode seconds. An unconstrained run
gets as many tokens as the constrained answer had (max_tokens), so both
decode the same number of tokens at the same context lengths. Reports decode
tok/s per way and the ratios constrained / unconstrained within each drafter.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import MODEL, Server  # noqa: E402
from test_structured import SCHEMAS  # noqa: E402


def run(url: str, schema: dict, drafter: str, constrained: bool, tokens: int = 160) -> tuple[int, float, int]:
    prompt = f"Answer with a JSON object that follows this schema: {json.dumps(schema)}"
    body = {"model": MODEL, "max_tokens": tokens, "temperature": 0, "drafter": drafter,
            "messages": [{"role": "user", "content": prompt}]}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    s = r.json()["speculation"]
    return s["generated_tokens"], s["decode_seconds"], s["drafted"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--schemas", type=int, default=8)
    a = ap.parse_args()
    ways = [(d, c) for d in ("none", "ngram") for c in (False, True)]
    tot = {w: [0, 0.0, 0] for w in ways}
    d = Path(tempfile.mkdtemp(prefix="specd-bench-structured-"))
    with Server(policy_dir=d / "policies", log=d / "serve.log") as srv:
        for schema in SCHEMAS[: a.schemas]:  # warm-up: grammar engine, caches
            run(srv.url, schema, "none", True)
        for _ in range(a.rounds):
            for schema in SCHEMAS[: a.schemas]:
                for drafter in ("none", "ngram"):
                    n = None
                    for c in (True, False):
                        got, sec, drafted = run(srv.url, schema, drafter, c, n or 160)
                        n = n or got
                        w = (drafter, c)
                        tot[w][0] += got
                        tot[w][1] += sec
                        tot[w][2] += drafted
    tps = {w: t[0] / t[1] for w, t in tot.items()}
    for (drafter, c), t in tot.items():
        print(f"drafter={drafter:5} constrained={c!s:5}: {t[0]:5d} tokens, {t[1]:7.2f} s, "
              f"{tps[(drafter, c)]:7.1f} tok/s, drafted {t[2]}")
    for drafter in ("none", "ngram"):
        print(f"drafter={drafter}: constrained / unconstrained tok/s = "
              f"{tps[(drafter, True)] / tps[(drafter, False)]:.3f}")
    print(f"constrained: ngram / none tok/s = {tps[('ngram', True)] / tps[('none', True)]:.3f}")


if __name__ == "__main__":
    main()
