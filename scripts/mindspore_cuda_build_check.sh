#!/usr/bin/env bash
# Compiles and links the CUDA MindSpore bridge (no GPU needed: nvcc only,
# sm_90 alone to keep CI short, --no-undefined) into a temporary directory and
# checks it exports the same entry points as the CPU bridge. Sources and flags
# come from build_config.json; the kernels' c10 headers (and the C++ standard
# they need) from a torch install (MAKE_INPLACE_TORCH_PYTHON, default .venv's).
set -euo pipefail
cd "$(dirname "$0")/.."
torch_py=${MAKE_INPLACE_TORCH_PYTHON:-.venv/bin/python}
c10=$("$torch_py" -c 'from torch.utils import cpp_extension as c; print(c.include_paths()[0])')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python3 make_inplace_mindspore/_build.py --c10-include "$c10" --out-dir "$out" --cuda --cuda-arch-list 9.0
entries() { nm -D --defined-only "$1" | awk '{print $3}' | grep '^MakeInplace' | sort; }
if ! diff <(entries "$out/libmake_inplace_ms_cpu.so") <(entries "$out/libmake_inplace_ms_cuda.so"); then
  echo "the CPU and CUDA bridges export different entry points" >&2
  exit 1
fi
echo "CUDA MindSpore bridge compiled and linked: $(entries "$out/libmake_inplace_ms_cuda.so" | wc -l) entry points, the same as the CPU bridge"
