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
COMPONENTIZE_PY_VERSION=0.25.1
PYTHON=${PYTHON:-python3}
OUT=${1:-$ROOT/plugins/target/python}
VENV=$ROOT/plugins/target/componentize-py

mkdir -p "$OUT" "$ROOT/plugins/target"
exec 9>"$ROOT/plugins/target/.build-python-plugins.lock"
flock 9
OUT=$(cd "$OUT" && pwd)

die() { echo "build-python-plugins: $*" >&2; exit 1; }

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
    case "$has_s$has_a" in
        11) world=policy app=schedule ;;
        10) world=schedule-policy app=schedule ;;
        01) world=acceptance-policy app=acceptance ;;
        *) die "$dir has neither schedule.py nor acceptance.py" ;;
    esac
    if [[ -f "$out" ]]; then
        stale=$(find "$dir" "$ROOT/wit" "${BASH_SOURCE[0]}" -newer "$out" \( -name '*.py' -o -name '*.wit' -o -name '*.sh' \) -print -quit)
        [[ -z "$stale" ]] && continue
    fi
    t0=$(date +%s%N)
    # Built from a copy: componentize-py writes __pycache__ beside the sources.
    src="$ROOT/plugins/target/python-src/$name"
    rm -rf "$src" && mkdir -p "$src" && cp "$dir"/*.py "$src"/
    # -q: no "Component built successfully"; errors still go to stderr.
    if ! "$tool" -q -d "$ROOT/wit" -w "$world" componentize \
        -p "$src" "$app" -o "$out.tmp" >"$OUT/$name-py.log" 2>&1; then
        cat "$OUT/$name-py.log" >&2
        rm -f "$out.tmp"
        die "componentize-py failed for $dir"
    fi
    mv "$out.tmp" "$out"
    built=$((built + 1))
    echo "build-python-plugins: $out ($(stat -c %s "$out") bytes) in $((($(date +%s%N) - t0) / 1000000)) ms" >&2
done
[[ $built -gt 0 ]] || echo "build-python-plugins: up to date ($OUT)" >&2
