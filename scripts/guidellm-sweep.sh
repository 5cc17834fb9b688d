#!/usr/bin/env bash
# A short guidellm concurrency sweep against a running `specd serve`
# (docs/serving.md: "Behind a router"). guidellm is not in the test venv: it pulls
# torch and CUDA wheels (about 6 GB), so install it apart:
#
#   python3 -m venv ~/guidellm-venv && ~/guidellm-venv/bin/pip install guidellm==0.8.1
#   GUIDELLM=~/guidellm-venv/bin/guidellm scripts/guidellm-sweep.sh http://127.0.0.1:11435
#
# Its tokenizer is a `specd convert` directory of the served model (nothing
# comes from a hub). Synthetic chat prompts of 64 tokens, 32 output tokens
# each (guidellm sends ignore_eos), 8 requests at 1, 2 and 4 streams.
set -euo pipefail
URL=${1:-http://127.0.0.1:11435}
GUIDELLM=${GUIDELLM:-guidellm}
SPECD=${SPECD_BIN:-$(dirname "$0")/../target/release/specd}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$SPECD" convert "$("$SPECD" pull --path smollm2:135m)" "$WORK/tokenizer" >/dev/null
cat > "$WORK/scenario.json" <<JSON
{
  "metadata": {"name": "specd-sweep", "description": "short concurrency sweep"},
  "spec": {
    "backend": {"kind": "openai_http", "target": "$URL", "model": "smollm2:135m",
                "request_format": "/v1/chat/completions"},
    "profile": {"kind": "concurrent"},
    "tokenizer": {"kind": "huggingface_auto", "model": "$WORK/tokenizer"},
    "data": [{"kind": "synthetic_text", "prompt_tokens": 64, "output_tokens": 32}],
    "constraints": [{"kind": "max_requests", "count": 8}]
  },
  "benchmarks": [{"profile.streams": 1}, {"profile.streams": 2}, {"profile.streams": 4}]
}
JSON
cd "$WORK"
HF_HUB_OFFLINE=1 "$GUIDELLM" run -c "$WORK/scenario.json" --disable-progress
