#!/usr/bin/env bash
# Runs solution notebooks at the gpu profile on a GPU machine, one at a time, and packs each executed
# copy with its log into $OUT/nb-NN.tgz as soon as it has run (the device tool returns at most 8 files,
# and a call cut off at its time limit still returns what is under $OUT).
#   bash benchmarks/gpu/solutions_gpu.sh 10 11 12        # NB_TIMEOUT=280 seconds per notebook by default
# Copy the executed notebooks into solutions/ afterwards: they carry the reference outputs.
set -uo pipefail
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export WORKSHOP_PROFILE=gpu WORKSHOP_STRICT=1 WORKSHOP_RESULTS_DIR=/tmp/results PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || rocm-smi --showproductname 2>/dev/null
status=0
for nb in "$@"; do
    began=$(date +%s)
    timeout "${NB_TIMEOUT:-280}" python3 -m tinyllama.course.run_solutions --profile gpu --kernel-name python3 \
        --timeout 270 --output "/tmp/run-$nb" --notebooks "$nb" > "/tmp/log-$nb.txt" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=$rc
    echo "notebook $nb: exit $rc after $(( $(date +%s) - began )) s"
    mkdir -p "/tmp/run-$nb" && cp "/tmp/log-$nb.txt" "/tmp/run-$nb/"
    tar czf "$OUT/nb-$nb.tgz" -C /tmp "run-$nb"
done
exit $status
