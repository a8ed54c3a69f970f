#!/usr/bin/env bash
# The test command: set up, then the test suite (CUDA tests run only where a
# GPU is present) and the benchmark suite in its short mode, so it never rots.
# Extra arguments go to the test-suite pytest run (e.g. -k softmax).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/setup.sh | tail -n 1)
"$py" -m pytest tests -q -ra "$@"
MAKE_INPLACE_BENCH_SHORT=1 "$py" -m pytest benchmarks -q --benchmark-disable
