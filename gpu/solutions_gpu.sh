#!/usr/bin/env bash
# Runs solution notebooks at the gpu profile on a GPU machine and packs the executed copies into
# $OUT/solutions-gpu.tgz (the device tool returns few files). Usage: bash gpu/solutions_gpu.sh 00 01 ...
set -uo pipefail
export WORKSHOP_PROFILE=gpu WORKSHOP_STRICT=1 WORKSHOP_RESULTS_DIR=/tmp/results PYTHONUNBUFFERED=1
python3 -m tinyllama.course.run_solutions --profile gpu --kernel-name python3 --output /tmp/run --notebooks "$@"
rc=$?
tar czf "$OUT/solutions-gpu-$1.tgz" -C /tmp run
exit $rc
