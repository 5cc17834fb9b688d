"""scripts/device-check.sh, both halves on the CPU build (`cpu`: pack with
--skip-cuda-build, then run): the bundle is built and checked against the
64 MiB one call may carry, the tiny random model's tokens match those
recorded at packing, and every figure of the table is there. On a lent GPU
the same script packs the CUDA build and runs there (docs/portable.md)."""
from __future__ import annotations

import os
import re
import subprocess

from specd_paths import ROOT, server_bin


def test_device_check_runs_both_halves_on_cpu(tmp_path):
    env = dict(os.environ, CARGO_TARGET_DIR=str(server_bin().parents[1]), TMPDIR=str(tmp_path))
    p = subprocess.run([str(ROOT / "scripts" / "device-check.sh"), "cpu"], capture_output=True, text=True,
                       timeout=900, env=env)
    out = p.stdout + p.stderr
    print(out[-3000:])
    assert p.returncode == 0, out[-3000:]
    size = int(re.search(r"packed \S+: \d+ MiB \((\d+) bytes", out).group(1))
    assert 0 < size <= 64 << 20, size
    assert "4 identical, 0 first differ at a near-tie, 0 differ" in out
    for row in ["decode tok/s, one stream", "8 streams, total tok/s", "32 streams, total tok/s",
                "repetitive suite: plain / ngram tok/s"]:
        line = next(line for line in out.splitlines() if line.startswith(row))
        assert re.search(r"\d+\.\d", line) and "?" not in line, line
