"""The conformance harness from the outside (issue 17): `specd policy check
--conformance` on built-ins and on a JavaScript component file (seed
printed, exit status 1 when a claim fails), the verdict in `policy list`
and GET /api/policies, and `specd serve --require-lossless` refusing what
the harness did not verify, with a 400 that says why.
"""
from __future__ import annotations

import re
import subprocess

import httpx

from conftest import MODEL, ROOT, server_bin

PROMPT = "red green blue yellow red green blue yellow"


def specd(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(server_bin()), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def conformance(*args) -> tuple[int, str, int]:
    p = specd("policy", "check", "--conformance", *args)
    out = p.stdout + p.stderr
    m = re.search(r"seed (\d+) \(repeat with --seed \1\)", out)
    assert m, out
    return p.returncode, out, int(m.group(1))


# The verdicts below come from one fixed seed, so they replay. A random seed
# refuses a lossless policy with probability `alpha` (0.001) a run by
# design, and this test ran three such runs: CI once drew a seed at which
# both the built-in and the JavaScript rejection "drifted" (p = 4.2e-5
# against a corrected 5.3e-5), identically, as the same rounds would.
SEED = 1


def test_policy_check_conformance_cli():
    rc, out, seed = conformance("rejection", "--seed", SEED)
    assert seed == SEED
    assert rc == 0 and "rejection: lossless: passed" in out, out
    # without --seed every run draws its own rounds (their verdicts are not
    # asserted: see SEED)
    seeds = {conformance("rejection")[2] for _ in range(2)}
    assert len(seeds) == 2 and SEED not in seeds, "every run draws its own rounds"
    # a seed replays a run exactly
    rc3, out3, _ = conformance("rejection", "--seed", SEED)
    assert out3.splitlines()[-1] == out.splitlines()[-1]

    rc, out, _ = conformance("greedy", "--seed", SEED)
    assert rc == 0 and "lossless at temperature 0 only: passed" in out, out
    rc, out, _ = conformance("typical", "--seed", SEED)
    assert rc == 0 and "typical: lossy: drift at temperature > 0" in out, out
    # typical tested as lossless fails, exit status 1
    rc, out, _ = conformance("typical", "--claim", "lossless", "--seed", SEED)
    assert rc == 1 and "FAILED: claims to be lossless" in out, out

    # any component file: the JavaScript rejection passes as lossless
    js = ROOT / "plugins" / "target" / "js" / "rejection-js.wasm"
    assert js.is_file(), f"{js}: run scripts/build-js-plugins.sh (`make test` does)"
    rc, out, _ = conformance(js, "--seed", SEED)
    assert rc == 0 and "rejection-js: lossless: passed" in out, out

    # the verdicts show in `policy list` (kept per hash under $SPECD_HOME)
    p = specd("policy", "list")
    rows = {line.split()[0]: line for line in p.stdout.splitlines()[1:]}
    assert "lossless passed" in rows["rejection"], rows["rejection"]
    assert "greedy passed" in rows["greedy"], rows["greedy"]
    assert "lossy passed" in rows["typical"], rows["typical"]
    assert " - " in rows["heuristic"]  # a schedule: no verdict


def generate(srv, **options):
    options.setdefault("num_predict", 8)
    return httpx.post(srv.url + "/api/generate", json={"model": MODEL, "prompt": PROMPT, "raw": True,
                                                      "stream": False, "options": options}, timeout=300)


def test_serve_require_lossless(start_server):
    srv = start_server("--require-lossless")
    # lossy: refused, saying why
    r = generate(srv, acceptance="typical", temperature=0.8, seed=1)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "`acceptance`" in err and "not verified lossless" in err and "--require-lossless" in err, err
    # greedy: for greedy requests only
    r = generate(srv, acceptance="greedy", temperature=0.8, seed=1)
    assert r.status_code == 400 and "temperature 0" in r.json()["error"], r.text
    assert generate(srv, acceptance="greedy", temperature=0).status_code == 200
    # rejection (named, or the default for a sampled request): verified
    assert generate(srv, acceptance="rejection", temperature=0.8, seed=1).status_code == 200
    assert generate(srv, temperature=0.8, seed=2).status_code == 200
    # the verdicts show in GET /api/policies
    listed = {p["name"]: p for p in httpx.get(srv.url + "/api/policies").json()["policies"]}
    v = listed["rejection"]["conformance"]
    assert v["claim"] == "lossless" and v["passed"] and v["claim_source"] == "built-in", v
    assert listed["typical"]["conformance"]["claim"] == "lossy"
    assert listed["heuristic"]["conformance"] is None
    # without the flag, typical serves
    plain = start_server()
    assert generate(plain, acceptance="typical", temperature=0.8, seed=1).status_code == 200
