#!/usr/bin/env bash
# Prints the interpreter of a cached virtual environment with the oldest torch
# pyproject.toml admits (its "torch>=X" bound), creating it when missing. Its
# PyPI wheel is the CUDA 13.0 build: scripts/build_cuda_check.sh compiles the
# CUDA extension against it, scripts/test_oldest_torch.sh runs the tests on it
# (on CPU). Exact pin: a bare `torch` would pull the newest release.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/.*"torch>=\([0-9.]*\)".*/\1/p' pyproject.toml)
[ -n "$version" ] || { echo "no torch>= bound in pyproject.toml" >&2; exit 1; }
venv=${MAKE_INPLACE_OLDEST_TORCH_VENV:-$HOME/.cache/make_inplace/venv-torch-$version-cu130}
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(not (torch.__version__.split('+')[0] == '$version' and torch.version.cuda))" 2>/dev/null; then
  echo "installing torch==$version (the CUDA build, several GB) into $venv" >&2
  python3 -m venv "$venv"
  # pip prints a warning per package for a find-links folder absent on this machine.
  "$venv/bin/pip" install -q "torch==$version" numpy setuptools wheel ninja 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
fi
echo "$venv/bin/python"
