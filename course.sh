#!/usr/bin/env bash
# The TinyLLaMA performance workshop: one script for participants, instructors and CI.
#
#   bash course.sh start        set up (first time) and open JupyterLab on the notebooks
#   bash course.sh test         set up (first time) and run the whole test suite, notebooks included
#   bash course.sh instructor   run every solution notebook headless and summarise the results
#   bash course.sh kernel       register the course's Jupyter kernel for this user (for a JupyterHub)
#   bash course.sh setup        only set up .venv
#
# Set-up makes .venv in this folder and installs the project into it. A PyTorch that is already
# installed (an AMD node's ROCm build from `module load pytorch`, say) is reused, never replaced.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$PWD
VENV=${WORKSHOP_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
KERNEL_NAME=tinyllama-workshop

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
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        echo "Installing the workshop into $VENV (the first time takes a few minutes) ..."
        local constraints="$VENV/keep-torch.txt"
        : > "$constraints"
        if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
            # Pin whatever torch is there, so that pip cannot swap a ROCm build for a CUDA one. The pin
            # names the public version (2.14.1, not 2.14.1+rocm6.4): the installed build satisfies it,
            # and pip's resolver refuses a local label beside a site-wide cap such as torch<=2.14.1.
            "$VENV/bin/python" -c 'import torch; print("torch==" + torch.__version__.split("+")[0])' > "$constraints"
        fi
        "$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
        "$VENV/bin/python" -m pip install -q -c "$constraints" -e ".[test]" 2>&1 | grep -v "is ignored" || true
        "$VENV/bin/python" -c "import tinyllama, inference, torch, torchvision, jupyterlab, nbval" \
            || { echo "set-up failed: see the pip messages above"; exit 1; }
        "$VENV/bin/python" -m ipykernel install --sys-prefix --name "$KERNEL_NAME" \
            --display-name "TinyLLaMA workshop" >/dev/null
        touch "$stamp"
    fi
}

case "${1:-start}" in
    setup)
        setup ;;
    start)
        setup
        shift || true
        # Each participant works on a copy of the notebooks in a folder of their own: on a hub many
        # users share one checkout, and autosave must never write into it. Existing copies are kept.
        WORKSPACE=${WORKSHOP_WORKSPACE:-$HOME/tinyllama-workshop}
        mkdir -p "$WORKSPACE/notebooks"
        cp -n notebooks/*.ipynb "$WORKSPACE/notebooks/" 2>/dev/null || true
        echo "Your notebooks: $WORKSPACE/notebooks (your own copies; updates from the course never overwrite them)"
        echo "Your results:   ${WORKSHOP_RESULTS_DIR:-$HOME/tinyllama-workshop-results}"
        ROOT_FLAG=()
        [ "$(id -u)" = 0 ] && ROOT_FLAG=(--allow-root)
        exec "$VENV/bin/jupyter" lab --notebook-dir "$WORKSPACE" --ServerApp.default_url=/lab/tree/notebooks \
            "${ROOT_FLAG[@]}" "$@" ;;
    kernel)
        setup
        "$VENV/bin/python" -m ipykernel install --user --name "$KERNEL_NAME" --display-name "TinyLLaMA workshop"
        echo "Kernel 'TinyLLaMA workshop' registered: choose it in your JupyterHub's launcher." ;;
    test)
        setup
        shift || true
        export WORKSHOP_PROFILE=ci WORKSHOP_STRICT=1
        export WORKSHOP_RESULTS_DIR=${WORKSHOP_RESULTS_DIR:-$(mktemp -d)}
        "$VENV/bin/python" -m pytest tests -q "$@"
        "$VENV/bin/python" -m pytest -q --nbval-lax --nbval-current-env \
            --nbval-sanitize-with tests/nbval_sanitize.cfg solutions ;;
    instructor)
        setup
        shift || true
        exec "$VENV/bin/python" -m tinyllama.course.run_solutions "$@" ;;
    *)
        sed -n '2,11p' "$0"; exit 2 ;;
esac
