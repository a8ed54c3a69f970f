#!/usr/bin/env bash
# Compiles CUDA sources to objects (no GPU needed) against a CUDA build of
# torch, for quick feedback while writing kernels:
#   scripts/nvcc_check.sh csrc/kernels/cuda/softmax.cu [more.cu ...]
# TORCH_CUDA_VENV points at a venv with torch==2.11.0 (CUDA 13.0); its
# nvidia/cu13 headers stand in for the parts of the toolkit torch needs.
set -euo pipefail
venv=${TORCH_CUDA_VENV:-/work/venv-cu}
site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
inc=$("$venv/bin/python" -c 'from torch.utils import cpp_extension as c; print(" ".join("-I"+p for p in c.include_paths(device_type="cuda")))')
out=${OUT_DIR:-/tmp/nvcc_check}
mkdir -p "$out"
for f in "$@"; do
  nvcc -c "$f" -o "$out/$(basename "$f").o" -std=c++17 -O3 --expt-relaxed-constexpr -lineinfo \
    -gencode=arch=compute_90,code=sm_90 -Xptxas -v \
    -Icsrc/include $inc -I"$site/nvidia/cu13/include" \
    -DMAKE_INPLACE_WITH_CUDA -D_GLIBCXX_USE_CXX11_ABI=1 -Xcompiler -fPIC 2>&1 \
    | grep -v "^ptxas info    : Function properties\|bytes stack frame, 0 bytes spill\|^ptxas info    : Used" || true
  test -f "$out/$(basename "$f").o" && echo "compiled $f"
done
