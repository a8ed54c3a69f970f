#!/usr/bin/env bash
# Row-wise sweep session on the device machine: the carried library, then
# lab/sweep_rowwise.py once per setting (SETTINGS, space-separated
# VAR=value for a build that reads such a variable, "default" for none) and
# ncu over PROFILE cases (optional). The only such variable in the library
# now is MAKE_INPLACE_STAGED_ROWS=0 (no staged kernels).
#   OUT=... PREBUILT=... SETTINGS="default MAKE_INPLACE_STAGED_ROWS=0" PROFILE="softmax:bf16:16384x4096" bash lab/rowwise_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/make_inplace_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
rm -f make_inplace/_C*.so && cp "$PREBUILT" make_inplace/
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
echo "commit ${COMMIT:-unknown} torch $(python -c 'import torch; print(torch.__version__)')" | tee -a "$OUT/gpu.txt"
for s in ${SETTINGS:-default}; do
  if [ "$s" = default ]; then
    python lab/sweep_rowwise.py --tag default --out "$OUT/sweep.jsonl" ${SWEEP_ARGS:-}
  else
    env "$s" python lab/sweep_rowwise.py --tag "${s#MAKE_INPLACE_}" --out "$OUT/sweep.jsonl" --no-torch ${VARIANT_ARGS:-}
  fi
done 2>&1 | tee "$OUT/sweep.txt"
if [ -n "${PROFILE:-}" ]; then
  ncu -k 'regex:[Ss]oft[Mm]ax|layer_norm|LayerNorm' --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    python lab/profile_rowwise.py $PROFILE > "$OUT/ncu.txt" 2>&1
  tail -n 3 "$OUT/ncu.txt"
fi
