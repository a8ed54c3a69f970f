#!/usr/bin/env bash
# Builds and links the CUDA extension on a machine without a GPU, so CUDA code
# that does not compile fails CI. The CPU torch lacks CUDA headers, so this uses
# the cached venv of scripts/oldest_torch_venv.sh (torch 2.11.0, the CUDA 13.0
# build the GPU machines run) and its nvidia/cu13 headers and libraries with the
# machine's CUDA 13.0 nvcc, for build_config.json's default archs
# (TORCH_CUDA_ARCH_LIST overrides). The build goes to a temporary directory, not
# the source tree; MAKE_INPLACE_CUDA_LIB_OUT=DIR keeps a copy of the library there.
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/oldest_torch_venv.sh)
site=$("$py" -c 'import site; print(site.getsitepackages()[0])')
# /usr/local/bin/nvcc may be a wrapper script, so prefer the toolkit folder.
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_HOME=/usr/local/cuda
  else CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
fi
export CUDA_HOME
export CPATH=$site/nvidia/cu13/include${CPATH:+:$CPATH}
export LIBRARY_PATH=$site/nvidia/cu13/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "building the CUDA extension with torch $("$py" -c 'import torch; print(torch.__version__)') and $(nvcc --version | tail -n 1)"
# The grep drops ninja's command lines and the notes g++ prints for torch's
# headers, keeping errors.
"$py" setup.py -q build_ext --build-lib "$out/lib" --build-temp "$out/tmp" 2>&1 \
  | { grep -v "^\[[0-9]*/[0-9]*\] \|hardware_destructive_interference_size\|^ *[0-9]* |\|note:\|^ *|\|^ *\^" || true; }
lib=$(ls "$out"/lib/make_inplace/_C*.so)
"$py" - "$lib" <<'PY'
import sys, torch
torch.ops.load_library(sys.argv[1])
backends = torch.ops.make_inplace.build_backends()
assert "cuda" in backends, backends
print("CUDA extension built, linked and loaded (no GPU needed):", sys.argv[1].rsplit("/", 1)[-1], backends)
PY
if [ -n "${MAKE_INPLACE_CUDA_LIB_OUT:-}" ]; then
  mkdir -p "$MAKE_INPLACE_CUDA_LIB_OUT" && cp "$lib" "$MAKE_INPLACE_CUDA_LIB_OUT/"
  echo "kept a copy in $MAKE_INPLACE_CUDA_LIB_OUT/$(basename "$lib")"
fi
