#!/usr/bin/env bash
# A/B timing of two carried builds on the device machine: .gpu-build/A and
# .gpu-build/B each hold a _C*.so (or _C*.so.xz, see lab/install_lib.sh);
# ROUNDS alternations of AB_SCRIPT (default lab/ab_square_matmul.py, extra
# flags in AB_ARGS), then its report.
#   OUT=... ROUNDS=3 bash lab/ab_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/make_inplace_out}
mkdir -p "$OUT"
script=${AB_SCRIPT:-lab/ab_square_matmul.py}
for t in A B; do
  rm -rf "/tmp/ab_$t" && mkdir -p "/tmp/ab_$t" && cp -r make_inplace "/tmp/ab_$t/"
  bash lab/install_lib.sh "$(ls .gpu-build/$t/_C*.so*)" "/tmp/ab_$t"
done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for r in $(seq "${ROUNDS:-3}"); do
  for t in A B; do
    PYTHONPATH=/tmp/ab_$t python "$script" --tag "$t" --out "$OUT/ab.jsonl" ${AB_ARGS:-} > /dev/null || echo "round $r $t failed"
  done
done
python "$script" --report "$OUT/ab.jsonl" | tee "$OUT/ab_report.txt"
