#!/usr/bin/env bash
# Train and ship all six drafters (dflash, dspark, dflash2 x tiny_mamba2, tiny_gdn) with the recipe in
# conf/pipeline/train_drafter.yaml (docs/speculative.md, "Training recipe"), exporting each into
# synodic/assets/drafters/<model>/<scheme>/ (fp8, ~2-3 MB a file), then pack the drafters and every run's
# results.json / metrics.csv / plots into one tar.xz. H200: ~1 minute a drafter. The three schemes of a model share
# its training data (the first run's data.safetensors, which depends only on the model and the data settings).
#   bash benchmarks/train_drafters.sh [OUT_DIR] [extra overrides...]
set -euo pipefail
out=${1:-runs/drafters}; shift || true
py=${PYTHON:-python3}
mkdir -p "$out"
for model in tiny_mamba2 tiny_gdn; do
  for scheme in dflash dspark dflash2; do
    dir="$out/$model-$scheme"
    mkdir -p "$dir"
    [ -f "$out/$model-dflash/data.safetensors" ] && [ ! -f "$dir/data.safetensors" ] && \
      cp "$out/$model-dflash/data.safetensors" "$dir/"
    $py run.py pipeline=train_drafter spec=$scheme model=$model \
      pipeline.export_to=synodic/assets/drafters/$model/$scheme hydra.run.dir="$dir" "$@" 2>&1 | grep -v "^step "
  done
done
# one tar: the shipped drafters + each run's report (not the checkpoints or the cached data)
tar -cJf "$out/drafters.tar.xz" synodic/assets/drafters \
  $(cd "$out" >/dev/null; for d in */; do for f in results.json metrics.csv loss.png acceptance.png; do
      [ -f "$d$f" ] && printf '%s ' "$out/$d$f"; done; done)
ls -l "$out/drafters.tar.xz"
