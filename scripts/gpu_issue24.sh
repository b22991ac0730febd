#!/bin/bash
# Issue 24 on a lent GPU (about 300 s): calibrate the xla model with its kernel-floor probes, judge
# the saved plans with its predictions beside the measured speedups, and re-price the rows into the
# predicted-vs-measured table. Needs JAX and this repository only (no egglog, z3 or highspy).
# PLANS: the folder holding default/ and tensatonly/ written by `eqsat optimize --save-graphs`
# (the lead's .gpuplans, carried to the device). Outputs under $OUT. From the device tool:
#   run(command="bash scripts/gpu_issue24.sh", carry=[".gpuplans"], timeout_s=420)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD EQSAT_CACHE_DIR=/tmp/eqsat-cache-issue24
PLANS=${PLANS:-.gpuplans}
OUT=${OUT:-/tmp/gpu_issue24_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import sys, jax, numpy; print(sys.version); print('jax', jax.__version__, 'numpy', numpy.__version__, jax.devices())" >> "$OUT/gpu.txt" 2>&1
DEV=$(python3 -c "import jax; k = jax.devices()[0].device_kind.lower(); print('h200' if 'h200' in k else 'h100' if 'h100' in k else 'cpu')")
echo "label $DEV plans $PLANS" >> "$OUT/gpu.txt"
SECONDS=0
timeout ${CAL_S:-130} python3 -m eqsat.cli calibrate --device "$DEV" --force --json > "$OUT/calibrate.jsonl" 2> "$OUT/calibrate.err"
echo "calibrate rc=$? s=$SECONDS" >> "$OUT/gpu.txt"
cp "$EQSAT_CACHE_DIR"/xla/*.json "$OUT/" 2>/dev/null
XLA=""; [ -s "$OUT/calibrate.jsonl" ] && XLA="--xla-device $DEV"
timeout ${JUDGE_S:-160} python3 -m eqsat.cli judge ${DIRS:-"$PLANS/default" "$PLANS/tensatonly"} \
  --models ${MODELS:-squeezenet bert inceptionv3 nasrnn resnext50 vgg nasneta} \
  --timing-budget ${BUDGET:-8} --predict-device h100 $XLA --json > "$OUT/judge.jsonl" 2> "$OUT/judge.err"
echo "judge rc=$? s=$SECONDS" >> "$OUT/gpu.txt"
CAL=$(ls "$OUT"/*-jax*.json 2>/dev/null | head -1)
if [ -n "$CAL" ] && [ -s "$OUT/judge.jsonl" ]; then
  timeout 60 python3 -m experiments.xla_gpu_offline "$CAL" "$PLANS" "$OUT/judge.jsonl" > "$OUT/table.md" 2>> "$OUT/judge.err"
  echo "table rc=$? s=$SECONDS" >> "$OUT/gpu.txt"
fi
cat "$OUT/gpu.txt"; cat "$OUT/calibrate.err" | tail -30; cat "$OUT/table.md" 2>/dev/null; tail -c 1500 "$OUT/judge.err"
