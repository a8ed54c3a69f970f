#!/usr/bin/env bash
# The test command: set up, then the test suite (CUDA tests run only where a
# GPU is present) and the benchmark suite in its short mode, so it never rots.
# Extra arguments go to the test-suite pytest run (e.g. -k softmax, -n 4).
# Where a GPU is present the tests run in a random order (the seed is printed;
# MAKE_INPLACE_TEST_SEED=N replays one): cached launch state must not depend on
# which tests ran before.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/setup.sh | tail -n 1)
order=()
if "$py" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
  seed=${MAKE_INPLACE_TEST_SEED:-$RANDOM}
  echo "GPU present: tests in random order, --shuffle-seed $seed"
  order=(--shuffle-seed "$seed")
fi
"$py" -m pytest tests -q -ra "${order[@]}" "$@"
MAKE_INPLACE_BENCH_SHORT=1 "$py" -m pytest benchmarks -q --benchmark-disable
