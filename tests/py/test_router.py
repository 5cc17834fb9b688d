"""Three `specd serve` replicas behind `vllm-router` (issue 53): real
processes on loopback, the router from PyPI (pinned in requirements.txt).

- The `openai` and `ollama` clients, streaming and not, get answers through
  the router, and the greedy text is a direct request's.
- Under load through the router, a replica that gets SIGTERM drains and no
  request fails; restarted on its port it rejoins (health 503 -> 200) and
  serves again. A replica that gets SIGKILL fails only requests that were
  running on it, each with a clean error.

Router flags used: `--policy round_robin`, `--health-check-interval-secs 1`,
`--health-failure-threshold 1`, `--health-success-threshold 1`,
`--retry-max-retries 5` (the router retries a 503 from a draining replica
on another one).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from conftest import MODEL, Server, free_port, stop_process, wait_until_up

QUESTIONS = ["What is the capital of France?", "Name three colors.", "What do bees make?",
             "Say hello in Spanish.", "Name a planet.", "What is 2 + 2?"]
GREEDY = {"temperature": 0, "seed": 0}
MAX_TOKENS = 40


def router_bin() -> Path:
    exe = Path(sys.executable).parent / "vllm-router"
    assert exe.exists(), f"{exe} is missing: make test installs vllm-router (tests/py/requirements.txt)"
    return exe


class Cluster:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.replicas = [self.replica(i) for i in range(3)]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "router.log", "ab")
        self.router = subprocess.Popen(
            [str(router_bin()), "--host", "127.0.0.1", "--port", str(self.port),
             "--worker-urls", *[r.url for r in self.replicas], "--policy", "round_robin",
             "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
             "--health-success-threshold", "1", "--retry-max-retries", "5",
             "--retry-initial-backoff-ms", "200", "--log-level", "warning",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_until_up(self.router, self.url, 120, self.router_log, path="/v1/models",
                      what="vllm-router")

    def replica(self, i: int, port: int | None = None) -> Server:
        d = self.tmp / f"replica{i}-{time.monotonic_ns()}"
        d.mkdir()
        s = Server("--drain-seconds", "60", policy_dir=d / "policies", log=d / "serve.log")
        if port:
            s.port, s.url = port, f"http://127.0.0.1:{port}"
        return s.start()

    def router_log(self) -> str:
        return (self.tmp / "router.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        stop_process(self.router, 10)
        self.log.close()
        for r in self.replicas:
            r.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("router"))
    yield c
    c.stop()


def ask(url: str, q: str) -> tuple[int, str]:
    try:
        r = httpx.post(url + "/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": q}],
            "max_tokens": MAX_TOKENS, **GREEDY}, timeout=300)
    except httpx.HTTPError as e:
        return -1, repr(e)
    if r.status_code != 200:
        return r.status_code, r.text
    return 200, r.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def expected(cluster) -> dict:
    return {q: ask(cluster.replicas[0].url, q)[1] for q in QUESTIONS}


def served(replica: Server) -> int:
    """Chat requests the replica answered with 200 (its own metrics)."""
    m = httpx.get(replica.url + "/metrics", timeout=10).text
    found = re.search(r'^specd_http_requests_total\{route="/v1/chat/completions",status="200"\} (\d+)', m, re.M)
    return int(found.group(1)) if found else 0


def test_clients_through_the_router(cluster, expected):
    oa = openai.OpenAI(base_url=cluster.url + "/v1", api_key="unused", max_retries=0)
    ol = ollama.Client(host=cluster.url)
    before = [served(r) for r in cluster.replicas]
    for q in QUESTIONS:
        msgs = [{"role": "user", "content": q}]
        r = oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=MAX_TOKENS, **GREEDY)
        assert r.choices[0].message.content == expected[q]
        streamed = "".join(c.choices[0].delta.content or "" for c in oa.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=MAX_TOKENS, stream=True, **GREEDY) if c.choices)
        assert streamed == expected[q]
        opts = {"temperature": 0, "seed": 0, "repeat_penalty": 1.0, "num_predict": MAX_TOKENS}
        assert ol.chat(model=MODEL, messages=msgs, options=opts)["message"]["content"] == expected[q]
        parts = ol.chat(model=MODEL, messages=msgs, options=opts, stream=True)
        assert "".join(p["message"]["content"] for p in parts) == expected[q]
    # Round robin: every replica answered some of them.
    after = [served(r) for r in cluster.replicas]
    assert all(a > b for a, b in zip(after, before)), (before, after)


def load(cluster, n: int, during) -> list:
    """`n` requests through the router from 4 clients; `during()` runs once
    the first few have been answered."""
    with ThreadPoolExecutor(4) as ex:
        futures = [ex.submit(ask, cluster.url, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]
        while sum(f.done() for f in futures) < 4:
            time.sleep(0.05)
        during()
        return [(QUESTIONS[i % len(QUESTIONS)], f.result()) for i, f in enumerate(futures)]


def test_a_draining_replica_loses_nothing_and_rejoins(cluster, expected):
    b = cluster.replicas[1]

    def sigterm():
        b.proc.send_signal(signal.SIGTERM)

    results = load(cluster, 30, sigterm)
    failed = [(q, r) for q, r in results if r != (200, expected[q])]
    assert not failed, failed[:3]
    assert b.proc.wait(90) == 0, b.log()
    # Restarted on its port: the router's health check sees 503 -> 200 and
    # sends it requests again.
    port = b.port
    cluster.replicas[1] = b = cluster.replica(1, port)
    time.sleep(2.5)
    before = served(b)
    for q in QUESTIONS * 2:
        assert ask(cluster.url, q) == (200, expected[q])
    assert served(b) > before, cluster.router_log()


def test_a_killed_replica_fails_only_what_ran_on_it(cluster, expected):
    c = cluster.replicas[2]
    in_flight = {}

    def sigkill():
        m = httpx.get(c.url + "/metrics", timeout=10).text
        running = re.search(r"^specd_running (\d+)", m, re.M)
        queued = re.search(r"^specd_queue_depth (\d+)", m, re.M)
        in_flight["n"] = int(running.group(1)) + int(queued.group(1))
        os.kill(c.proc.pid, signal.SIGKILL)

    t0 = time.monotonic()
    results = load(cluster, 30, sigkill)
    failed = [(q, r) for q, r in results if r != (200, expected[q])]
    # At most what was on it when it died (4 clients: at most 4), each a
    # clean HTTP error from the router, none hung.
    assert len(failed) <= max(in_flight["n"], 0) + 1 and len(failed) <= 4, (in_flight, failed)
    for _, (code, _) in failed:
        assert code >= 500, failed
    assert time.monotonic() - t0 < 240
    c.proc.wait(10)


def test_api_keys_work_through_the_router(tmp_path):
    s = Server("--api-key", "router-key", policy_dir=tmp_path / "policies", log=tmp_path / "serve.log").start()
    port = free_port()
    log = open(tmp_path / "router.log", "ab")
    router = subprocess.Popen(
        [str(router_bin()), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", s.url,
         "--policy", "round_robin", "--log-level", "warning",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/v1/models", headers={"authorization": "Bearer router-key"},
                             timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and router.poll() is None
            time.sleep(0.2)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=60).status_code == 401
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60,
                       headers={"authorization": "Bearer router-key"})
        assert r.status_code == 200, r.text
    finally:
        stop_process(router, 10)
        log.close()
        s.stop()


def test_clients_through_the_sglang_gateway(tmp_path, expected):
    """The SGLang model gateway (sglang-router, pinned) in front of two replicas."""
    replicas = [Server(policy_dir=tmp_path / f"p{i}", log=tmp_path / f"serve{i}.log").start()
                for i in range(2)]
    port = free_port()
    log = open(tmp_path / "gateway.log", "ab")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
         "--worker-urls", *[r.url for r in replicas], "--policy", "round_robin",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and gateway.poll() is None, \
                (tmp_path / "gateway.log").read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        oa = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for q in QUESTIONS[:4]:
            msgs = [{"role": "user", "content": q}]
            r = oa.chat.completions.create(model=MODEL, messages=msgs, max_tokens=MAX_TOKENS, **GREEDY)
            assert r.choices[0].message.content == expected[q]
            streamed = "".join(c.choices[0].delta.content or "" for c in oa.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=MAX_TOKENS, stream=True, **GREEDY) if c.choices)
            assert streamed == expected[q]
        assert all(served(r) > 0 for r in replicas)
    finally:
        stop_process(gateway, 10)
        log.close()
        for r in replicas:
            r.stop()
