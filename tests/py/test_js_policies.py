"""The JavaScript policies end to end (issue 17): built by
scripts/build-js-plugins.sh (`make test` runs it first) into
plugins/target/js, used through `specd generate --policy-dir`, uploaded
through POST /api/policies, and selected by name over HTTP; and the
JavaScript section of docs/policies.md, run as written.

Greedy output must not depend on the policies: the JavaScript `heuristic`
and `rejection` give the same text as plain decoding (`--drafter none`).
The first run compiles each ~12 MB component (seconds of Cranelift, once:
the compiled form is cached under $SPECD_HOME/policies/cache).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx

from conftest import ROOT, server_bin
from test_python_policies import generate, raw_generate

JS_PLUGINS = ROOT / "plugins" / "target" / "js"


def js_component(name: str) -> Path:
    p = JS_PLUGINS / f"{name}.wasm"
    assert p.is_file(), f"{p} is missing: run scripts/build-js-plugins.sh (`make test` does)"
    return p


def test_generate_with_js_policies_matches_plain_decoding(tmp_path):
    pdir = tmp_path / "policies"
    pdir.mkdir()
    for name in ("heuristic-js", "rejection-js"):
        shutil.copy(js_component(name), pdir / f"{name}.wasm")
    plain, _ = generate("--drafter", "none", stats=tmp_path / "plain.json")
    text, stats = generate("--policy-dir", pdir, "--schedule", "heuristic-js", "--acceptance", "rejection-js",
                           stats=tmp_path / "js.json")
    assert text == plain
    assert stats["schedule"] == "heuristic-js" and stats["acceptance"] == "rejection-js"
    assert stats["policy_failure"] is None, stats["policy_failure"]
    assert stats["drafted"] > 0 and stats["accepted"] > 0, stats
    # the same rounds as the built-in heuristic (the JavaScript port decides alike)
    _, rust = generate("--schedule", "heuristic", "--acceptance", "rejection", stats=tmp_path / "rs.json")
    assert (stats["rounds"], stats["drafted"], stats["accepted"]) == (rust["rounds"], rust["drafted"], rust["accepted"])


def test_js_policies_over_http_from_the_policy_dir_and_by_upload(start_server, tmp_path):
    pdir = tmp_path / "policies"
    pdir.mkdir()
    shutil.copy(js_component("heuristic-js"), pdir / "heuristic-js.wasm")
    srv = start_server(policy_dir=pdir)
    listed = {p["name"]: p for p in httpx.get(srv.url + "/api/policies").json()["policies"]}
    assert listed["heuristic-js"]["exports"]["schedule"] and listed["heuristic-js"]["imports_wasi"]

    # upload the acceptance policy (compiled at upload, before the 201)
    wasm = js_component("rejection-js").read_bytes()
    r = httpx.post(srv.url + "/api/policies", params={"name": "my-rejection-js"}, content=wasm,
                   headers={"content-type": "application/wasm"}, timeout=300)
    assert r.status_code == 201, r.text
    info = r.json()["policy"]
    assert info["exports"]["acceptance"] and info["size_bytes"] == len(wasm)
    assert (pdir / "my-rejection-js.wasm").read_bytes() == wasm

    # select both by name: the same text as plain decoding, and as the built-ins
    plain = raw_generate(srv, drafter="none")
    mine = raw_generate(srv, schedule="heuristic-js", acceptance="my-rejection-js")
    builtin = raw_generate(srv, schedule="heuristic", acceptance="rejection")
    assert mine["response"] == plain["response"] == builtin["response"]
    spec = mine["speculation"]
    assert spec["schedule"] == "heuristic-js" and spec["acceptance"] == "my-rejection-js"
    assert spec["policy_failure"] is None, spec["policy_failure"]
    assert spec["drafted"] > 0
    # by hash too
    by_hash = raw_generate(srv, acceptance=info["sha256"])
    assert by_hash["response"] == plain["response"]
    # a bad config is the client's error, with the policy's message
    r = httpx.post(srv.url + "/api/generate", json={"model": "default", "prompt": "hi", "raw": True, "stream": False,
                                                   "options": {"num_predict": 4, "schedule": "heuristic-js",
                                                               "schedule_config": {"initial": 4.0}}}, timeout=300)
    assert r.status_code == 400 and "initial" in r.text, r.text

    # a misbehaving JavaScript policy fails its request's speculation only
    r = httpx.post(srv.url + "/api/policies", params={"name": "hostile-js"},
                   content=js_component("hostile-js").read_bytes(), timeout=300)
    assert r.status_code == 201, r.text
    bad = raw_generate(srv, schedule="hostile-js", schedule_config={"do": "throw"})
    assert bad["response"] == plain["response"]
    assert bad["speculation"]["policy_failure"]["kind"] == "trap"
    assert raw_generate(srv, schedule="heuristic-js")["speculation"]["policy_failure"] is None


def docs_js_blocks() -> list[str]:
    text = (ROOT / "docs" / "policies.md").read_text()
    section = text.split("\n## JavaScript policies\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def test_docs_js_section_runs_as_written(tmp_path):
    blocks = docs_js_blocks()
    assert len(blocks) == 2, blocks
    # `specd` on PATH, as a reader has it
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "specd").symlink_to(server_bin())
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    # The first block builds a new component (its bytes may differ from run
    # to run): it runs with a SPECD_HOME of its own (the model and MLX
    # linked in) so that compiled forms do not pile up in the real cache.
    real_home = Path(os.environ.get("SPECD_HOME") or Path.home() / ".cache" / "specd")
    home = tmp_path / "specd-home"
    home.mkdir()
    for entry in real_home.iterdir():
        if entry.name != "policies":
            (home / entry.name).symlink_to(entry)
    outs = []
    for i, block in enumerate(blocks):
        block_env = {**env, "SPECD_HOME": str(home)} if i == 0 else env
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=block_env,
                           capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"{block}\n--- stdout\n{p.stdout[-2000:]}\n--- stderr\n{p.stderr[-4000:]}"
        outs.append(p)
    build, repo = outs
    assert "fast-start-js.wasm: ok, exports schedule" in build.stdout + build.stderr
    assert "schedule fast-start-js" in build.stderr, build.stderr[-2000:]
    assert "schedule heuristic-js acceptance rejection-js" in repo.stderr, repo.stderr[-2000:]
