#!/usr/bin/env bash
# TinyLLaMA text generation on one GPU, in one call: every configuration is checked against the fp32
# no-cache reference before it is timed (python -m tinyllama.harness.generate --check).
#
#   OUT=results bash benchmarks/gpu/generate_gpu.sh
#   OUT=results STAGES=sweep PRESETS=large BATCHES="64 128 256" bash benchmarks/gpu/generate_gpu.sh
#
# For each preset (PRESETS, default "medium large") and version (VERSIONS, default v2), in bf16, with a
# prompt of PROMPT_LEN (512) and NEW_TOKENS (128) generated tokens per sequence:
#   ladder (batch 1): no cache (recompute everything) -> cache, eager -> cache + compile ->
#                     cache + CUDA graph -> cache + compile + CUDA graph
#   sweep:            batch 1, 2, 4, ... 256 (BATCHES) with SWEEP_FLAGS (default --cuda-graphs), until the
#                     first failure (out of memory ends it, with one line in the log; any other failure
#                     also makes the script's exit status 1)
# Records are appended to $OUT/generate_ladder.json and $OUT/generate_sweep.json, the output goes to
# $OUT/generate.log and a table of every record to $OUT/generate.md. Each configuration is one process
# (a sweep survives an out-of-memory). Both stages at both presets may exceed 10 minutes: run them in
# separate calls with STAGES=ladder and STAGES=sweep.
set -uo pipefail
: "${OUT:?set OUT to the folder for the results, e.g. OUT=results bash benchmarks/gpu/generate_gpu.sh}"
PYTHON=${PYTHON:-python3}
PRESETS=${PRESETS:-medium large}
VERSIONS=${VERSIONS:-v2}
PROMPT_LEN=${PROMPT_LEN:-512}
NEW_TOKENS=${NEW_TOKENS:-128}
BATCHES=${BATCHES:-1 2 4 8 16 32 64 128 256}
SWEEP_FLAGS=${SWEEP_FLAGS---cuda-graphs}  # may be set empty: the eager cache
STAGES=${STAGES:-ladder sweep}
LADDER=("--no-cache" "" "--compile" "--cuda-graphs" "--compile --cuda-graphs")

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.." || exit 1  # the checkout, importable without installing it
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG="$OUT/generate.log"

# run LABEL JSON FLAGS...: one configuration, checked then timed; returns the command's status
run() {
    local label=$1 json=$2
    shift 2
    echo "== $label" | tee -a "$LOG"
    "$PYTHON" -m tinyllama.harness.generate --precision bf16 --prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" \
        --check --quiet --json "$json" "$@" 2>&1 | tee -a "$LOG"
    return "${PIPESTATUS[0]}"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
        || rocm-smi --showproductname 2>/dev/null
    "$PYTHON" -c 'import torch, triton; print("torch", torch.__version__, "| triton", triton.__version__)'
    date -u +"%Y-%m-%d %H:%M UTC"
} | tee -a "$LOG"

status=0
for preset in $PRESETS; do
    for version in $VERSIONS; do
        if [[ " $STAGES " == *" ladder "* ]]; then
            for flags in "${LADDER[@]}"; do
                # shellcheck disable=SC2086  # $flags is zero, one or two words
                run "$preset $version batch 1 ${flags:-(cache, eager)}" "$OUT/generate_ladder.json" \
                    --preset "$preset" --version "$version" --batch-size 1 $flags || status=1
            done
        fi
        if [[ " $STAGES " == *" sweep "* ]]; then
            for batch in $BATCHES; do
                # shellcheck disable=SC2086
                if ! run "$preset $version batch $batch $SWEEP_FLAGS" "$OUT/generate_sweep.json" \
                        --preset "$preset" --version "$version" --batch-size "$batch" $SWEEP_FLAGS; then
                    echo "-- the sweep of $preset $version ends at batch $batch (see the line above)" | tee -a "$LOG"
                    tail -n 2 "$LOG" | grep -q "out of memory" || status=1  # anything else is a failure
                    break
                fi
            done
        fi
    done
done

"$PYTHON" - "$OUT"/generate_*.json > "$OUT/generate.md" <<'EOF'
import sys

from tinyllama.generation.benchmark import summary_table
from tinyllama.harness.records import load_json, markdown_table

for path in sys.argv[1:]:
    print(f"## {path.rsplit('/', 1)[-1]}\n\n{markdown_table(summary_table(load_json(path)))}\n")
EOF
cat "$OUT/generate.md"
exit $status
