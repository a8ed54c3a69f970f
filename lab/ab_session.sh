#!/usr/bin/env bash
# A/B timing of carried builds on the device machine, rounds alternated, then
# the script's report. BUILDS names them (default "A B"): each NAME is
# .gpu-build/NAME/_C*.so(.xz) or .gpu-build/xz/NAME.so.xz (lab/install_lib.sh).
# AB_SCRIPT is the timing script (default lab/ab_square_matmul.py; also
# lab/ab_rowwise.py), AB_ARGS its extra flags.
#   OUT=... ROUNDS=3 BUILDS="base variant" bash lab/ab_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/make_inplace_out}
mkdir -p "$OUT"
script=${AB_SCRIPT:-lab/ab_square_matmul.py}
builds=${BUILDS:-A B}
for t in $builds; do
  lib=$(ls .gpu-build/$t/_C*.so* .gpu-build/xz/$t.so.xz 2>/dev/null | head -n 1)
  [ -n "$lib" ] || { echo "no library for build $t" >&2; exit 1; }
  rm -rf "/tmp/ab_$t" && mkdir -p "/tmp/ab_$t" && cp -r make_inplace "/tmp/ab_$t/"
  bash lab/install_lib.sh "$lib" "/tmp/ab_$t"
done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for r in $(seq "${ROUNDS:-3}"); do
  for t in $builds; do
    PYTHONPATH=/tmp/ab_$t python "$script" --tag "$t" --out "$OUT/ab.jsonl" ${AB_ARGS:-} > /dev/null || echo "round $r $t failed"
  done
done
python "$script" --report "$OUT/ab.jsonl" | tee "$OUT/ab_report.txt"
