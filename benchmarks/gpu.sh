#!/usr/bin/env bash
# What a GPU lent for a few minutes should measure, in one call that ends within $LIMIT seconds
# (default 570: under the device tool's 10 minutes a command; give the call timeout_s 600), the
# issue's goals first, the default curve (never measured on a GPU) before the rest
# (docs/performance.md, "On a GPU machine"). Here, once, pack the checkout with every data
# folder the default curve reads, compressed (17 MB of text in 2.6 MB; the pack is about 53 MiB,
# under the 64 MiB a call carries):
#
#   make gpu-pack     # ../shared/tools/gpu-pack with the data folders, then the data compressed
#
# There, carrying .gpu:   source .gpu/env.sh && bash benchmarks/gpu.sh
#
# Each step runs under its own time limit (or what is left of $LIMIT, whichever is less) and is
# logged; a step that fails or runs out of time does not stop the next. Written to $OUT (the
# device tool's folder; build/gpu elsewhere), three files: gpu.log (every step's output and the
# seconds it took), table.md (benchmarks/table.py --markdown: every JSON result, the device
# named) and bench.tar.gz (build/bench/*.json and the curve's tables). DEVICE (default cuda) and
# PY (default python3) may be set to try the script elsewhere.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu}
device=${DEVICE:-cuda}
py=${PY:-python3}
limit=${LIMIT:-570}
start=$SECONDS
mkdir -p "$out" build/bench
log="$out/gpu.log"
: > "$log"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if [ -f .gpu/data.tar.xz ] && [ ! -d .gpu/data ]; then
  tar xJf .gpu/data.tar.xz -C .gpu
fi

# step SECONDS NAME COMMAND...: COMMAND with at most SECONDS (less if less is left), logged
step() {
  local most=$1 name=$2
  shift 2
  local left=$(( limit - (SECONDS - start) ))
  local budget=$(( left < most ? left : most ))
  if (( budget < 15 )); then
    echo "== $name: not run ($left s left of $limit)" | tee -a "$log"
    return
  fi
  echo "== $name (at most $budget s)" | tee -a "$log"
  local began=$SECONDS
  timeout --signal=INT --kill-after=15 "$budget" "$@" 2>&1 | tee -a "$log"
  echo "== $name: exit ${PIPESTATUS[0]} in $(( SECONDS - began )) s ($(( SECONDS - start )) s in all)" | tee -a "$log"
}

if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$log"
fi
find build/bench -name '*.json' -delete 2>/dev/null
step 100 "CUDA tests" "$py" -m pytest -q -p no:cacheprovider tests/system/test_cuda.py
step 90 "compare cost, MiniLM" "$py" benchmarks/compare_cost.py --device "$device"
step 60 "papa.fit" "$py" benchmarks/papa_fit.py --device "$device"
step 60 "effective attention" "$py" benchmarks/effective.py --device "$device"
# the default curve, cold (its goal: at most 300 s; never measured on a GPU: before the rest)
step 330 "the default PAPA curve" "$py" benchmarks/curve.py --device "$device"
step 60 "constant heads, 64 texts x 256" "$py" benchmarks/constant_speed.py --device "$device" --batch 64
step 100 "compare cost, BERT-base shape" "$py" benchmarks/compare_cost.py --device "$device" --model bert-base-random --repeats 1
step 80 "compare cost, MiniLM, batches of 128" "$py" benchmarks/compare_cost.py --device "$device" --batch 128
"$py" benchmarks/table.py --markdown > "$out/table.md" 2>> "$log"
tar czf "$out/bench.tar.gz" build/bench docs/papa_curve.csv docs/papa_table.csv docs/papa_table.md 2>> "$log"
echo "== done in $(( SECONDS - start )) s" | tee -a "$log"
