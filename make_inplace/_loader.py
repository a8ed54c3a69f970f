"""Finds and loads the compiled op library.

Order: the library built by setuptools next to this file (``_C*.so``), unless
``MAKE_INPLACE_FORCE_JIT=1``; otherwise a JIT build with
``torch.utils.cpp_extension.load`` (ninja) into torch's extension cache,
announced on stderr, of the sources and flags in build_config.json (through
_sources.py, as setup.py and CMake read them). Loading registers the ops under
``torch.ops.make_inplace``.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import Callable

import torch

from . import _sources

FORCE_JIT_ENV = "MAKE_INPLACE_FORCE_JIT"

_loaded_path: str | None = None
_eager_entries: dict[str, Callable[..., bool]] | None = None


def _built_library() -> str | None:
    found = sorted(glob.glob(os.path.join(_sources.PACKAGE_DIR, "_C*.so")))
    return found[0] if found else None


def _jit_build() -> str:
    from torch.utils import cpp_extension

    if not os.path.isdir(_sources.CSRC):
        raise RuntimeError(
            "make_inplace: no built library next to the package and no csrc/ "
            f"to JIT-build from (looked in {_sources.CSRC}); install with "
            "`pip install --no-build-isolation .`"
        )
    with_cuda, why = _sources.cuda_build_decision()
    sources = _sources.cpu_sources() + _sources.python_sources() + (_sources.cuda_sources() if with_cuda else [])
    print(
        f"make_inplace: JIT-building the op library ({'CPU+CUDA' if with_cuda else 'CPU'}: {why}) "
        "with torch.utils.cpp_extension.load; the first build takes a few minutes",
        file=sys.stderr,
    )
    arch_list = _jit_arch_list() if with_cuda else ""
    name = "make_inplace_jit_cuda" if with_cuda else "make_inplace_jit_cpu"
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if with_cuda:  # only for this build
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch_list
    try:
        _load(cpp_extension, name, sources, _sources.defines(with_cuda, arch_list), with_cuda)
    finally:
        if previous is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = previous
    return os.path.join(cpp_extension._get_build_directory(name, verbose=False), f"{name}.so")


def _jit_arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST when set; else the visible GPUs' archs with Hopper as
    sm_90a (the wgmma kernels), so a JIT build compiles only what runs here;
    else (no GPU visible) the configured default."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if not torch.cuda.is_available():
        return _sources.default_cuda_arch_list()
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{major}.{minor}" + ("a" if (major, minor) == (9, 0) else "") for major, minor in caps)


def _load(cpp_extension, name, sources, defines, with_cuda) -> None:
    # No -std here: cpp_extension adds the one the installed torch needs.
    cpp_extension.load(
        name=name,
        sources=sources,
        extra_include_paths=_sources.include_dirs(),
        extra_cflags=_sources.cxx_flags() + defines,
        extra_cuda_cflags=_sources.nvcc_flags() + defines,
        extra_ldflags=_sources.link_flags(),
        with_cuda=with_cuda,
        is_python_module=False,
        verbose=False,
    )


def load() -> str:
    """Loads the op library once and returns the path it came from."""
    global _loaded_path
    if _loaded_path is not None:
        return _loaded_path
    built = None if os.environ.get(FORCE_JIT_ENV) == "1" else _built_library()
    if built is not None:
        torch.ops.load_library(built)
        _loaded_path = built
    else:
        _loaded_path = _jit_build()
    return _loaded_path


def eager_entries() -> dict[str, Callable[..., bool]]:
    """The library's eager entry points by op name (csrc/python/eager_calls.cpp).

    Each takes the op's arguments positionally, runs the backend kernel and
    returns True when the call is plain, else returns False without touching
    anything. Empty for a library built without them.
    """
    global _eager_entries
    if _eager_entries is None:
        try:
            table = ctypes.PyDLL(load()).make_inplace_eager_entries
        except AttributeError:
            _eager_entries = {}
        else:
            table.restype = ctypes.py_object
            _eager_entries = table()
    return _eager_entries
