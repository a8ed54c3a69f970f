#!/usr/bin/env bash
# The MindSpore bridge suite (CPU): creates or reuses a virtual environment
# with mindspore==2.10.0 and numpy<2 (kept apart from the torch environment,
# which numpy<2 must not touch), builds the CPU bridge library into
# make_inplace_mindspore/, and runs tests_mindspore/ there.
#   MAKE_INPLACE_MINDSPORE_VENV: the MindSpore venv (default: a cached one)
#   MAKE_INPLACE_TORCH_PYTHON: an interpreter with torch, used only to find the
#     header-only c10/util/Half.h the kernels include (default: .venv's, made
#     by scripts/setup.sh, which this runs if there is none)
# Extra arguments go to pytest (e.g. -k softmax).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MAKE_INPLACE_MINDSPORE_VENV:-$HOME/.cache/make_inplace/venv-mindspore-2.10.0}
if ! "$venv/bin/python" -c 'import mindspore, numpy, pytest; assert mindspore.__version__ == "2.10.0" and numpy.__version__ < "2"' 2>/dev/null; then
  echo "installing mindspore==2.10.0 into $venv (about 800 MB)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "mindspore==2.10.0" "numpy<2" pytest 2>&1 | { grep -v "^WARNING: Location" || true; }
fi
torch_py=${MAKE_INPLACE_TORCH_PYTHON:-.venv/bin/python}
if ! "$torch_py" -c 'import torch' 2>/dev/null; then
  torch_py=$(bash scripts/setup.sh | tail -n 1)
fi
c10=$("$torch_py" -c 'from torch.utils import cpp_extension as c; print(c.include_paths()[0])')
python3 make_inplace_mindspore/_build.py --c10-include "$c10"
# MindSpore's own INFO/WARNING logging off (GLOG_v=3: errors only).
GLOG_v=${GLOG_v:-3} "$venv/bin/python" -m pytest tests_mindspore -q -ra -p no:cacheprovider "$@"
