#!/usr/bin/env bash
# The device check: the portable path (`--kernels mlx`, MLX's own ops) on a
# GPU that is lent for a few minutes, with no MLX, no Rust, no network and
# no model file there. Two halves:
#
#   scripts/device-check.sh pack [--skip-cuda-build] [--out FILE]
#       here: builds specd with `--features cuda` against the mlx-cuda-13
#       wheel (target dir target/cuda), writes the tiny random checkpoint
#       and records its greedy tokens and top-2 margins with the CPU build
#       (`--kernels mlx`), and packs the binary, libmlx and its own
#       libraries, the checkpoint and the records into one .tar.xz
#       (default target/device-bundle.tar.xz), checked against the 64 MiB
#       that may travel. --skip-cuda-build packs the CPU build instead.
#
#   scripts/device-check.sh run BUNDLE [--speed-shape 1b|small] [--work DIR]
#       there: unpacks, checks the tiny model's tokens against the records
#       (identical, or the first difference where the recorded top-2
#       margin is under 0.01), writes a random model of the speed shape
#       (default 1b: Llama 3.2 1B's layers, 32k vocabulary, 4-bit) and
#       measures decode, 8- and 32-stream serving and speculation (ngram on
#       the repetitive suite); prints one table. The NVIDIA libraries come
#       from the machine (PyTorch's nvidia packages or /usr/local/cuda).
#
#   scripts/device-check.sh cpu
#       both halves here on the CPU build (pack --skip-cuda-build, run
#       --speed-shape tiny): what make test runs (tests/py/test_device_check.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIMIT=$((64 * 1024 * 1024))
PROMPTS=("Hello there" "The quick brown fox" "def add(a, b):" "Once upon a time")
TOKENS=32

die() { echo "device-check: $*" >&2; exit 1; }

pack() {
    local skip=0 out="$ROOT/target/device-bundle.tar.xz"
    while [ $# -gt 0 ]; do
        case "$1" in
            --skip-cuda-build) skip=1 ;;
            --out) out="$2"; shift ;;
            *) die "pack: unknown argument $1" ;;
        esac
        shift
    done
    local cpu="${CARGO_TARGET_DIR:-$ROOT/target}/release/specd"
    # `specd bench` runs specd-tools from beside specd: both travel.
    [ -x "$cpu" ] && [ -x "$(dirname "$cpu")/specd-tools" ] \
        || (cd "$ROOT" && cargo build --release -p specd -p specd-tools)
    local bin="$cpu"
    if [ $skip = 0 ]; then
        (cd "$ROOT" && SPECD_MLX_WHEEL=mlx-cuda-13 CARGO_TARGET_DIR="$ROOT/target/cuda" \
            cargo build --release -p specd -p specd-tools --features specd-tools/cuda)
        bin="$ROOT/target/cuda/release/specd"
    fi
    local stage
    stage="$(mktemp -d)"
    trap 'rm -rf "$stage"' RETURN
    mkdir -p "$stage/bundle/bin" "$stage/bundle/lib" "$stage/bundle/expected"
    local b="$stage/bundle"
    # Symbols stripped (the dynamic ones stay): a third of a CUDA libmlx.
    strip --strip-unneeded -o "$b/bin/specd" "$bin"
    strip --strip-unneeded -o "$b/bin/specd-tools" "$(dirname "$bin")/specd-tools"
    cp "$ROOT/scripts/device-check.sh" "$b/device-check.sh"
    # libmlx and the libraries its wheel ships beside it (LAPACK, BLAS,
    # gfortran); the NVIDIA ones are the machine's.
    local libmlx
    libmlx="$(ldd "$bin" | awk '$1 == "libmlx.so" { print $3 }')"
    [ -f "$libmlx" ] || die "pack: $bin does not resolve libmlx.so"
    strip --strip-unneeded -o "$b/lib/libmlx.so" "$libmlx"
    for d in "$(dirname "$libmlx")"/../../mlx_*.libs; do
        [ -d "$d" ] && cp "$d"/*.so* "$b/lib/"
    done
    # The tiny checkpoint and its greedy tokens on the CPU's MLX ops.
    "$cpu" debug random-model --shape tiny --seed 7 --out "$b/tiny" 2>/dev/null
    local i=0
    for p in "${PROMPTS[@]}"; do
        "$cpu" --kernels mlx debug generate --model "$b/tiny" --max-tokens $TOKENS \
            --json "$b/expected/$i.json" "$p"
        i=$((i + 1))
    done
    git -C "$ROOT" rev-parse --short HEAD > "$b/commit" 2>/dev/null || echo unknown > "$b/commit"
    mkdir -p "$(dirname "$out")"
    rm -f "$out" "$out".part*
    # -9 for the CUDA build's 146 MB libmlx; the CPU build's packs in seconds.
    tar -C "$stage" -cf - bundle | xz -T0 "-$([ $skip = 1 ] && echo 6 || echo 9)" > "$out"
    local size
    size=$(stat -c %s "$out")
    echo "device-check: packed $out: $((size / 1024 / 1024)) MiB ($size bytes; one call carries $LIMIT)"
    if [ "$size" -gt $LIMIT ]; then
        # The CUDA wheel's libmlx holds kernels for every GPU generation
        # (a 67 MB fatbin alone): over one call's limit, the bundle goes in
        # parts, one call each, gathered under an ignored folder there
        # (docs/portable.md, "The device check").
        split -b $((60 * 1024 * 1024)) -d "$out" "$out.part"
        rm "$out"
        echo "device-check: over one call's limit: $(ls "$out".part* | wc -l) parts $out.part*, each one call"
    fi
}

# Library directories of the NVIDIA packages PyTorch installs, and CUDA's.
nvidia_libs() {
    local dirs=""
    if command -v python3 >/dev/null; then
        dirs="$(python3 - <<'EOF' 2>/dev/null || true
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
print(":".join(d for r in roots for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib")))))
EOF
)"
    fi
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
        [ -d "$d" ] && dirs="$dirs:$d"
    done
    echo "$dirs"
}

run() {
    local bundle="" speed=1b work=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --speed-shape) speed="$2"; shift ;;
            --work) work="$2"; shift ;;
            -*) die "run: unknown argument $1" ;;
            *) bundle="$1" ;;
        esac
        shift
    done
    [ -n "$work" ] || work="$(mktemp -d)"
    mkdir -p "$work"
    if [ -f "$bundle" ]; then
        tar -C "$work" -xJf "$bundle"
    elif compgen -G "$bundle.part*" >/dev/null; then
        cat "$bundle".part* | tar -C "$work" -xJf -
    else
        die "run: give the bundle (.tar.xz, or the prefix of its parts) from 'pack'"
    fi
    local b="$work/bundle" t0=$SECONDS
    export LD_LIBRARY_PATH="$b/lib:$(nvidia_libs)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda ] && export CUDA_HOME=/usr/local/cuda
    local specd="$b/bin/specd"
    local device="cpu"
    command -v nvidia-smi >/dev/null && device="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"

    # Correctness: the tiny model's greedy tokens against the CPU's.
    local i=0 ok=0 ties=0 bad=0
    for p in "${PROMPTS[@]}"; do
        "$specd" --kernels mlx debug generate --model "$b/tiny" --max-tokens $TOKENS \
            --json "$work/got-$i.json" "$p"
        case "$(python3 - "$b/expected/$i.json" "$work/got-$i.json" <<'EOF'
import json, sys
want, got = (json.load(open(f)) for f in sys.argv[1:3])
w, g = want["generated_ids"], got["generated_ids"]
first = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), None)
if first is None and len(w) == len(g):
    print("same")
elif first is not None and want["margins"][first] < 0.01:
    print("tie")
else:
    print("differs", first, file=sys.stderr)
    print("bad")
EOF
)" in
            same) ok=$((ok + 1)) ;;
            tie) ties=$((ties + 1)) ;;
            *) bad=$((bad + 1)) ;;
        esac
        i=$((i + 1))
    done

    # Speed: a random model of the speed shape, written here.
    "$specd" debug random-model --shape "$speed" --seed 1 --out "$work/speed" 2> "$work/random.log"
    local decode serve spec
    decode="$("$specd" --kernels mlx bench decode --model "$work/speed" --max-tokens 128 2>&1 | tail -1)"
    serve="$("$specd" --kernels mlx bench serve --model "$work/speed" --concurrency 8,32 --drafters none \
        --temperatures 0 --max-tokens 64 2>/dev/null)"
    spec="$("$specd" --kernels mlx bench spec --model "$work/speed" --prompts repetitive --drafters ngram \
        --schedules throughput --max-tokens 64 2>/dev/null)"

    local prefill_tps decode_tps s8 s32 plain_tps spec_tps speedup
    prefill_tps="$(sed -n 's/.*prefill: [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1/p' <<<"$decode")"
    decode_tps="$(sed -n 's/.*decode: [0-9]* tokens, \([0-9.]*\) tok\/s.*/\1/p' <<<"$decode")"
    s8="$(awk '$1 == "greedy" && $2 == "none" && $3 == 8 { print $7 }' <<<"$serve")"
    s32="$(awk '$1 == "greedy" && $2 == "none" && $3 == 32 { print $7 }' <<<"$serve")"
    plain_tps="$(awk '$1 == "repetitive" && $2 == "none" { print $6 }' <<<"$spec")"
    spec_tps="$(awk '$1 == "repetitive" && $2 == "ngram" { print $6 }' <<<"$spec")"
    speedup="$(awk '$1 == "repetitive" && $2 == "ngram" { print $7 }' <<<"$spec")"

    echo
    echo "specd device check (commit $(cat "$b/commit"), --kernels mlx) on: $device"
    printf '%-44s %s\n' "check" "result"
    printf '%-44s %s\n' "tiny model vs CPU records (${#PROMPTS[@]} prompts)" \
        "$ok identical, $ties first differ at a near-tie, $bad differ"
    printf '%-44s %s\n' "speed model" "$(tail -1 "$work/random.log" | sed 's/^wrote a random //; s/ to .*//')"
    printf '%-44s %s\n' "prefill tok/s (bench decode)" "${prefill_tps:-?}"
    printf '%-44s %s\n' "decode tok/s, one stream" "${decode_tps:-?}"
    printf '%-44s %s\n' "8 streams, total tok/s (bench serve)" "${s8:-?}"
    printf '%-44s %s\n' "32 streams, total tok/s" "${s32:-?}"
    printf '%-44s %s\n' "repetitive suite: plain / ngram tok/s" "${plain_tps:-?} / ${spec_tps:-?} (${speedup:-?})"
    printf '%-44s %s\n' "wall seconds" "$((SECONDS - t0))"
    [ $bad = 0 ] || die "the tiny model's tokens differ from the CPU's away from a near-tie"
    [ -n "$decode_tps" ] && [ -n "$s8" ] && [ -n "$s32" ] && [ -n "$speedup" ] \
        || die "a benchmark gave no figure (see above)"
}

case "${1:-}" in
    pack) shift; pack "$@" ;;
    run) shift; run "$@" ;;
    cpu)
        shift
        out="$(mktemp -d)/bundle.tar.xz"
        pack --skip-cuda-build --out "$out"
        # The tiny shape for speed too: MLX's CPU quantized matmul is a
        # scalar loop, and this is the check of the two halves, not a figure.
        run "$out" --speed-shape tiny "$@"
        ;;
    *) sed -n '2,30p' "$0"; exit 2 ;;
esac
