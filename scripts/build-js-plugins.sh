#!/usr/bin/env bash
# Builds specd's JavaScript policy components with componentize-js.
#
#   scripts/build-js-plugins.sh [OUT_DIR]    (default: plugins/target/js)
#
# Each directory plugins/js/NAME/ holds one ES module, policy.js, which is
# one component, OUT_DIR/NAME-js.wasm.  componentize-js implements a WIT
# interface by the exported object of the same name: a module that exports
# `schedule` (with the class Scheduler) is built for the world
# `schedule-policy`, one that exports `acceptance` (class Acceptor) for
# `acceptance-policy`, one that exports both for `policy`.
#
# componentize-js and everything it needs are pinned by plugins/js/package.json
# and package-lock.json, installed with `npm ci` (Node.js >= 18 and npm) into
# plugins/target/componentize-js.  The WASI features a policy has no use for
# are left out (-d http fetch-event: specd refuses wasi:http); console output,
# the clock and Math.random stay, and run under specd's deny-all WASI (output
# to the host log, a clock frozen at 0, a fixed random stream).  A component
# is rebuilt only when it is missing or older than its source, wit/policy.wit
# or this script, so a second run costs well under a second.  Building one
# takes 10-25 s and gives a ~12 MB component (the StarlingMonkey/SpiderMonkey
# engine is in it); specd compiles it once per content hash and caches the
# result on disk.  The components are loaded at run time (--policy-dir,
# uploads), never embedded in the binary.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOL=build-js-plugins
# shellcheck source=scripts/policy-build-lib.sh
source "$ROOT/scripts/policy-build-lib.sh"
OUT=${1:-$ROOT/plugins/target/js}
TOOLS=$ROOT/plugins/target/componentize-js

lock_out "$OUT"
OUT=$(cd "$OUT" && pwd)

command -v node >/dev/null && command -v npm >/dev/null \
    || die "needs Node.js >= 18 and npm (Debian: apt-get install nodejs npm)"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' \
    || die "needs Node.js >= 18, found $(node --version)"

cli="$TOOLS/node_modules/@bytecodealliance/componentize-js/src/cli.js"
# (Re)installed when the pinned lock file changed since the last install.
if [[ ! -f "$cli" ]] || ! cmp -s "$ROOT/plugins/js/package-lock.json" "$TOOLS/package-lock.json"; then
    echo "build-js-plugins: installing componentize-js (plugins/js/package-lock.json) into $TOOLS" >&2
    mkdir -p "$TOOLS"
    cp "$ROOT/plugins/js/package.json" "$ROOT/plugins/js/package-lock.json" "$TOOLS/"
    (cd "$TOOLS" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi

built=0
for dir in "$ROOT"/plugins/js/*/; do
    name=$(basename "$dir")
    src="$dir/policy.js"
    out="$OUT/$name-js.wasm"
    [[ -f "$src" ]] || die "$dir has no policy.js"
    has_s=0 has_a=0
    grep -Eq '^export const schedule\b' "$src" && has_s=1
    grep -Eq '^export const acceptance\b' "$src" && has_a=1
    world=$(world_of $has_s $has_a)
    [[ -n "$world" ]] || die "$src exports neither \`schedule\` nor \`acceptance\` (export const ...)"
    up_to_date "$out" "$dir" '*.js' && continue
    build "$out" "$OUT/$name-js.log" "componentize-js for $src" \
        node "$cli" "$src" --wit "$ROOT/wit" --world-name "$world" -d http fetch-event -o "$out.tmp"
done
[[ $built -gt 0 ]] || echo "build-js-plugins: up to date ($OUT)" >&2
