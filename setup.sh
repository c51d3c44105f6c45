#!/usr/bin/env bash
# One-step setup on a fresh machine: a venv with torch (CUDA build where a GPU is present, the CPU
# build otherwise — never a multi-GB CUDA wheel on a CPU-only machine) and synodic with dev extras.
#   VENV=dir        the venv to make or update (default .venv)
#   INSTALL=spec    what to install into it (default: this checkout, editable, with dev extras)
set -euo pipefail
cd "$(dirname "$0")"
py=${PYTHON:-python3}
venv=${VENV:-.venv}
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q)
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    "${pip[@]}" "torch>=2.11"
  else
    # A CPU wheel in the local wheel cache (pip find-links) if there is one; else PyTorch's CPU index.
    # The probe's download goes to a temporary folder removed on exit (it is a ~180 MB wheel).
    probe=$(mktemp -d)
    trap 'rm -rf "$probe"' EXIT
    if "$venv/bin/python" -m pip download -q --no-deps --no-index -d "$probe" "torch==2.13.0" 2>/dev/null; then
      "${pip[@]}" "torch==2.13.0"
    else
      "${pip[@]}" "torch>=2.11" --index-url https://download.pytorch.org/whl/cpu
    fi
  fi
fi
# shellcheck disable=SC2086  # INSTALL may name several requirements
"${pip[@]}" ${INSTALL:--e .[dev]}
echo "setup done: $("$venv/bin/python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())')"
