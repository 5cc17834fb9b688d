"""The Python policies end to end (issue 17): built by
scripts/build-python-plugins.sh (`make test` runs it first) into
plugins/target/python, used through `specd generate --policy-dir`, uploaded
through POST /api/policies, and selected by name over HTTP; and the Python
section of docs/policies.md, run as written.

Greedy output must not depend on the policies: the Python `heuristic` and
`rejection` give the same text as plain decoding (`--drafter none`).  The
first run compiles each ~18 MB component (seconds of Cranelift, once: the
compiled form is cached under $SPECD_HOME/policies/cache).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx

from conftest import MODEL, ROOT, server_bin

PY_PLUGINS = ROOT / "plugins" / "target" / "python"
PROMPT = "red green blue yellow red green blue yellow red green blue yellow red green"


def py_component(name: str) -> Path:
    p = PY_PLUGINS / f"{name}.wasm"
    assert p.is_file(), f"{p} is missing: run scripts/build-python-plugins.sh (`make test` does)"
    return p


def specd(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(server_bin()), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def generate(*args, stats: Path) -> tuple[str, dict]:
    p = specd("generate", "--max-tokens", 32, "--stats-json", stats, *args, PROMPT)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout, json.loads(stats.read_text())


def test_generate_with_python_policies_matches_plain_decoding(tmp_path):
    pdir = tmp_path / "policies"
    pdir.mkdir()
    for name in ("heuristic-py", "rejection-py"):
        shutil.copy(py_component(name), pdir / f"{name}.wasm")
    plain, _ = generate("--drafter", "none", stats=tmp_path / "plain.json")
    text, stats = generate("--policy-dir", pdir, "--schedule", "heuristic-py", "--acceptance", "rejection-py",
                           stats=tmp_path / "py.json")
    assert text == plain
    assert stats["schedule"] == "heuristic-py" and stats["acceptance"] == "rejection-py"
    assert stats["policy_failure"] is None, stats["policy_failure"]
    assert stats["drafted"] > 0 and stats["accepted"] > 0, stats
    # the same rounds as the built-in heuristic (the Python port decides alike)
    _, rust = generate("--schedule", "heuristic", "--acceptance", "rejection", stats=tmp_path / "rs.json")
    assert (stats["rounds"], stats["drafted"], stats["accepted"]) == (rust["rounds"], rust["drafted"], rust["accepted"])


def raw_generate(srv, **options) -> dict:
    options.setdefault("num_predict", 32)
    options.setdefault("temperature", 0)  # greedy: the text is comparable
    r = httpx.post(srv.url + "/api/generate", json={"model": MODEL, "prompt": PROMPT, "raw": True,
                                                   "stream": False, "options": options}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_python_policies_over_http_from_the_policy_dir_and_by_upload(start_server, tmp_path):
    pdir = tmp_path / "policies"
    pdir.mkdir()
    shutil.copy(py_component("heuristic-py"), pdir / "heuristic-py.wasm")
    srv = start_server(policy_dir=pdir)
    listed = {p["name"]: p for p in httpx.get(srv.url + "/api/policies").json()["policies"]}
    assert listed["heuristic-py"]["exports"]["schedule"] and listed["heuristic-py"]["imports_wasi"]

    # upload the acceptance policy (compiled at upload, before the 201)
    wasm = py_component("rejection-py").read_bytes()
    r = httpx.post(srv.url + "/api/policies", params={"name": "my-rejection-py"}, content=wasm,
                   headers={"content-type": "application/wasm"}, timeout=300)
    assert r.status_code == 201, r.text
    info = r.json()["policy"]
    assert info["exports"]["acceptance"] and info["size_bytes"] == len(wasm)
    assert (pdir / "my-rejection-py.wasm").read_bytes() == wasm

    # select both by name: the same text as plain decoding, and as the built-ins
    plain = raw_generate(srv, drafter="none")
    mine = raw_generate(srv, schedule="heuristic-py", acceptance="my-rejection-py")
    builtin = raw_generate(srv, schedule="heuristic", acceptance="rejection")
    assert mine["response"] == plain["response"] == builtin["response"]
    spec = mine["speculation"]
    assert spec["schedule"] == "heuristic-py" and spec["acceptance"] == "my-rejection-py"
    assert spec["policy_failure"] is None, spec["policy_failure"]
    assert spec["drafted"] > 0
    # by hash too
    by_hash = raw_generate(srv, acceptance=info["sha256"])
    assert by_hash["response"] == plain["response"]

    # a misbehaving Python policy fails its request's speculation only
    shutil.copy(py_component("hostile-py"), tmp_path / "hostile-py.wasm")
    r = httpx.post(srv.url + "/api/policies", params={"name": "hostile-py"},
                   content=(tmp_path / "hostile-py.wasm").read_bytes(), timeout=300)
    assert r.status_code == 201, r.text
    bad = raw_generate(srv, schedule="hostile-py", schedule_config={"do": "raise"})
    assert bad["response"] == plain["response"]
    assert bad["speculation"]["policy_failure"]["kind"] == "trap"
    assert raw_generate(srv, schedule="heuristic-py")["speculation"]["policy_failure"] is None


def docs_python_blocks() -> list[str]:
    text = (ROOT / "docs" / "policies.md").read_text()
    section = text.split("\n## Python policies\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def test_docs_python_section_runs_as_written(tmp_path):
    blocks = docs_python_blocks()
    assert len(blocks) == 2, blocks
    # `specd` on PATH, as a reader has it
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "specd").symlink_to(server_bin())
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    # componentize-py's output differs from build to build (its snapshot of
    # the initialized interpreter is not reproducible): each run of the first
    # block is a new component, compiled anew.  It runs with a SPECD_HOME of
    # its own (the model and MLX linked in) so that the compiled forms
    # (~42 MB each) do not pile up in the real policy cache.
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
    assert "fast-start-py.wasm: ok, exports schedule" in build.stdout + build.stderr
    assert "schedule fast-start-py" in build.stderr, build.stderr[-2000:]
    assert "schedule heuristic-py acceptance rejection-py" in repo.stderr, repo.stderr[-2000:]
