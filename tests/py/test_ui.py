"""The `/ui` comparison page, in headless Chromium (Debian's `chromium`)
against a running `specd serve`: it runs one prompt under two policies and
draws both charts (draft length and accepted drafts per round) with a series
per policy.  Also: `options.trace_rounds` streams `{"round": ...}` lines.

Chromium is driven over the DevTools protocol on a pipe
(`--remote-debugging-pipe`: NUL-terminated JSON on fds 3/4), stdlib only.
The screenshot is kept as a test artifact: $SPECD_ARTIFACTS (default
target/test-artifacts)/ui.png.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from conftest import MODEL, ROOT, stop_process


def test_trace_rounds_streams_round_lines(server):
    body = {
        "model": MODEL,
        "prompt": "Repeat exactly: one two three four five six",
        "stream": True,
        "options": {"trace_rounds": True, "num_predict": 24, "drafter": "ngram",
                    "schedule": "constant", "schedule_config": {"k": 3}},
    }
    with httpx.stream("POST", server.url + "/api/generate", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = [json.loads(x) for x in r.iter_lines() if x.strip()]
    rounds = [x["round"] for x in lines if "round" in x]
    final = lines[-1]
    assert final["done"] is True
    spec = final["speculation"]
    assert len(rounds) == spec["rounds"]
    assert sum(r["drafted"] for r in rounds) == spec["drafted"]
    assert sum(r["accepted"] for r in rounds) == spec["accepted"]
    assert all(r["k"] <= 3 and r["accepted"] <= r["drafted"] for r in rounds)
    # Off by default.
    body["options"].pop("trace_rounds")
    with httpx.stream("POST", server.url + "/api/generate", json=body, timeout=120) as r:
        assert not any("round" in json.loads(x) for x in r.iter_lines() if x.strip())


class Cdp:
    """A minimal DevTools-protocol client over --remote-debugging-pipe."""

    def __init__(self, exe: str):
        self.user_dir = tempfile.mkdtemp(prefix="specd-chromium-")
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={self.user_dir}",
             "--remote-debugging-pipe", "--window-size=1200,900", "about:blank"],
            # The pipe ends become fds 3 and 4 (os.dup2 makes them
            # inheritable; close_fds would close them after preexec_fn).
            close_fds=False,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=lambda: (os.dup2(to_chrome_r, 3), os.dup2(from_chrome_w, 4)),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self._id:
                if "error" in m:
                    raise AssertionError(f"{method}: {m['error']}")
                return m.get("result", {})

    def _read(self) -> dict:
        while b"\0" not in self._buf:
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise AssertionError("chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def open(self, url: str) -> str:
        """A new page at `url`; returns its session id."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        return session

    def js(self, session: str, expr: str):
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=session)
        return r.get("result", {}).get("value")

    def settle(self, session: str, seconds: float) -> tuple[str | None, dict]:
        """Waits until the page's phase is done or error: (phase, its state)."""
        deadline = time.monotonic() + seconds
        phase = None
        while time.monotonic() < deadline:
            phase = self.js(session, "document.body && document.body.dataset.phase")
            if phase in ("done", "error"):
                break
            time.sleep(0.3)
        return phase, json.loads(self.js(session, "document.getElementById('state').textContent") or "{}")

    def close(self) -> None:
        stop_process(self.proc, 10)
        shutil.rmtree(self.user_dir, ignore_errors=True)


def test_ui_page_compares_two_policies_in_headless_chromium(server):
    exe = shutil.which("chromium")
    assert exe, "chromium is missing (apt-get install -y chromium)"
    page = httpx.get(server.url + "/ui", timeout=10)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]

    url = (server.url + "/ui?autorun=1&num_predict=32"
           + "&A=ngram/throughput/greedy&B=ngram/constant/greedy&B_config=%7B%22k%22%3A2%7D")
    cdp = Cdp(exe)
    try:
        session = cdp.open(url)

        def js(expr: str):
            return cdp.js(session, expr)

        phase, state = cdp.settle(session, 300)
        assert phase == "done", f"page phase {phase!r}, state {state}"

        artifacts = Path(os.environ.get("SPECD_ARTIFACTS", ROOT / "target" / "test-artifacts"))
        artifacts.mkdir(parents=True, exist_ok=True)
        shot = cdp.send("Page.captureScreenshot", {"format": "png"}, session=session)
        (artifacts / "ui.png").write_bytes(base64.b64decode(shot["data"]))

        for side, schedule in (("A", "throughput"), ("B", "constant")):
            run = state["runs"][side]
            assert run["done"] and run["error"] is None, run
            assert run["options"]["schedule"] == schedule
            assert run["text"], f"{side} streamed no text"
            assert len(run["rounds"]) == run["stats"]["rounds"] > 0
            assert sum(r["drafted"] for r in run["rounds"]) == run["stats"]["drafted"]
        assert all(r["k"] <= 2 for r in state["runs"]["B"]["rounds"])
        # Both charts hold one series per policy, with a point per round.
        for chart in ("chart-k", "chart-acc"):
            series = js(f"""[...document.querySelectorAll('#{chart} polyline.series')]
                .map(p => [p.dataset.side, +p.dataset.points, p.getAttribute('points').split(' ').length])""")
            assert sorted(s[0] for s in series) == ["A", "B"], (chart, series)
            for side, n, pts in series:
                assert n == pts == len(state["runs"][side]["rounds"]), (chart, series)
        assert (artifacts / "ui.png").stat().st_size > 5000
    finally:
        cdp.close()
