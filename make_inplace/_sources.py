"""Where the C++/CUDA sources live and which of them a build compiles.

Shared by setup.py (the setuptools route) and _loader.py (the JIT route), so
both compile the same files as CMakeLists.txt: csrc/ops.cpp, csrc/cpu/*.cpp
csrc/kernels/cpu/*.cpp and, with CUDA, csrc/cuda/*.cpp and csrc/kernels/cuda/*.cu.
csrc/cpu and csrc/cuda hold the torch bindings; csrc/kernels holds torch-free
kernels (raw pointers, sizes, a stream) that the MindSpore C ABI reuses.
"""

from __future__ import annotations

import glob
import os
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(PACKAGE_DIR)
CSRC = os.path.join(SOURCE_ROOT, "csrc")


def cpu_sources(root: str = CSRC) -> list[str]:
    return [os.path.join(root, "ops.cpp")] + sorted(
        glob.glob(os.path.join(root, "cpu", "*.cpp")) + glob.glob(os.path.join(root, "kernels", "cpu", "*.cpp"))
    )


def cuda_sources(root: str = CSRC) -> list[str]:
    # csrc/cuda holds host-only bindings (.cpp): a TORCH_CHECK thrown from an
    # nvcc-compiled translation unit crashed the process on torch 2.11 + CUDA
    # 13.0 (seen on an H100), so nothing that throws is compiled by nvcc.
    return sorted(glob.glob(os.path.join(root, "cuda", "*.cpp")) + glob.glob(os.path.join(root, "kernels", "cuda", "*.cu")))


def include_dirs(root: str = CSRC) -> list[str]:
    return [os.path.join(root, "include")]


# Flags every route uses. The CPU kernels split rows over OpenMP threads
# (torch's own CPU wheels link the same libgomp); without -fopenmp the
# pragmas are ignored and the kernels run on one thread.
OPENMP_FLAGS = ["-fopenmp"] if sys.platform.startswith("linux") else []
CXX_FLAGS = ["-O3", "-std=c++17", *OPENMP_FLAGS]
LINK_FLAGS = list(OPENMP_FLAGS)
NVCC_FLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"]


def has_sm90a(arch_list: str) -> bool:
    """Whether a TORCH_CUDA_ARCH_LIST builds the sm_90a code (wgmma, TMA): only
    then may the Hopper square matmul kernel launch (MAKE_INPLACE_SM90A)."""
    return any(a.strip().split("+")[0] == "9.0a" for a in arch_list.replace(",", ";").replace(" ", ";").split(";"))
