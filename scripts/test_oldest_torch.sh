#!/usr/bin/env bash
# The test suite on the oldest torch pyproject.toml admits, so that bound is
# tested rather than claimed: a CPU build of make_inplace, installed the way the
# README says (pip install --no-build-isolation -e), into the cached venv of
# scripts/oldest_torch_venv.sh (a CUDA build of torch, run here on CPU). It
# works on a copy of the tree, because an install in place would replace the
# library that .venv's torch built in make_inplace/.
# Extra arguments go to pytest (e.g. -k softmax).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/oldest_torch_venv.sh)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
# Tracked and untracked-but-not-ignored files, as they are in the working tree.
git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$tree"
cd "$tree"
# CPU only, also for the JIT build the build-route tests make.
export MAKE_INPLACE_CPU_ONLY=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
"$py" -m pip install -q --no-build-isolation -e ".[test]" 2>&1 | { grep -v "^WARNING: Location" || true; }
"$py" -c "import make_inplace, torch; print('make_inplace built:', make_inplace.build_backends(), 'torch', torch.__version__)"
"$py" -m pytest tests -q -ra -p no:cacheprovider "$@"
