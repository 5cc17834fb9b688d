#!/usr/bin/env bash
# Builds specd's policy components (WebAssembly components, specd:policy@0.1.0
# and @0.2.0).
#
#   scripts/build-plugins.sh [OUT_DIR]     build everything into OUT_DIR
#                                          (default: plugins/target/specd)
#   scripts/build-plugins.sh --install-tools
#                                          install the toolchains (idempotent)
#
# host/policy/build.rs runs this on every `cargo build` that needs it, so a
# plain `cargo build` of the workspace builds the plugins too.
#
# Toolchains:
#   Rust policies (plugins/rust/*): rustup target wasm32-wasip2. The target's
#     linker, wasm-component-ld (shipped by rustup), makes the component.
#   C policies (plugins/c/*): Debian clang + lld (wasm-ld) + wasi-libc +
#     libclang-rt-14-dev-wasm32, and the wit-bindgen CLI (`cargo install
#     wit-bindgen-cli --no-default-features --features c`, C generator only,
#     into ~/.cargo/bin).  wasm-component-ld from rustup links the component.
#
# Outputs: OUT_DIR/<name>.wasm — the built-ins (constant, heuristic,
# heuristic-transient, throughput, greedy, rejection, typical, heuristic-c;
# on 0.2: adaedl, bandit) and the test fixtures wasi-demo-c and stop-below
# (0.2); OUT_DIR/nested-build-env.txt.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WIT_BINDGEN_VERSION=0.63.0
CARGO=${CARGO:-cargo}
export PATH="$HOME/.cargo/bin:$PATH"

if [[ "${1:-}" == "--install-tools" ]]; then
    rustup target add wasm32-wasip2
    if ! command -v clang >/dev/null || ! command -v wasm-ld >/dev/null || [[ ! -f /usr/lib/wasm32-wasi/libc.a ]] \
        || ! ls /usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y --no-install-recommends clang lld wasi-libc libclang-rt-14-dev-wasm32 \
            || { apt-get update && apt-get install -y --no-install-recommends clang lld wasi-libc libclang-rt-14-dev-wasm32; }
    fi
    if ! wit-bindgen --version 2>/dev/null | grep -q "$WIT_BINDGEN_VERSION"; then
        "$CARGO" install wit-bindgen-cli --version "$WIT_BINDGEN_VERSION" --locked --no-default-features --features c
    fi
    exit 0
fi

OUT=${1:-$ROOT/plugins/target/specd}
mkdir -p "$OUT" "$ROOT/plugins/target"
# One build at a time (debug and release builds of the host may run this together).
exec 9>"$ROOT/plugins/target/.build-plugins.lock"
flock 9
OUT=$(cd "$OUT" && pwd)
# The names (not values) of the variables this build ran with: a test checks
# that none of the outer build's jobserver or compiler settings got here.
compgen -e | sort > "$OUT/nested-build-env.txt"

die() { echo "build-plugins: $*" >&2; exit 1; }

# ---- Rust policies -----------------------------------------------------------
rustc_sysroot=$(rustc --print sysroot)
rustc_host=$(rustc -vV | sed -n 's/^host: //p')
[[ -d "$rustc_sysroot/lib/rustlib/wasm32-wasip2" ]] \
    || die "the Rust target wasm32-wasip2 is missing: run scripts/build-plugins.sh --install-tools"
"$CARGO" build --release --locked --target wasm32-wasip2 \
    --manifest-path "$ROOT/plugins/Cargo.toml" --target-dir "$ROOT/plugins/target"
# Built-ins (plugins/rust) and test fixtures (plugins/fixtures, not embedded).
for crate in "$ROOT"/plugins/rust/*/ "$ROOT"/plugins/fixtures/*/; do
    name=$(basename "$crate")
    cp "$ROOT/plugins/target/wasm32-wasip2/release/${name//-/_}.wasm" "$OUT/$name.wasm"
done

# ---- C policies ----------------------------------------------------------------
WCLD="$rustc_sysroot/lib/rustlib/$rustc_host/bin/wasm-component-ld"
[[ -x "$WCLD" ]] || die "wasm-component-ld not found at $WCLD (it ships with rustup's Rust >= 1.82)"
WASM_LD=$(command -v wasm-ld || command -v wasm-ld-14 || true)
[[ -n "$WASM_LD" ]] || die "wasm-ld not found (Debian package lld): run scripts/build-plugins.sh --install-tools"
CLANG=$(command -v clang || command -v clang-14 || true)
[[ -n "$CLANG" ]] || die "clang not found: run scripts/build-plugins.sh --install-tools"
command -v wit-bindgen >/dev/null || die "the wit-bindgen CLI is missing: run scripts/build-plugins.sh --install-tools"

GEN="$ROOT/plugins/target/c-bindings"
mkdir -p "$GEN"
# c_policy NAME WORLD SOURCE...: one component from C sources.
c_policy() {
    local name=$1 world=$2
    shift 2
    local gen="$GEN/$world"
    local wstem=${world//-/_}
    if [[ ! -f "$gen/$wstem.h" || "$ROOT/wit/policy.wit" -nt "$gen/$wstem.h" ]]; then
        rm -rf "$gen"
        wit-bindgen c "$ROOT/wit" --world "$world" --out-dir "$gen" >/dev/null
    fi
    local srcs=()
    for s in "$@"; do srcs+=("$ROOT/plugins/c/$s"); done
    "$CLANG" --target=wasm32-wasi -O2 -mexec-model=reactor -Wall -Werror -Wno-unused-function \
        -I "$gen" -I "$ROOT/plugins/c" \
        "${srcs[@]}" "$gen/$wstem.c" "$gen/${wstem}_component_type.o" \
        -fuse-ld="$WCLD" -Wl,--wasm-ld-path="$WASM_LD" \
        -o "$OUT/$name.wasm"
}
c_policy heuristic-c schedule-policy heuristic.c
c_policy wasi-demo-c schedule-policy wasi_demo.c

echo "build-plugins: components in $OUT:" >&2
ls -l "$OUT" >&2
