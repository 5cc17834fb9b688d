"""A model across processes (issue 54): pipeline ranks over MLX's ring
backend, two ranks on loopback, one kernel thread each.

- `generate` on 2 ranks prints what 1 rank prints, byte for byte: plain,
  each speculative drafter (`ngram`, `suffix`, `self:N`), and seeded
  sampling; once through `mlx.launch` itself.
- Each rank holds about half the weight bytes (rank 0: the embedding, the
  head and the first layers; rank 1 only the rest).
- Over HTTP: 4 concurrent requests with different policies each equal
  their solo runs on 1 rank.
- Killing rank 1 mid-request: rank 0 fails the request with an error,
  `/health` answers 503, and rank 0 exits within 10 s. The ranks are
  started here (MLX_RANK, MLX_HOSTFILE set by the test, no launcher), so
  the detection is specd's own.
- Ranks that disagree (flags) or a rank that never comes refuse to run
  with a clear error.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import MODEL, ROOT, free_port, server_bin, stop_process, wait_until_up

ENV = {"SPECD_THREADS": "1"}
PROMPT = "Write a short story about a robot who learns to paint. Repeat the title twice."
HELD = re.compile(r"rank (\d)/2: layers (\d+)\.\.(\d+) of (\d+), (\d+) weight bytes held")


def hostfile(tmp: Path, ranks: int = 2) -> Path:
    f = tmp / "hosts.json"
    f.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(ranks)]))
    return f


def start_rank(rank: int, hosts: Path, args: list[str], log: Path, **env: str) -> subprocess.Popen:
    """Rank `rank` of 2 running `specd ARGS`; stdout piped on a generating rank 0."""
    e = {**os.environ, **ENV, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hosts), **env}
    piped = rank == 0 and args[0] != "serve"
    return subprocess.Popen([str(server_bin()), *args], env=e, stderr=open(log, "w"),
                            stdout=subprocess.PIPE if piped else subprocess.DEVNULL)


def generate_ranks(tmp: Path, args: list[str], ranks: int = 2) -> tuple[str, ...]:
    """`specd generate ARGS` on `ranks` ranks: rank 0's stdout, then each
    rank's stderr."""
    hosts = hostfile(tmp, ranks)
    cmd = ["generate", *args]
    later = [start_rank(r, hosts, cmd, tmp / f"r{r}.log") for r in range(1, ranks)]
    r0 = start_rank(0, hosts, cmd, tmp / "r0.log")
    out, _ = r0.communicate(timeout=300)
    for r, p in enumerate(later, 1):
        assert p.wait(timeout=30) == 0, (tmp / f"r{r}.log").read_text()
    assert r0.returncode == 0, (tmp / "r0.log").read_text()
    return out.decode(), *((tmp / f"r{r}.log").read_text() for r in range(ranks))


def generate_solo(args: list[str]) -> str:
    p = subprocess.run([str(server_bin()), "generate", *args], capture_output=True, text=True,
                       env={**os.environ, **ENV}, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("extra", [
    ["--drafter", "none"],
    ["--drafter", "ngram"],
    ["--drafter", "suffix"],
    ["--drafter", "self:4"],
    # Sampled: a fixed-k schedule, so its rounds (and draws) do not depend
    # on measured time.
    ["--drafter", "ngram", "--schedule", "constant", "--temperature", "0.8", "--seed", "7"],
], ids=["plain", "ngram", "suffix", "self4", "sampled"])
def test_generate_on_two_ranks_equals_one(tmp_path, extra):
    args = ["--chat", "--max-tokens", "64", *extra, PROMPT]
    solo = generate_solo(args)
    two, log0, log1 = generate_ranks(tmp_path, args)
    assert len(solo) > 100
    assert two == solo
    # The rows really went around: rank 1 ran its layers for every step.
    steps = re.search(r"rank 1: stopped after (\d+) frames", log1)
    assert steps and int(steps.group(1)) > 10, log1


def test_gemma_past_its_window_on_two_ranks(tmp_path, gemma_path):
    # A prompt near Gemma's 512-token window, then speculation across it:
    # rank 1's rotating caches wrap, and rounds that reject drafts restore
    # the snapshots rank 0 asked for.
    # 470 tokens; n-gram drafts of the next number are partly wrong.
    prompt = "Count: " + ", ".join(str(i) for i in range(1, 116)) + ","
    args = ["--model", str(gemma_path), "--max-tokens", "96", "--drafter", "ngram", prompt]
    solo = generate_solo(args)
    two, log0, log1 = generate_ranks(tmp_path, args)
    assert two == solo and len(solo) > 90
    restores = re.search(r"(\d+) rotating-cache restores", log1)
    assert restores and int(restores.group(1)) > 0, log1


def test_three_ranks_equal_one(tmp_path):
    # A middle rank forwards each frame's description and runs its layers.
    args = ["--chat", "--max-tokens", "48", "--drafter", "suffix", PROMPT]
    solo = generate_solo(args)
    two, *logs = generate_ranks(tmp_path, args, ranks=3)
    assert two == solo
    for r, log in enumerate(logs):
        assert f"rank {r}/3: layers" in log, log
    assert re.search(r"rank 2: stopped after [1-9]\d* frames", logs[2]), logs[2]


def test_each_rank_holds_its_share_of_the_weights(tmp_path):
    _, log0, log1 = generate_ranks(tmp_path, ["--max-tokens", "4", "Hello"])
    held = {}
    for log in (log0, log1):
        m = HELD.search(log)
        assert m, log
        held[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)))
    (a0, b0, n, w0), (a1, b1, _, w1) = held[0], held[1]
    assert (a0, b1) == (0, n) and b0 == a1, held
    share = (w0 + w1) / 2
    for w in (w0, w1):
        assert abs(w - share) <= 0.10 * share, held
    # --layers overrides the split, the same flag on both ranks.
    _, log0, log1 = generate_ranks(tmp_path, ["--layers", "14,16", "--max-tokens", "4", "Hello"])
    assert "layers 0..14 of 30" in log0 and "layers 14..30 of 30" in log1


def test_mlx_launch_starts_the_ranks(tmp_path):
    args = ["--max-tokens", "24", "--drafter", "ngram", "The capital of France is"]
    solo = generate_solo(args)
    launch = Path(sys.executable).with_name("mlx.launch")
    p = subprocess.run([str(launch), "-n", "2", "--backend", "ring", "--starting-port", str(free_port()),
                        str(server_bin()), "generate", *args], capture_output=True, text=True,
                       env={**os.environ, **ENV}, timeout=300)
    assert p.returncode == 0, p.stderr
    assert solo in p.stdout and "rank 1/2" in p.stderr, (p.stdout, p.stderr)


def test_a_drafter_rank_zero_cannot_run_is_refused_at_start(tmp_path):
    hosts = hostfile(tmp_path)
    cmd = ["generate", "--drafter", "self:20", "--max-tokens", "4", "Hello"]
    r1 = start_rank(1, hosts, cmd, tmp_path / "r1.log")
    r0 = start_rank(0, hosts, cmd, tmp_path / "r0.log")
    r0.communicate(timeout=120)
    r1.wait(timeout=30)
    log = (tmp_path / "r0.log").read_text()
    assert r0.returncode == 1 and "N must be in 1..=8" in log, log
    assert r1.returncode == 0, (tmp_path / "r1.log").read_text()


def test_ranks_that_disagree_refuse_to_run(tmp_path):
    hosts = hostfile(tmp_path)
    r1 = start_rank(1, hosts, ["--weights", "int8", "generate", "Hello"], tmp_path / "r1.log")
    r0 = start_rank(0, hosts, ["generate", "Hello"], tmp_path / "r0.log")
    r0.communicate(timeout=120)
    r1.wait(timeout=30)
    for r, log in ((r0, "r0.log"), (r1, "r1.log")):
        text = (tmp_path / log).read_text()
        assert r.returncode == 1 and "do not run the same model and flags" in text and "weights" in text, text


def test_a_rank_that_never_comes_is_an_error(tmp_path):
    hosts = hostfile(tmp_path)
    t0 = time.monotonic()
    r0 = start_rank(0, hosts, ["generate", "Hello"], tmp_path / "r0.log", SPECD_RANK_CONNECT_SECONDS="3")
    r0.communicate(timeout=60)
    log = (tmp_path / "r0.log").read_text()
    assert r0.returncode != 0 and "did not all connect within 3 s" in log, log
    assert time.monotonic() - t0 < 30


class Ranks:
    """`specd serve` on 2 ranks (rank 0 serves HTTP)."""

    def __init__(self, tmp: Path, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        hosts = hostfile(tmp)
        cmd = ["serve", "--port", str(self.port), "--policy-dir", str(tmp / "policies"), *args]
        self.logs = (tmp / "serve0.log", tmp / "serve1.log")
        self.r1 = start_rank(1, hosts, cmd, self.logs[1])
        self.r0 = start_rank(0, hosts, cmd, self.logs[0])
        wait_until_up(self.r0, self.url, 180, self.logs[0].read_text, what="rank 0")

    def stop(self):
        stop_process(self.r0, 30)
        stop_process(self.r1, 30)


def chat(url: str, options: dict, **extra) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 48,
            "temperature": 0, "seed": 0, **options, **extra}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


REQUESTS = [
    ({"drafter": "none"}, {}),
    ({"drafter": "ngram", "schedule": "heuristic"}, {}),
    ({"drafter": "suffix"}, {}),
    ({"drafter": "self:4", "schedule": "constant"}, {}),
    # Sampled: a fixed-k schedule, so its rounds (and draws) do not
    # depend on measured time.
    ({"drafter": "ngram", "schedule": "constant"}, {"temperature": 0.7, "seed": 11}),
]


@pytest.fixture(scope="module")
def solo(start_server):
    """One process, for the answers the ranks must give."""
    return start_server()


@pytest.fixture(scope="module")
def want(solo) -> list[str]:
    """Each of REQUESTS answered by one process alone."""
    return [chat(solo.url, o, **e) for o, e in REQUESTS]


def test_concurrent_requests_over_http_equal_one_rank(tmp_path, want):
    ranks = Ranks(tmp_path)
    try:
        with ThreadPoolExecutor(len(REQUESTS)) as ex:
            got = list(ex.map(lambda oe: chat(ranks.url, oe[0], **oe[1]), REQUESTS))
        assert got == want
        # Again, alone, now that the prefix cache holds their prompts.
        assert chat(ranks.url, *REQUESTS[1][:1]) == want[1]
    finally:
        ranks.stop()
    assert ranks.r0.returncode == 0, ranks.logs[0].read_text()
    # Rank 0's drain tells rank 1 to stop: it exits cleanly.
    assert ranks.r1.wait(timeout=30) == 0, ranks.logs[1].read_text()


def test_preemption_on_two_ranks_keeps_the_tokens(tmp_path, solo):
    # About 86 tokens of KV cache in all (--kv-budget counts every rank's
    # layers): three short prompts start together and, growing, take turns.
    short = [{"messages": [{"role": "user", "content": q}], "max_tokens": 40}
             for q in ("Tell me a story.", "Name three colors.", "Count to ten.")]
    options = [REQUESTS[i][0] for i in (0, 1, 2)]
    want = [chat(solo.url, o, **b) for o, b in zip(options, short)]
    ranks = Ranks(tmp_path, "--kv-budget", "4000000")
    try:
        with ThreadPoolExecutor(len(short)) as ex:
            got = list(ex.map(lambda ob: chat(ranks.url, ob[0], **ob[1]), zip(options, short)))
        metrics = httpx.get(ranks.url + "/metrics", timeout=10).text
    finally:
        ranks.stop()
    assert got == want
    preempted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                    if line.startswith("specd_preemptions_total"))
    assert preempted >= 1, metrics


def test_killing_rank_one_mid_request_fails_it_and_ends_rank_zero(tmp_path):
    ranks = Ranks(tmp_path)
    health: list[int | str] = []

    def poll():
        while ranks.r0.poll() is None:
            try:
                health.append(httpx.get(ranks.url + "/health", timeout=1).status_code)
            except httpx.HTTPError as e:
                health.append(type(e).__name__)
            time.sleep(0.05)

    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 4000, "ignore_eos": True, "stream": True, "temperature": 0}
    events, killed, watcher = [], None, threading.Thread(target=poll)
    try:
        with httpx.stream("POST", ranks.url + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                    if len(events) == 10:
                        ranks.r1.kill()
                        killed = time.monotonic()
                        watcher.start()
        ranks.r0.wait(timeout=10)
        exited = time.monotonic() - killed
    finally:
        ranks.stop()
    watcher.join()
    # The stream ended with an error event naming the lost rank, not a cut.
    errors = [json.loads(e) for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert errors and "rank of the pipeline group was lost" in errors[0]["error"]["message"], events[-3:]
    assert len(events) < 4000
    assert ranks.r0.returncode == 1 and exited < 10, (exited, ranks.logs[0].read_text())
    assert 503 in health and 200 not in health[health.index(503):], health


def test_layers_outside_ranks_is_an_error():
    for args in (["generate", "--layers", "14,16", "Hello"], ["bench", "decode", "--layers", "14,16"]):
        p = subprocess.run([str(server_bin()), *args], capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if not k.startswith("MLX_")})
        assert p.returncode == 1 and "pipeline ranks" in p.stderr, (args, p.stderr)
