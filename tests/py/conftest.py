"""Shared fixtures for the HTTP tests: start `specd serve` subprocesses.

Environment: SPECD_BIN and SPECD_HOME, as in specd_paths.py.  A missing
binary or model fails the tests (never skips).
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from specd_paths import GEMMA, MODEL, ROOT, model_path, server_bin  # noqa: F401  (re-exported)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_until_up(proc: subprocess.Popen, url: str, timeout: float, log, path: str = "/health",
                  what: str = "the server") -> None:
    """Polls `url + path` until it answers 200; fails with `log()` (the
    process's log) when `proc` exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}:\n{log()}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} did not come up in {timeout}s:\n{log()}")


class Server:
    """A `specd serve` process on a free port; `url` once it answers /health."""

    def __init__(self, *args: str, policy_dir: Path, log: Path, exe: Path | None = None):
        self.exe = exe or server_bin()
        self.args = list(args)
        self.policy_dir = policy_dir
        self.log_path = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180.0) -> "Server":
        exe = self.exe
        assert exe.exists(), f"{exe} is missing: build it first (cargo build --release -p specd)"
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(exe), "serve", "--port", str(self.port), "--policy-dir", str(self.policy_dir), *self.args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until_up(self.proc, self.url, timeout, self.log, what="specd serve")
        except AssertionError:
            self.stop()
            raise
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc, 15)
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture(scope="session")
def start_server(tmp_path_factory):
    """Factory: start_server(*args, policy_dir=None) -> started Server (stopped at session end)."""
    started: list[Server] = []

    def start(*args: str, policy_dir: Path | None = None) -> Server:
        d = tmp_path_factory.mktemp("specd-serve")
        s = Server(*args, policy_dir=policy_dir or d / "policies", log=d / "serve.log")
        started.append(s)
        return s.start()

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="module")
def server(start_server) -> Server:
    """One server (default settings) shared by a test module."""
    return start_server()


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    """The Gemma 3 model (test_gemma*.py), fetched when missing."""
    try:
        return model_path(GEMMA)
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{GEMMA}: {e}")
