#!/usr/bin/env bash
# Sets up an environment with make_inplace built in place (pip install -e).
#   default: a virtual environment .venv with torch==2.13.0 (the CPU wheel here)
#   MAKE_INPLACE_PYTHON=python3: use that interpreter and its torch as they are
#     (the GPU machine, whose CUDA torch must not be replaced)
# Prints the interpreter to use on its last line.
set -euo pipefail
# pip prints a warning per package for a find-links folder absent on this machine:
# filtered, without hiding pip's own exit status (pipefail).
cd "$(dirname "$0")/.."
if [ -n "${MAKE_INPLACE_PYTHON:-}" ]; then
  py=$MAKE_INPLACE_PYTHON
else
  venv=${MAKE_INPLACE_VENV:-.venv}
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  py=$venv/bin/python
  # Exact pin: a bare `torch` would pull several GB of CUDA packages.
  "$py" -m pip install -q "torch==2.13.0" numpy setuptools wheel ninja 2>&1 | { grep -v "^WARNING: Location" || true; }
fi
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
"$py" -m pip install -q --no-build-isolation -e ".[test]" 2>&1 | { grep -v "^WARNING: Location" || true; }
"$py" -c "import make_inplace, torch; print('make_inplace built:', make_inplace.build_backends(), 'torch', torch.__version__)" >&2
echo "$py"
