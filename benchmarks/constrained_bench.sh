#!/usr/bin/env bash
# Constrained decoding on the starter pair: bench's json_schema and tool_call categories.
#
#   bash benchmarks/constrained_bench.sh [OUT.json] [extra draftpen bench args]
#
# Compares constrained plain decoding with unconstrained plain decoding (what the
# grammar's mask costs) and the draft model and auto with constrained plain (what
# speculation, grammar-forced drafts included, gains), alternating modes prompt by
# prompt. Then prints the two ratios the agents issue (17) sets targets for. Run it on
# a quiet machine: on a shared one the figures scatter.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-/tmp/draftpen-constrained-bench.json}"
shift || true
python="${PYTHON:-$here/.venv/bin/python}"
export DRAFTPEN_HOME="${DRAFTPEN_HOME:-$(mktemp -d)}"
export DRAFTPEN_MODELS_DIR="${DRAFTPEN_MODELS_DIR:-$HOME/.cache/draftpen-test-models}"
cd "$here"
"$python" -m app.main bench --pair starter --category json_schema --category tool_call \
    --modes draft,auto --no-yardsticks --repeats 2 --output "$out" "$@"
"$python" - "$out" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
for category, modes in data["results"].items():
    rate = {label: figures["tokens_per_second"] for label, figures in modes.items()}
    plain = rate["plain"]
    for label, value in rate.items():
        print(f"{category:12} {label:28} {value:6.2f} tok/s  {value / plain:5.2f}x constrained plain")
PY
