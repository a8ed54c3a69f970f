#!/usr/bin/env bash
# Row-wise sweep session on the device machine: the carried library, then
# lab/sweep_rowwise.py once per setting (SETTINGS, space-separated: "default",
# or a sweep_rowwise.py flag without its dashes, which also tags the run) and
# ncu over PROFILE cases (optional). The one such flag is no-staged-rows:
# softmax_/layer_norm_ without their staged-rows kernels, forced through
# make_inplace._testing.forced_route (it replaces MAKE_INPLACE_STAGED_ROWS=0;
# the library reads no environment variables for this any more).
#   OUT=... PREBUILT=... SETTINGS="default no-staged-rows" PROFILE="softmax:bf16:16384x4096" bash lab/rowwise_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/make_inplace_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
bash lab/install_lib.sh "$PREBUILT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
echo "commit ${COMMIT:-unknown} torch $(python -c 'import torch; print(torch.__version__)')" | tee -a "$OUT/gpu.txt"
for s in ${SETTINGS:-default}; do
  if [ "$s" = default ]; then
    python lab/sweep_rowwise.py --tag default --out "$OUT/sweep.jsonl" ${SWEEP_ARGS:-}
  elif [[ "$s" == *=* ]]; then
    echo "setting $s: the library reads no environment variables; name a sweep_rowwise.py flag (no-staged-rows)"
  else
    python lab/sweep_rowwise.py --tag "$s" --"$s" --out "$OUT/sweep.jsonl" --no-torch ${VARIANT_ARGS:-}
  fi
done 2>&1 | tee "$OUT/sweep.txt"
if [ -n "${PROFILE:-}" ]; then
  ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section InstructionStats \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    python lab/profile_rowwise.py $PROFILE > "$OUT/ncu.txt" 2>&1
  tail -n 3 "$OUT/ncu.txt"
fi
