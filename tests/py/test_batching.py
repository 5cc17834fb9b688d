"""Continuous batching over real HTTP (issue 14): requests that share steps
get exactly the tokens they get alone, whatever their drafter, policies,
temperature and seed; a cancelled stream and a hostile policy leave the
others' tokens unchanged; a flood of clients gets answers or clear 503s.

Every request is a short raw `/api/generate`; its final line's `context`
holds prompt + generated token ids, compared token for token.
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from conftest import MODEL, Server, server_bin

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPETITIVE = "red green blue yellow red green blue yellow red green blue yellow red green"
STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
LIST = "The planets of the solar system, in order from the sun, are"
CODE = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"

# (prompt, options): different prompts, lengths, drafters, schedules,
# acceptance policies, temperatures and seeds. Sampled requests use
# fixed-k schedules (or no drafter), so their rounds match their solo runs.
MIX = [
    (REPETITIVE, {"num_predict": 32, "drafter": "none"}),
    (STORY, {"num_predict": 40, "drafter": "ngram", "schedule": "throughput"}),
    (LIST, {"num_predict": 24, "drafter": "self:8", "schedule": "heuristic"}),
    (CODE, {"num_predict": 28, "temperature": 0.8, "seed": 7, "drafter": "none"}),
    (REPETITIVE, {"num_predict": 36, "temperature": 0.7, "seed": 11, "drafter": "ngram",
                  "schedule": "constant", "schedule_config": {"k": 3}, "acceptance": "rejection"}),
    (STORY, {"num_predict": 20, "temperature": 1.0, "seed": 3, "drafter": "self:6",
             "schedule": "heuristic-transient", "acceptance": "rejection"}),
    (LIST, {"num_predict": 30, "temperature": 0.6, "seed": 5, "drafter": "ngram",
            "schedule": "constant", "acceptance": "typical"}),
    (CODE, {"num_predict": 44, "drafter": "ngram", "schedule": "heuristic-transient"}),
]


def generate(server: Server, prompt: str, options: dict, timeout: float = 300) -> dict:
    # Greedy unless the options sample: Ollama's default is temperature 0.8
    # with a fresh seed, which no solo run could reproduce.
    options = {"temperature": 0, **options}
    r = httpx.post(server.url + "/api/generate", timeout=timeout,
                   json={"model": MODEL, "prompt": prompt, "raw": True, "stream": False,
                         "options": options})
    assert r.status_code == 200, r.text
    return r.json()


def together(n: int, fn) -> list:
    """Runs fn(i) for i < n on n threads released at once; results (or
    exceptions) in order."""
    out: list = [None] * n
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            barrier.wait()
            out[i] = fn(i)
        except Exception as e:  # noqa: BLE001
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    return out


@pytest.fixture(scope="module")
def solo(server) -> list[dict]:
    """Each request of MIX run alone, one after another."""
    runs = [generate(server, p, o) for p, o in MIX]
    for r in runs:
        assert r["speculation"]["batch_max_sequences"] == 1, r["speculation"]
        assert r["speculation"]["batch_steps"] == 0
    return runs


def test_eight_mixed_requests_share_steps_and_keep_their_solo_tokens(server, solo):
    runs = together(len(MIX), lambda i: generate(server, *MIX[i]))
    for i, (alone, batched) in enumerate(zip(solo, runs)):
        assert not isinstance(batched, Exception), batched
        assert batched["context"] == alone["context"], f"request {i} ({MIX[i][1]}) changed in a batch"
        assert batched["response"] == alone["response"]
        assert batched["speculation"]["drafter"] == alone["speculation"]["drafter"]
        assert batched["speculation"]["policy_failure"] is None
    # They really ran together: a one-at-a-time scheduler cannot pass this.
    shared = [r["speculation"]["batch_steps"] for r in runs]
    widest = max(r["speculation"]["batch_max_sequences"] for r in runs)
    assert all(s > 0 for s in shared), shared
    assert widest >= 4, [r["speculation"]["batch_max_sequences"] for r in runs]


def test_a_cancelled_stream_and_a_hostile_policy_leave_the_others_unchanged(server, solo):
    wasm = (FIXTURES / "trap-schedule.wasm").read_bytes()
    r = httpx.post(server.url + "/api/policies", params={"name": "batch-trap"}, content=wasm)
    assert r.status_code == 201, r.text
    keep = [0, 1, 4, 6]

    def client(i: int):
        if i < len(keep):
            return generate(server, *MIX[keep[i]])
        if i == len(keep):
            # Leaves mid-stream.
            body = {"model": MODEL, "prompt": STORY, "raw": True, "stream": True,
                    "options": {"num_predict": 500, "drafter": "ngram", "temperature": 0}}
            with httpx.stream("POST", server.url + "/api/generate", json=body, timeout=300) as resp:
                assert resp.status_code == 200
                for n, line in enumerate(resp.iter_lines()):
                    if n == 4:
                        return "left"
            return "ended"
        return generate(server, REPETITIVE, {"num_predict": 24, "schedule": "batch-trap"})

    runs = together(len(keep) + 2, client)
    for j, i in enumerate(keep):
        assert not isinstance(runs[j], Exception), runs[j]
        assert runs[j]["context"] == solo[i]["context"], f"request {i} changed beside a cancel and a trap"
    assert runs[len(keep)] == "left"
    hostile = runs[-1]
    assert hostile["speculation"]["policy_failure"]["kind"] == "trap"
    plain = generate(server, REPETITIVE, {"num_predict": 24, "drafter": "none"})
    assert hostile["context"] == plain["context"]
    assert httpx.delete(server.url + "/api/policies/batch-trap").status_code == 200


def test_thirty_two_clients_with_small_limits_all_get_an_answer(start_server):
    small = start_server("--queue", "4", "--max-sequences", "4")
    expected = generate(small, LIST, {"num_predict": 12})["context"]

    def client(i: int):
        body = {"model": MODEL, "prompt": LIST, "raw": True, "stream": True,
                "options": {"num_predict": 12, "temperature": 0}}
        with httpx.stream("POST", small.url + "/api/generate", json=body, timeout=600) as r:
            if r.status_code == 503:
                assert r.headers["retry-after"]
                assert "busy" in json.loads(r.read())["error"]
                return 503
            assert r.status_code == 200
            last = [json.loads(x) for x in r.iter_lines() if x][-1]
            assert last["done"] and last["context"] == expected
            return 200

    runs = together(32, client)
    assert all(r in (200, 503) for r in runs), runs
    ok, busy = runs.count(200), runs.count(503)
    assert ok + busy == 32
    assert ok >= 4, runs  # the queue alone holds 4
    metrics = httpx.get(small.url + "/metrics", timeout=10).text

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith(name))

    assert total('specd_generations_total{outcome="busy"}') == busy
    assert total('specd_generations_total{outcome="stop"}') + total(
        'specd_generations_total{outcome="length"}') == ok + 1


def test_kv_budget_refuses_a_prompt_over_it_and_preempts_without_changing_tokens(start_server, solo):
    # About 86 tokens of the default model's KV cache: three requests that
    # grow past it take turns (preemption), a prompt past it is refused.
    tight = start_server("--kv-budget", "4000000")
    r = httpx.post(tight.url + "/api/generate", timeout=120,
                   json={"model": MODEL, "prompt": REPETITIVE * 8, "raw": True, "stream": False,
                         "options": {"num_predict": 4}})
    assert r.status_code == 400 and "kv_budget" in r.json()["error"], r.text
    picked = [0, 4, 7]
    runs = together(len(picked), lambda i: generate(tight, *MIX[picked[i]]))
    for j, i in enumerate(picked):
        assert not isinstance(runs[j], Exception), runs[j]
        assert runs[j]["context"] == solo[i]["context"], f"request {i} changed by preemption"
    assert sum(r["speculation"]["preemptions"] for r in runs) >= 1, [r["speculation"] for r in runs]
    metrics = httpx.get(tight.url + "/metrics", timeout=10).text
    assert "specd_preemptions_total" in metrics and "specd_batch_size_bucket" in metrics
    # Two of them speculate: their policies' time shows per step.
    policy = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line.startswith("specd_step_policy_seconds_sum")]
    assert policy and policy[0] > 0, "policy time per step is reported"


def echo(server: Server, prompt: str) -> dict:
    """Scores a prompt as lm-eval does: completions `echo` + `logprobs`,
    nothing generated."""
    r = httpx.post(server.url + "/v1/completions", timeout=300,
                   json={"model": MODEL, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 2})
    assert r.status_code == 200, r.text
    return r.json()


def test_an_echo_request_prefills_in_the_others_steps_with_its_solo_logprobs(server):
    """The prompt's logprobs come from the echo request's own prefill, run in
    the batched steps: a stream decoding meanwhile shares those steps and
    keeps its solo tokens, and the entries are those of the request alone
    (whose prompt, left in the prefix cache, the echo request does not use)."""
    long_prompt = " ".join([STORY, LIST, CODE] * 5)
    other = (STORY, {"num_predict": 96, "drafter": "none"})
    alone = echo(server, long_prompt)
    other_alone = generate(server, *other)
    body = {"model": MODEL, "prompt": other[0], "raw": True, "stream": True,
            "options": {"temperature": 0, **other[1]}}
    with httpx.stream("POST", server.url + "/api/generate", json=body, timeout=300) as resp:
        lines = resp.iter_lines()
        first = next(lines)
        assert not json.loads(first).get("done"), first
        # The other stream is decoding: the echo request joins its steps.
        together = echo(server, long_prompt)
        last = [json.loads(x) for x in lines if x][-1]
    assert last["context"] == other_alone["context"], "the decoding stream keeps its solo tokens"
    assert last["speculation"]["batch_steps"] > 0
    spec = together["speculation"]
    assert spec["cached_tokens"] == 0 and spec["prompt_tokens"] > 100, spec
    assert spec["batch_steps"] > 0, f"the echo prefill should have shared a step: {spec}"
    assert together["choices"][0]["logprobs"] == alone["choices"][0]["logprobs"]
    assert together["choices"][0]["text"] == long_prompt


def test_bench_serve_closed_loop_answers_every_clients_requests():
    """`specd bench serve --requests-per-client R`: each of N clients sends R
    requests, the next as soon as its last one is done, each asking for
    half to all of --max-tokens; the row counts the requests answered."""
    r = subprocess.run([str(server_bin()), "bench", "serve", "--concurrency", "1,3", "--drafters", "none",
                        "--temperatures", "0", "--max-tokens", "8", "--requests-per-client", "3"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"bench serve failed:\n{r.stdout}\n{r.stderr}"
    # mode, drafter, N, requests, prompt tokens, tokens, ..., batch (the
    # most requests a step held).
    rows = {int(m[1]): (int(m[2]), int(m[3]), int(m[4]))
            for m in re.finditer(r"^greedy\s+none\s+(\d+)\s+(\d+)\s+\d+\s+(\d+)(?:\s+[\d.]+){8}\s+(\d+)\s",
                                 r.stdout, re.M)}
    assert set(rows) == {1, 3}, r.stdout
    for n, (requests, tokens, batch) in rows.items():
        assert requests == 3 * n, r.stdout
        assert requests <= tokens <= 8 * requests, r.stdout
        assert batch == n, r.stdout


def test_bench_serve_chat_prompts_answer_the_whole_suite():
    """`specd bench serve --prompts grounded`: requests are `bench spec`'s
    grounded suite as chat turns, and every concurrency's row answers all
    of its 5 prompts (N = 1: 5 requests one after another; N = 3: two per
    client), so rows with and without a drafter compare the same work; the
    suffix drafter finds text to copy in them. Unknown names are refused."""
    r = subprocess.run([str(server_bin()), "bench", "serve", "--prompts", "grounded", "--concurrency", "1,3",
                        "--drafters", "none,suffix", "--temperatures", "0", "--max-tokens", "16"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"bench serve failed:\n{r.stdout}\n{r.stderr}"
    # mode, drafter, N, requests, ..., k (drafts per round): the 19th
    # column; last, tok/s against plain decoding at the same N.
    rows = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) == 24 and f[0] == "greedy":
            rows[(f[1], int(f[2]))] = (int(f[3]), float(f[18]))
            if f[1] == "none":
                assert f[23] == "1.00", line
    assert set(rows) == {("none", 1), ("none", 3), ("suffix", 1), ("suffix", 3)}, r.stdout
    for (drafter, n), (requests, k) in rows.items():
        assert requests == {1: 5, 3: 6}[n], r.stdout
        assert (k > 0) == (drafter == "suffix"), r.stdout
    bad = subprocess.run([str(server_bin()), "bench", "serve", "--prompts", "poems", "--steps-only"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "unknown prompts \"poems\"" in bad.stderr, bad.stderr
