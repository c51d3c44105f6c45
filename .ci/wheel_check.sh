#!/usr/bin/env bash
# The wheel a user gets from `pip install .`: built, installed into a fresh venv, run from a directory
# that is not the checkout (configs, models and kernels must come from the installed package).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python -m pip wheel -q --no-deps -w "$work/dist" .
rm -rf build
VENV="$work/venv" INSTALL="$(ls "$work"/dist/synodic-*.whl)" ./setup.sh
mkdir "$work/run" && cd "$work/run"
"$work/venv/bin/synodic" --cfg job > job.yaml
grep -q "kind: tiny_mamba2" job.yaml
"$work/venv/bin/synodic" workload.max_tokens=4 runtime.device=cpu
test -f outputs/*/*/results.json
echo "wheel check passed"
