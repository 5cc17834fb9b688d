#!/usr/bin/env bash
# Builds specd's Python policy components with componentize-py.
#
#   scripts/build-python-plugins.sh [OUT_DIR]    (default: plugins/target/python)
#
# Each directory plugins/python/NAME/ is one component, OUT_DIR/NAME-py.wasm.
# componentize-py implements a WIT interface by the Python module of the same
# name: a directory with schedule.py exports `schedule` (class Scheduler),
# one with acceptance.py exports `acceptance` (class Acceptor), one with both
# exports both (world `policy`).
#
# componentize-py (pinned below) is installed from PyPI into its own venv,
# plugins/target/componentize-py (made with $PYTHON, default python3, >= 3.10
# for the tool itself; the component embeds its own CPython).  A component is
# rebuilt only when it is missing or older than its sources, wit/policy.wit or
# this script, so a second run costs well under a second.  Building one takes
# about 10 s and gives an ~18 MB component (CPython and its standard library
# are in it); specd compiles it once per content hash and caches the result
# on disk.  The components are loaded at run time (--policy-dir, uploads),
# never embedded in the binary.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOL=build-python-plugins
# shellcheck source=scripts/policy-build-lib.sh
source "$ROOT/scripts/policy-build-lib.sh"
COMPONENTIZE_PY_VERSION=0.25.1
PYTHON=${PYTHON:-python3}
OUT=${1:-$ROOT/plugins/target/python}
VENV=$ROOT/plugins/target/componentize-py

lock_out "$OUT"
OUT=$(cd "$OUT" && pwd)

tool="$VENV/bin/componentize-py"
if [[ ! -x "$tool" ]] || [[ "$("$VENV/bin/python" -m pip show componentize-py 2>/dev/null | sed -n 's/^Version: //p')" != "$COMPONENTIZE_PY_VERSION" ]]; then
    echo "build-python-plugins: installing componentize-py $COMPONENTIZE_PY_VERSION into $VENV" >&2
    [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV" || die "cannot make a venv with $PYTHON (Debian: apt-get install python3-venv)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY_VERSION"
fi

built=0
for dir in "$ROOT"/plugins/python/*/; do
    name=$(basename "$dir")
    out="$OUT/$name-py.wasm"
    has_s=0 has_a=0
    [[ -f "$dir/schedule.py" ]] && has_s=1
    [[ -f "$dir/acceptance.py" ]] && has_a=1
    world=$(world_of $has_s $has_a)
    [[ -n "$world" ]] || die "$dir has neither schedule.py nor acceptance.py"
    # componentize-py names the module to start from; with both, schedule.
    app=$([[ $has_s == 1 ]] && echo schedule || echo acceptance)
    up_to_date "$out" "$dir" '*.py' && continue
    # Built from a copy: componentize-py writes __pycache__ beside the sources.
    src="$ROOT/plugins/target/python-src/$name"
    rm -rf "$src" && mkdir -p "$src" && cp "$dir"/*.py "$src"/
    # -q: no "Component built successfully"; errors still go to stderr.
    build "$out" "$OUT/$name-py.log" "componentize-py for $dir" \
        "$tool" -q -d "$ROOT/wit" -w "$world" componentize -p "$src" "$app" -o "$out.tmp"
done
[[ $built -gt 0 ]] || echo "build-python-plugins: up to date ($OUT)" >&2
