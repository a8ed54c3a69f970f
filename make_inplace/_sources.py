"""Reads build_config.json, the one list of sources, flags and CUDA archs.

Used by setup.py (the setuptools route), _loader.py (the JIT route) and the
MindSpore bridge's _build.py; CMake reads the same file (cmake/build_config.cmake).
Standard library only and no package-relative imports, so setup.py and _build.py
can load this file by path, without torch or an installed package. The config
is read on first use: an installed wheel has no build_config.json and never
needs it.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import re
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(PACKAGE_DIR)
CSRC = os.path.join(SOURCE_ROOT, "csrc")
CONFIG_FILE = os.path.join(SOURCE_ROOT, "build_config.json")

# What torch's own CUDA headers include (ATen/cuda/CUDAContextLight.h): a
# toolkit without them (nvcc alone) cannot build the CUDA extension.
CUDA_HEADERS = ("cuda_runtime.h", "cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h")


@functools.lru_cache(maxsize=None)
def config() -> dict:
    with open(CONFIG_FILE, encoding="utf-8") as f:
        return json.load(f)


def _expand(patterns: list[str]) -> list[str]:
    """Globs relative to the source root; sorted within each pattern, as CMake's file(GLOB)."""
    found: list[str] = []
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.join(SOURCE_ROOT, pattern))):
            if path not in found:
                found.append(path)
    return found


def cpu_sources(target: str = "torch_library") -> list[str]:
    return _expand(config()[target]["cpu_sources"])


def cuda_sources(target: str = "torch_library") -> list[str]:
    return _expand(config()[target]["cuda_sources"])


def python_sources() -> list[str]:
    """The eager entry points, which link libtorch_python: setup.py and the JIT build only."""
    return _expand(config()["torch_library"]["python_sources"])


def include_dirs(target: str = "torch_library") -> list[str]:
    return [os.path.join(SOURCE_ROOT, d) for d in config()[target]["include_dirs"]]


def openmp_flags() -> list[str]:
    # The CPU kernels split rows over OpenMP threads (torch's Linux wheels link
    # the same libgomp); without the flag the pragmas are ignored.
    return list(config()["openmp_flags"]) if sys.platform.startswith("linux") else []


def cxx_flags() -> list[str]:
    return config()["cxx_flags"] + openmp_flags()


def nvcc_flags() -> list[str]:
    return list(config()["nvcc_flags"])


def link_flags() -> list[str]:
    return openmp_flags()


def default_cuda_arch_list() -> str:
    return config()["cuda_arch_list"]


def has_sm90a(arch_list: str) -> bool:
    """Whether a TORCH_CUDA_ARCH_LIST builds the sm_90a code (wgmma, TMA): only
    then may the Hopper kernels launch (the sm90a_defines)."""
    return any(a.split("+")[0] == "9.0a" for a in re.split(r"[;, ]+", arch_list.strip()) if a)


def defines(with_cuda: bool, arch_list: str = "") -> list[str]:
    """-D flags of the torch library for a CPU or a CUDA build."""
    lib = config()["torch_library"]
    names = (lib["cuda_defines"] + (lib["sm90a_defines"] if has_sm90a(arch_list) else [])) if with_cuda else []
    return ["-D" + name for name in names]


def missing_cuda_headers(cuda_home: str) -> list[str]:
    """Headers of CUDA_HEADERS found neither in the toolkit nor on CPATH/CPLUS_INCLUDE_PATH."""
    dirs = [os.path.join(cuda_home, "include")]
    for var in ("CPATH", "CPLUS_INCLUDE_PATH"):
        dirs += [d for d in os.environ.get(var, "").split(os.pathsep) if d]
    return [h for h in CUDA_HEADERS if not any(os.path.isfile(os.path.join(d, h)) for d in dirs)]


def cuda_build_decision() -> tuple[bool, str]:
    """(build CUDA kernels?, why) for the installed torch and toolkit; the reason
    is printed by setup.py and the JIT loader when they fall back to CPU."""
    import torch
    from torch.utils import cpp_extension

    if os.environ.get("MAKE_INPLACE_CPU_ONLY") == "1":
        return False, "MAKE_INPLACE_CPU_ONLY=1"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is not a CUDA build"
    if cpp_extension.CUDA_HOME is None:
        return False, "no CUDA toolkit found (no nvcc, CUDA_HOME unset)"
    missing = missing_cuda_headers(cpp_extension.CUDA_HOME)
    if missing:
        return False, (
            f"the CUDA toolkit at {cpp_extension.CUDA_HOME} lacks {', '.join(missing)} "
            "(set CUDA_HOME to a full toolkit or add its include folder to CPATH)"
        )
    return True, f"torch {torch.__version__} (CUDA {torch.version.cuda}), toolkit at {cpp_extension.CUDA_HOME}"


def torch_cxx_standard(torch_include_dir: str) -> str | None:
    """The C++ standard an installed torch asks of its users (its TorchConfig.cmake's
    CXX_STANDARD: 17 for torch 2.11, 20 for 2.13), found from its include folder;
    None when the file is not there. For routes that call the compiler directly
    (the MindSpore bridge); cpp_extension adds the -std itself."""
    path = os.path.join(os.path.dirname(torch_include_dir), "share", "cmake", "Torch", "TorchConfig.cmake")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        match = re.search(r"CXX_STANDARD\s+(\d+)", f.read())
    return match.group(1) if match else None
