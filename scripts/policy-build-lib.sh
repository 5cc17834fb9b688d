# What scripts/build-js-plugins.sh and scripts/build-python-plugins.sh
# share; they source it after setting TOOL (their name, for messages) and
# ROOT.  Not run on its own.

die() { echo "$TOOL: $*" >&2; exit 1; }

# lock_out OUT: makes OUT and plugins/target and holds the tool's lock until
# the script exits (two builds at once would write the same files).
lock_out() {
    mkdir -p "$1" "$ROOT/plugins/target"
    exec 9>"$ROOT/plugins/target/.$TOOL.lock"
    flock 9
}

# world_of HAS_SCHEDULE HAS_ACCEPTANCE (each 1 or 0): the WIT world of a
# component that exports those interfaces; nothing for neither.
world_of() {
    case "$1$2" in
        11) echo policy ;;
        10) echo schedule-policy ;;
        01) echo acceptance-policy ;;
    esac
}

# up_to_date OUT DIR GLOB: OUT exists and none of what it is built from (the
# GLOB files of DIR, wit/, the calling script and this one) is newer.
up_to_date() {
    [[ -f "$1" ]] || return 1
    local stale
    stale=$(find "$2" "$ROOT/wit" "$0" "${BASH_SOURCE[0]}" -newer "$1" \
        \( -name "$3" -o -name '*.wit' -o -name '*.sh' \) -print -quit)
    [[ -z "$stale" ]]
}

# build OUT LOG WHAT CMD...: runs CMD, which writes OUT.tmp, with its output
# in LOG; on failure shows LOG and stops with "WHAT failed", else moves
# OUT.tmp to OUT, counts it in $built and says how long it took.
build() {
    local out=$1 log=$2 what=$3 t0
    shift 3
    t0=$(date +%s%N)
    if ! "$@" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$out.tmp"
        die "$what failed"
    fi
    mv "$out.tmp" "$out"
    built=$((built + 1))
    echo "$TOOL: $out ($(stat -c %s "$out") bytes) in $((($(date +%s%N) - t0) / 1000000)) ms" >&2
}
