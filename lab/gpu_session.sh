#!/usr/bin/env bash
# One batched GPU session on the device machine (torch 2.11 + CUDA 13.0, sm_90):
# build in place, then the steps named as arguments, logs and JSON under $OUT.
#   steps: tests[=PYTEST_K]  files=TEST_FILES (comma-separated)  bench[=FILES]  main  sweep  budget
#          mindspore  multigpu (two GPUs or more: tests/test_multi_gpu.py, tests/test_distributed.py
#          and benchmarks/distributed_memory.py)
# Example: OUT=/tmp/out bash lab/gpu_session.sh tests bench main
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/make_inplace_out}
mkdir -p "$OUT"
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
# The device machine gets the working tree without .git: COMMIT names it.
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
echo "commit $commit torch $($py -c 'import torch; print(torch.__version__)')" | tee -a "$OUT/gpu.txt"
t0=$(date +%s)
if [ -n "${PREBUILT:-}" ]; then
  # A library built elsewhere (scripts/build_cuda_check.sh-style, g++ 12):
  # on the device image a build with its g++ 13.3 crashed while formatting
  # TORCH_CHECK messages (inside c10::str), so the tested library is carried.
  bash lab/install_lib.sh "$PREBUILT"
else
  $py setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
fi
echo "built in $(( $(date +%s) - t0 )) s"
status=0
# One pytest process per file, so a crash in one cannot hide the others.
run_test_files() {  # run_test_files PYTEST_K FILE...
  local k=$1; shift
  for f in "$@"; do
    b=$(basename "$f" .py)
    $py -m pytest "$f" -q -rfE -p no:cacheprovider ${k:+-k "$k"} --junitxml="$OUT/$b.xml" > "$OUT/$b.log" 2>&1
    rc=$?; [ $rc -ne 0 ] && status=1
    echo "$b rc=$rc: $(tail -n 1 "$OUT/$b.log")"
    grep -E "^(FAILED|ERROR)|Fatal Python error|File \"/work" "$OUT/$b.log" | head -n 12
  done
}
for step in "$@"; do
  name=${step%%=*}; arg=${step#*=}; [ "$arg" = "$step" ] && arg=""
  echo "=== $name $arg ($(date +%T))"
  case $name in
    tests)
      run_test_files "$arg" $(ls tests/test_*.py | grep -v test_build_routes.py) 2>&1 | tee -a "$OUT/tests.log" ;;
    files)
      run_test_files "" ${arg//,/ } 2>&1 | tee -a "$OUT/tests.log" ;;
    multigpu)
      run_test_files "" tests/test_multi_gpu.py tests/test_distributed.py 2>&1 | tee -a "$OUT/tests.log"
      $py benchmarks/distributed_memory.py --out "$OUT" --commit "$commit" 2>&1 | grep -v Warning | tee "$OUT/distributed_memory.log" || status=1 ;;
    bench)
      # One process per file: tensors an earlier file's tests leave alive keep
      # allocator segments partly used, and later files' reserved peaks then
      # read low (bench_layers after the others read 0 MiB for torch too).
      jsons=()
      for f in ${arg:-benchmarks/bench_*.py}; do
        b=$(basename "$f" .py)
        $py -m pytest "$f" -q -p no:cacheprovider --benchmark-only --benchmark-group-by=group \
          --benchmark-columns=median,ops --benchmark-json="$OUT/$b.json" > "$OUT/$b.log" 2>&1 || status=1
        echo "$b: $(tail -n 1 "$OUT/$b.log")"
        jsons+=("$OUT/$b.json@$commit")
      done
      $py benchmarks/summarize.py "${jsons[@]}" --out "$OUT/summary" ;;
    main)
      $py -m make_inplace --json "$OUT/main.json" 2>&1 | tee "$OUT/main.log" || status=1 ;;
    sweep)
      $py lab/sweep_square_matmul_waves.py --out "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.log" || status=1 ;;
    budget)
      $py benchmarks/memory_budget.py --out "$OUT/budget" 2>&1 | tail -n 40 || status=1 ;;
    mindspore)
      $py scripts/mindspore_cuda_check.py 2>&1 | tee "$OUT/mindspore.log" | tail -n 40 || status=1 ;;
    *) echo "unknown step $name"; status=1 ;;
  esac
done
# At most 8 files come back from the device: per-file test logs go in one archive.
(cd "$OUT" && ls test_*.log test_*.xml >/dev/null 2>&1 && tar czf tests.tgz test_*.log test_*.xml && rm -f test_*.log test_*.xml)
echo "=== done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
