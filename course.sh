#!/usr/bin/env bash
# The TinyLLaMA performance workshop: one script for participants, instructors and CI.
#
#   bash course.sh start        set up (first time) and open JupyterLab on the notebooks
#   bash course.sh test         set up (first time) and run the whole test suite, notebooks included
#   bash course.sh instructor   run every solution notebook headless and summarise the results
#   bash course.sh kernel       on a JupyterHub: register the course's kernel for this user and copy
#                               the notebooks to ~/tinyllama-workshop/notebooks
#   bash course.sh setup        only set up .venv (WORKSHOP_VENV=/opt/venv: a shared one, for a hub)
#   bash course.sh lock         re-pin constraints.txt (the tested versions) to what .venv has
#
# Set-up makes .venv in this folder (or $WORKSHOP_VENV, remembered for later calls) and installs the
# project into it. A PyTorch that is already installed (an AMD node's ROCm build from `module load
# pytorch`, say) is reused, never replaced.
set -euo pipefail
if [ -n "${WORKSHOP_VENV:-}" ]; then
    case $WORKSHOP_VENV in /*) ;; *) WORKSHOP_VENV=$PWD/$WORKSHOP_VENV ;; esac
fi
cd "$(dirname "$0")"
ROOT=$PWD
# Where set-up installed when WORKSHOP_VENV named a shared environment: the participants of a hub then
# run `course.sh kernel` from this checkout without having to know that place.
VENV_NOTE=$ROOT/.workshop-venv
if [ -n "${WORKSHOP_VENV:-}" ]; then
    VENV=$WORKSHOP_VENV
elif [ -s "$VENV_NOTE" ]; then
    VENV=$(cat "$VENV_NOTE")
else
    VENV=$ROOT/.venv
fi
PY=${PYTHON:-python3}
KERNEL_NAME=tinyllama-workshop  # tinyllama.course.jupyter_setup.KERNEL_NAME, which every notebook names
KERNEL_DISPLAY="TinyLLaMA workshop"

# PyTorch's CUDA build and the libraries beside it take about 6 GiB once installed (a fresh .venv measured
# 6.1 GiB), and pip unpacks them on the way: on a disk without that room pip stops half-way with an OSError.
# WORKSHOP_SETUP_GIB changes what is asked for (a smaller CPU or ROCm build needs less).
check_space() {
    local python=$1 need_gib=${WORKSHOP_SETUP_GIB:-7} dir=$VENV free_kib
    "$python" -c "import torch" 2>/dev/null && return 0  # PyTorch is there already: pip adds little
    while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
    free_kib=$(df -Pk "$dir" | awk 'NR == 2 {print $4}')
    if [ "$free_kib" -lt $((need_gib * 1024 * 1024)) ]; then
        echo "error: set-up installs PyTorch into $VENV and needs about $need_gib GiB free there;" \
            "$((free_kib / 1024 / 1024)) GiB are free." >&2
        echo "Free some space, or install on a larger disk: WORKSHOP_VENV=/larger/disk/venv bash course.sh setup" >&2
        exit 1
    fi
}

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        if "$PY" -c "import torch" 2>/dev/null; then
            echo "Reusing the PyTorch already installed for $PY: $("$PY" -c 'import torch; print(torch.__version__)')"
            "$PY" -m venv --system-site-packages "$VENV"
        else
            "$PY" -m venv "$VENV"
        fi
    fi
    local stamp="$VENV/.installed"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
        check_space "$VENV/bin/python"
        echo "Installing the workshop into $VENV (the first time takes a few minutes) ..."
        # constraints.txt holds the versions the test suite passed with; set-up installs exactly those.
        # What the Python already has (a site's ROCm PyTorch and the packages beside it) is kept as it is,
        # pinned to its installed version so that pip can never swap a ROCm build for a CUDA one.
        local constraints="$VENV/constraints.txt"
        "$VENV/bin/python" - "$ROOT/constraints.txt" > "$constraints" <<'PY'
import re, sys
from importlib.metadata import distributions

def key(name): return re.sub(r"[-_.]+", "-", name).lower()

# The public version (2.14.1, not 2.14.1+rocm6.4): the installed build satisfies it, and pip's resolver
# refuses a local label beside a site-wide cap such as torch<=2.14.1.
have = {key(d.metadata["Name"]): d.version.split("+")[0] for d in distributions() if d.metadata["Name"]}
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line and key(line.split("==")[0]) not in have:
        print(line)
for name in ("torch", "torchvision", "triton", "pytorch-triton-rocm"):
    if name in have:
        print(f"{name}=={have[name]}")
PY
        "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" pip 2>&1 | grep -v "is ignored" || true
        "$VENV/bin/python" -m pip install -q -c "$constraints" -e ".[test]" 2>&1 | grep -v "is ignored" || true
        "$VENV/bin/python" -c "import tinyllama, inference, torch, torchvision, jupyterlab, nbval" \
            || { echo "set-up failed: see the pip messages above"; exit 1; }
        "$VENV/bin/python" -m ipykernel install --sys-prefix --name "$KERNEL_NAME" \
            --display-name "$KERNEL_DISPLAY" >/dev/null
        # JupyterLab's defaults for the course (no news question over the notebooks).
        "$VENV/bin/python" -m tinyllama.course.jupyter_setup lab-settings >/dev/null
        touch "$stamp"
    fi
    if [ "$VENV" != "$ROOT/.venv" ] && [ "$(cat "$VENV_NOTE" 2>/dev/null)" != "$VENV" ]; then
        echo "$VENV" > "$VENV_NOTE" 2>/dev/null \
            || echo "note: could not write $VENV_NOTE: give WORKSHOP_VENV=$VENV to every course.sh command"
    fi
}

# Each participant works on a copy of the notebooks in a folder of their own: on a hub many users share
# one checkout, and autosave must never write into it. Existing copies are kept.
copy_notebooks() {
    WORKSPACE=${WORKSHOP_WORKSPACE:-$HOME/tinyllama-workshop}
    mkdir -p "$WORKSPACE/notebooks"
    local copied=0 kept=0 notebook
    for notebook in notebooks/*.ipynb; do
        if [ -e "$WORKSPACE/notebooks/$(basename "$notebook")" ]; then
            kept=$((kept + 1))
        else
            # Writable by their owner even where the checkout is read-only, or autosave would fail.
            cp "$notebook" "$WORKSPACE/notebooks/" && chmod u+w "$WORKSPACE/notebooks/$(basename "$notebook")" \
                && copied=$((copied + 1))
        fi
    done
    echo "Your notebooks: $WORKSPACE/notebooks ($copied copied, $kept of yours kept as they are)"
    echo "Your results:   ${WORKSHOP_RESULTS_DIR:-$HOME/tinyllama-workshop-results}"
}

case "${1:-start}" in
    setup)
        setup ;;
    start)
        setup
        shift || true
        copy_notebooks
        ROOT_FLAG=()
        [ "$(id -u)" = 0 ] && ROOT_FLAG=(--allow-root)
        exec "$VENV/bin/jupyter" lab --notebook-dir "$WORKSPACE" --ServerApp.default_url=/lab/tree/notebooks \
            "${ROOT_FLAG[@]}" "$@" ;;
    kernel)
        # A participant never installs into an installation that exists (on a hub the admin's, shared and
        # not theirs to change): set-up runs only where there is none yet and this user may make one.
        if [ ! -f "$VENV/.installed" ]; then
            if { [ -e "$VENV" ] && [ ! -w "$VENV" ]; } || { [ ! -e "$VENV" ] && [ ! -w "$(dirname "$VENV")" ]; }; then
                echo "error: the course is not installed in $VENV, and you cannot install it there." >&2
                echo "On a JupyterHub the admin installs it once: WORKSHOP_VENV=/opt/tinyllama-venv bash $ROOT/course.sh setup" >&2
                exit 1
            fi
            setup
        elif [ pyproject.toml -nt "$VENV/.installed" ]; then
            echo "note: the installation in $VENV is older than this checkout's pyproject.toml; whoever installed it runs" \
                 "\`bash $ROOT/course.sh setup\` again to update it"
        fi
        "$VENV/bin/python" -m ipykernel install --user --name "$KERNEL_NAME" --display-name "$KERNEL_DISPLAY" \
            >/dev/null
        echo "Kernel '$KERNEL_DISPLAY' registered for $(id -un) (Python: $VENV/bin/python)."
        copy_notebooks
        echo "Open $WORKSPACE/notebooks/00_environment_check.ipynb in JupyterLab; it runs in '$KERNEL_DISPLAY'"
        echo "(reload the JupyterLab page if it was open before)." ;;
    test)
        setup
        shift || true
        export WORKSHOP_PROFILE=ci WORKSHOP_STRICT=1
        export WORKSHOP_RESULTS_DIR=${WORKSHOP_RESULTS_DIR:-$(mktemp -d)}
        # The notebooks compile into empty caches of this run's own: a cache an earlier run left could
        # hide a changed kernel (torch.compile does not invalidate it when a custom operator changes).
        CACHES=$(mktemp -d)
        trap 'rm -rf "$CACHES"' EXIT
        export TORCHINDUCTOR_CACHE_DIR=$CACHES/inductor TRITON_CACHE_DIR=$CACHES/triton
        "$VENV/bin/python" -m pytest tests -q "$@"
        "$VENV/bin/python" -m pytest -q --nbval-lax --nbval-current-env \
            --nbval-sanitize-with tests/nbval_sanitize.cfg solutions ;;
    lock)
        # Re-pins constraints.txt to what this venv has. Run it in a venv made from a Python without torch
        # (no site packages), after `pip install -U` of what should move, then `bash course.sh test`, and
        # commit both: the lock changes only together with a green suite.
        setup
        {
            echo "# The versions the test suite passed with; course.sh installs exactly these (what a site's Python"
            echo "# already has, its own PyTorch build say, is kept instead). Regenerate with \`bash course.sh lock\`."
            "$VENV/bin/python" -m pip freeze --all --exclude-editable | grep -v -E "^(setuptools|wheel)==" | LC_ALL=C sort -f
        } > constraints.txt
        echo "constraints.txt: $(grep -c "==" constraints.txt) pinned packages" ;;
    instructor)
        setup
        shift || true
        exec "$VENV/bin/python" -m tinyllama.course.run_solutions "$@" ;;
    *)
        sed -n '2,14p' "$0"; exit 2 ;;
esac
