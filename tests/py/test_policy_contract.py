"""Contract specd:policy@0.1.0 and @0.2.0 side by side in one server, over
HTTP with the real model: a 0.1 schedule (the built-in `heuristic`) and 0.2
schedules (the built-in `adaedl`, the test fixture `stop-below` from the
policy directory, which stops the model drafter token by token) serve
concurrent requests; greedy output is the same whichever runs."""
from __future__ import annotations

import shutil
import threading

import httpx

from conftest import MODEL, ROOT

PLUGINS = ROOT / "plugins" / "target" / "wasm32-wasip2" / "release"
PROMPT = "The three primary colors are"


def generate(srv, **options) -> dict:
    options = {"num_predict": 12, "temperature": 0, "repeat_penalty": 1, "drafter": "self:4", **options}
    r = httpx.post(srv.url + "/api/generate", json={"model": MODEL, "prompt": PROMPT, "raw": True,
                                                   "stream": False, "options": options}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_v0_1_and_v0_2_policies_side_by_side(start_server, tmp_path):
    fixture = PLUGINS / "stop_below.wasm"
    assert fixture.exists(), f"{fixture} is missing: cargo build builds the plugins"
    pdir = tmp_path / "policies"
    pdir.mkdir()
    shutil.copy(fixture, pdir / "stop-below.wasm")
    srv = start_server(policy_dir=pdir)

    listed = {p["name"]: p for p in httpx.get(srv.url + "/api/policies").json()["policies"]}
    assert listed["heuristic"]["exports"]["contract"] == "0.1.0"
    assert listed["adaedl"]["exports"]["contract"] == "0.2.0"
    assert listed["stop-below"]["exports"]["contract"] == "0.2.0" and not listed["stop-below"]["builtin"]

    # Concurrent requests, one per contract version and policy.
    cases = {
        "heuristic": {"schedule": "heuristic"},
        "adaedl": {"schedule": "adaedl"},
        # top-1 never reaches 1.01: every round stops after its first draft
        "stop-below": {"schedule": "stop-below", "schedule_config": {"k": 4, "threshold": 1.01}},
    }
    out: dict[str, dict] = {}

    def run(name: str) -> None:
        out[name] = generate(srv, **cases[name])

    threads = [threading.Thread(target=run, args=(n,)) for n in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    plain = generate(srv, drafter="none")
    for name, r in out.items():
        spec = r["speculation"]
        assert spec["schedule"] == name and spec["policy_failure"] is None, spec
        assert spec["drafted"] > 0, spec
        assert r["response"] == plain["response"], name
    # The hook decided: one draft per speculative round, though k = 4.
    s = out["stop-below"]["speculation"]
    assert s["mean_draft"] <= 1.0 and s["drafted"] <= s["rounds"], s
    # A 0.1 schedule is never asked: heuristic drafts its k (4 on the first round).
    assert out["heuristic"]["speculation"]["mean_draft"] > 1.0, out["heuristic"]["speculation"]
