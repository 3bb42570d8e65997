#!/usr/bin/env bash
# The instructor's --twice pass on a machine of several GPUs: each lane is `run_solutions --twice` on GPUs of
# its own (runs A and B at once, one a GPU, or GPUS_PER_RUN each for 05 and 21), and the lanes run at once.
# Each lane's executed copies (runs a/ and b/), logs and drift report are packed into $OUT/tw_NAME.tgz.
#   bash benchmarks/gpu/solutions_twice_gpu.sh COMMIT SECONDS NAME=GPUS=NOTEBOOKS [NAME=GPUS=NOTEBOOKS ...]
#   bash benchmarks/gpu/solutions_twice_gpu.sh 0da56d8 540 A=0,1=12,07,01 B=2,3=22,15,10,11
#   GPUS_PER_RUN=2 bash benchmarks/gpu/solutions_twice_gpu.sh 0da56d8 300 D=0,1,2,3=21,05
# SECONDS bounds each lane (what has run by then is still packed). Lanes share the host: a second lane slowed the
# host's issue time of the first by up to 45% (2026-11-27), which moves host-sensitive verdicts; run notebooks
# whose verdicts read the host (03, 12, 17) in a lane of their own where the budget allows.
# With fewer than 2 x GPUS_PER_RUN GPUs the two runs of a lane go one after the other: 21 takes about 300 s a run
# on a 2 x H200 machine, so its pair outlasts one 600 s device call there. Run each half in a call of its own
# (WORKSHOP_RESULTS_DIR=DIR/a/results python -m tinyllama.course.run_solutions --notebooks 21 --profile gpu
# --output DIR/a, then the same with b) and compare them with python -m tinyllama.course.drift DIR/a DIR/b.
# Store run B's copies afterwards: python -m tinyllama.course.run_solutions --store tw_NAME (refuses a notebook changed since).
set -uo pipefail
commit=$1 limit=$2
shift 2
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export WORKSHOP_COMMIT=$commit WORKSHOP_PROFILE=gpu WORKSHOP_STRICT=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || rocm-smi --showproductname 2>/dev/null
variable=CUDA_VISIBLE_DEVICES
command -v rocm-smi > /dev/null && ! command -v nvidia-smi > /dev/null && variable=HIP_VISIBLE_DEVICES
began=$(date +%s)
names=()
for lane in "$@"; do
    IFS='=' read -r name gpus notebooks <<< "$lane"
    names+=("$name")
    rm -rf "/tmp/tw_$name"
    (env "$variable=$gpus" WORKSHOP_RESULTS_DIR="/tmp/results_$name" timeout "$limit" \
        python3 -m tinyllama.course.run_solutions --profile gpu --kernel-name python3 --timeout 500 \
        --notebooks ${notebooks//,/ } --twice --gpus-per-run "${GPUS_PER_RUN:-1}" --output "/tmp/tw_$name" \
        > "/tmp/tw_$name.log" 2>&1
     echo "lane $name: exit $? after $(( $(date +%s) - began )) s" >> "/tmp/tw_$name.log") &
done
wait
for name in "${names[@]}"; do
    mkdir -p "/tmp/tw_$name" && cp "/tmp/tw_$name.log" "/tmp/tw_$name/"
    tar czf "$OUT/tw_$name.tgz" --exclude=compiler-cache -C /tmp "tw_$name"
    echo "=== lane $name"
    grep -E "^\[(a|b)\] (ok|FAILED)|^lane|moved|drift" "/tmp/tw_$name.log" | tail -30
done
