"""Where the tests find specd's binary and models (no pytest needed here).

SPECD_BIN picks the binary (default: target/release/specd of this checkout,
or $CARGO_TARGET_DIR/release/specd).  Models are found where `specd pull`
puts them: `model_path` asks the binary (`specd pull --path NAME`), which
resolves $SPECD_HOME the way every other part of specd does and fetches the
model when it is missing.  The Rust tests call the same code
(`specd_store::default_model`).
"""
from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2:135m"
# The second architecture's model (Gemma 3).
GEMMA = "gemma3:270m"


def server_bin() -> Path:
    if os.environ.get("SPECD_BIN"):
        return Path(os.environ["SPECD_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return target / "release" / "specd"


def run(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs the specd binary with `args` (str()-ed), capturing its output."""
    exe = server_bin()
    if not exe.is_file():
        raise FileNotFoundError(f"{exe} is missing: build it first (cargo build --release -p specd)")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=timeout)


@functools.cache
def model_path(name: str = MODEL) -> Path:
    """The model file in the store, fetched first when missing."""
    exe = server_bin()
    if not exe.is_file():
        raise FileNotFoundError(f"{exe} is missing: build it first (cargo build --release -p specd)")
    p = subprocess.run([str(exe), "pull", "--path", name], capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"specd pull --path {name} failed ({p.returncode}): {p.stderr[-2000:]}")
    return Path(p.stdout.strip())
