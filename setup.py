"""The setuptools route: `pip install --no-build-isolation .` (or `-e .`).

Compiles against the torch already installed, which pip's build isolation would
hide, so without torch this stops at once and names --no-build-isolation.
Sources, flags and the CUDA arch default come from build_config.json. CUDA
kernels are built when torch is a CUDA build and a CUDA toolkit with its headers
is found, otherwise the CPU kernels only, saying why (`pip install -v` shows it).
MAKE_INPLACE_CPU_ONLY=1 forces CPU; TORCH_CUDA_ARCH_LIST overrides the archs.
"""

import importlib.util
import os
import re
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _load_sources():
    # By path: importing the package would load the library this builds.
    spec = importlib.util.spec_from_file_location("make_inplace_sources", os.path.join(ROOT, "make_inplace", "_sources.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _oldest_torch() -> str:
    """The lower bound of torch in pyproject.toml's dependencies (e.g. "2.11.0")."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        return re.search(r'"torch>=([0-9.]+)', f.read()).group(1)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.match(r"[0-9.]*[0-9]", version).group(0).split("."))


def _require_torch():
    """torch, or exit before pip resolves dependencies: pip would otherwise fetch
    a torch (several GB) and the library would not match the one it was built with."""
    oldest = _oldest_torch()
    try:
        import torch
    except ImportError:
        sys.exit(
            "make_inplace: torch is not importable here. make_inplace compiles against an installed torch:\n"
            f"install torch (>= {oldest}) first, then `pip install --no-build-isolation .` (or -e .).\n"
            "Plain `pip install .` builds in an isolated environment without your torch."
        )
    if _release(torch.__version__) < _release(oldest):
        sys.exit(f"make_inplace: torch {torch.__version__} is older than {oldest}, the oldest this library is tested with")
    return torch


torch = _require_torch()
from torch.utils import cpp_extension  # noqa: E402

_sources = _load_sources()
with_cuda, why = _sources.cuda_build_decision()
if with_cuda:
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", _sources.default_cuda_arch_list())
    arch_list = os.environ["TORCH_CUDA_ARCH_LIST"]
    print(f"make_inplace: building CPU and CUDA kernels for {arch_list}: {why}", file=sys.stderr)
else:
    arch_list = ""
    print(f"make_inplace: building the CPU kernels only: {why}", file=sys.stderr)

defines = _sources.defines(with_cuda, arch_list)
sources = _sources.cpu_sources() + _sources.python_sources() + (_sources.cuda_sources() if with_cuda else [])
ext = (cpp_extension.CUDAExtension if with_cuda else cpp_extension.CppExtension)(
    name="make_inplace._C",
    # setuptools wants sources relative to setup.py's folder.
    sources=[os.path.relpath(s, ROOT) for s in sources],
    include_dirs=_sources.include_dirs(),
    extra_compile_args={"cxx": _sources.cxx_flags() + defines, "nvcc": _sources.nvcc_flags() + defines},
    extra_link_args=_sources.link_flags(),
)

# MAKE_INPLACE_BUILD_MINDSPORE=1: also build the MindSpore bridge libraries
# into make_inplace_mindspore/ (torch's headers only; see its _build.py).
if os.environ.get("MAKE_INPLACE_BUILD_MINDSPORE") == "1":
    sys.path.insert(0, os.path.join(ROOT, "make_inplace_mindspore"))
    import _build as _mindspore_build  # noqa: E402

    _mindspore_build.build_cpu(cpp_extension.include_paths()[0])
    if with_cuda:
        _mindspore_build.build_cuda(cpp_extension.include_paths()[0], nvcc=os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc"))

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
