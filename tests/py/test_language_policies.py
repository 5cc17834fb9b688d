"""The Python and JavaScript policies end to end (issue 17), one flow for
both languages: built by scripts/build-python-plugins.sh and
scripts/build-js-plugins.sh (`make test` runs them first) into
plugins/target/{python,js}, used through `specd generate --policy-dir`,
uploaded through POST /api/policies, and selected by name over HTTP; and each
language's section of docs/policies.md, run as written.

Greedy output must not depend on the policies: the ports of `heuristic` and
`rejection` give the same text as plain decoding (`--drafter none`). The
first run compiles each component (12-18 MB: seconds of Cranelift, once: the
compiled form is cached under $SPECD_HOME/policies/cache).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import MODEL, ROOT, server_bin

PROMPT = "red green blue yellow red green blue yellow red green blue yellow red green"


@dataclass(frozen=True)
class Lang:
    suffix: str  # the components are NAME-SUFFIX.wasm
    target: str  # under plugins/target
    script: str  # the build script that makes them
    section: str  # its section of docs/policies.md
    throw: str  # the hostile policy's config value for "raise an exception"

    def component(self, name: str) -> Path:
        p = ROOT / "plugins" / "target" / self.target / f"{name}-{self.suffix}.wasm"
        assert p.is_file(), f"{p} is missing: run scripts/{self.script} (`make test` does)"
        return p


LANGS = {
    "python": Lang("py", "python", "build-python-plugins.sh", "Python policies", "raise"),
    "js": Lang("js", "js", "build-js-plugins.sh", "JavaScript policies", "throw"),
}


@pytest.fixture(params=sorted(LANGS))
def lang(request) -> Lang:
    return LANGS[request.param]


def specd(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(server_bin()), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def generate(*args, stats: Path) -> tuple[str, dict]:
    p = specd("generate", "--max-tokens", 32, "--stats-json", stats, *args, PROMPT)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout, json.loads(stats.read_text())


def raw_generate(srv, **options) -> dict:
    options.setdefault("num_predict", 32)
    options.setdefault("temperature", 0)  # greedy: the text is comparable
    r = httpx.post(srv.url + "/api/generate", json={"model": MODEL, "prompt": PROMPT, "raw": True,
                                                   "stream": False, "options": options}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_with_ported_policies_matches_plain_decoding(lang, tmp_path):
    heuristic, rejection = f"heuristic-{lang.suffix}", f"rejection-{lang.suffix}"
    pdir = tmp_path / "policies"
    pdir.mkdir()
    for name in (heuristic, rejection):
        shutil.copy(lang.component(name.rsplit("-", 1)[0]), pdir / f"{name}.wasm")
    plain, _ = generate("--drafter", "none", stats=tmp_path / "plain.json")
    text, stats = generate("--policy-dir", pdir, "--schedule", heuristic, "--acceptance", rejection,
                           stats=tmp_path / "port.json")
    assert text == plain
    assert stats["schedule"] == heuristic and stats["acceptance"] == rejection
    assert stats["policy_failure"] is None, stats["policy_failure"]
    assert stats["drafted"] > 0 and stats["accepted"] > 0, stats
    # the same rounds as the built-in heuristic (the port decides alike)
    _, rust = generate("--schedule", "heuristic", "--acceptance", "rejection", stats=tmp_path / "rs.json")
    assert (stats["rounds"], stats["drafted"], stats["accepted"]) == (rust["rounds"], rust["drafted"], rust["accepted"])


def test_ported_policies_over_http_from_the_policy_dir_and_by_upload(lang, start_server, tmp_path):
    heuristic, mine_name = f"heuristic-{lang.suffix}", f"my-rejection-{lang.suffix}"
    pdir = tmp_path / "policies"
    pdir.mkdir()
    shutil.copy(lang.component("heuristic"), pdir / f"{heuristic}.wasm")
    srv = start_server(policy_dir=pdir)
    listed = {p["name"]: p for p in httpx.get(srv.url + "/api/policies").json()["policies"]}
    assert listed[heuristic]["exports"]["schedule"] and listed[heuristic]["imports_wasi"]

    # upload the acceptance policy (compiled at upload, before the 201)
    wasm = lang.component("rejection").read_bytes()
    r = httpx.post(srv.url + "/api/policies", params={"name": mine_name}, content=wasm,
                   headers={"content-type": "application/wasm"}, timeout=300)
    assert r.status_code == 201, r.text
    info = r.json()["policy"]
    assert info["exports"]["acceptance"] and info["size_bytes"] == len(wasm)
    assert (pdir / f"{mine_name}.wasm").read_bytes() == wasm

    # select both by name: the same text as plain decoding, and as the built-ins
    plain = raw_generate(srv, drafter="none")
    mine = raw_generate(srv, schedule=heuristic, acceptance=mine_name)
    builtin = raw_generate(srv, schedule="heuristic", acceptance="rejection")
    assert mine["response"] == plain["response"] == builtin["response"]
    spec = mine["speculation"]
    assert spec["schedule"] == heuristic and spec["acceptance"] == mine_name
    assert spec["policy_failure"] is None, spec["policy_failure"]
    assert spec["drafted"] > 0
    # by hash too
    assert raw_generate(srv, acceptance=info["sha256"])["response"] == plain["response"]
    # a bad config is the client's error, with the policy's message
    r = httpx.post(srv.url + "/api/generate", json={"model": MODEL, "prompt": "hi", "raw": True, "stream": False,
                                                   "options": {"num_predict": 4, "schedule": heuristic,
                                                               "schedule_config": {"initial": 4.0}}}, timeout=300)
    assert r.status_code == 400 and "initial" in r.text, r.text

    # a misbehaving policy fails its request's speculation only
    hostile = f"hostile-{lang.suffix}"
    r = httpx.post(srv.url + "/api/policies", params={"name": hostile},
                   content=lang.component("hostile").read_bytes(), timeout=300)
    assert r.status_code == 201, r.text
    bad = raw_generate(srv, schedule=hostile, schedule_config={"do": lang.throw})
    assert bad["response"] == plain["response"]
    assert bad["speculation"]["policy_failure"]["kind"] == "trap"
    assert raw_generate(srv, schedule=heuristic)["speculation"]["policy_failure"] is None


def docs_blocks(section: str) -> list[str]:
    text = (ROOT / "docs" / "policies.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", body, re.S)


def test_docs_section_runs_as_written(lang, tmp_path):
    blocks = docs_blocks(lang.section)
    assert len(blocks) == 2, blocks
    # `specd` on PATH, as a reader has it
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "specd").symlink_to(Path(server_bin()).resolve())
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    # The first block builds a new component, and its bytes differ from run
    # to run (componentize-py's snapshot of the initialized interpreter is not
    # reproducible): it runs with a SPECD_HOME of its own (the model and MLX
    # linked in) so that the compiled forms (~42 MB each for Python) do not
    # pile up in the real policy cache.
    real_home = Path(os.environ.get("SPECD_HOME") or Path.home() / ".cache" / "specd")
    home = tmp_path / "specd-home"
    home.mkdir()
    for entry in real_home.iterdir():
        if entry.name != "policies":
            (home / entry.name).symlink_to(entry)
    outs = []
    for i, block in enumerate(blocks):
        # The section's scratch directory (/tmp/py-policy, /tmp/js-policy)
        # moved under this test's own: whatever an earlier run (or a reader)
        # left there, say a venv of another Python, cannot change the result.
        block = re.sub(r"/tmp/((py|js)-policy)", lambda m: str(tmp_path / m.group(1)), block)
        block_env = {**env, "SPECD_HOME": str(home)} if i == 0 else env
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=block_env,
                           capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"{block}\n--- stdout\n{p.stdout[-2000:]}\n--- stderr\n{p.stderr[-4000:]}"
        outs.append(p)
    build, repo = outs
    s = lang.suffix
    assert f"fast-start-{s}.wasm: ok, exports schedule" in build.stdout + build.stderr
    assert f"schedule fast-start-{s}" in build.stderr, build.stderr[-2000:]
    assert f"schedule heuristic-{s} acceptance rejection-{s}" in repo.stderr, repo.stderr[-2000:]
