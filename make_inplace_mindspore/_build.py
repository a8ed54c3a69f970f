"""Builds the MindSpore bridge libraries, without MindSpore and without linking torch.

Sources: csrc/mindspore/*.cpp plus the torch-free CPU kernels
csrc/kernels/cpu/*.cpp into ``libmake_inplace_ms_cpu.so``; with CUDA,
csrc/mindspore/*.cu, csrc/mindspore/last_error.cpp and csrc/kernels/cuda/*.cu
into ``libmake_inplace_ms_cuda.so`` (CMakeLists.txt builds the same files).
The kernels include the header-only ``c10/util/Half.h``/``BFloat16.h``, so the
include directory of an installed torch is passed as headers only
(``--c10-include``); nothing of torch is linked.

Used by setup.py (``MAKE_INPLACE_BUILD_MINDSPORE=1``) and scripts/mindspore_test.sh::

    python make_inplace_mindspore/_build.py --c10-include "$(python -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')"
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(PACKAGE_DIR)
CSRC = os.path.join(SOURCE_ROOT, "csrc")

CPU_LIBRARY = "libmake_inplace_ms_cpu.so"
CUDA_LIBRARY = "libmake_inplace_ms_cuda.so"

# Hidden visibility: only the MAKE_INPLACE_MS_EXPORT entry points are exported.
# --no-undefined proves nothing of torch (or anything else unlinked) is needed.
CXX_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-fopenmp", "-fvisibility=hidden", "-Wall"]
LINK_FLAGS = ["-shared", "-Wl,--no-undefined"]
NVCC_FLAGS = [
    "-O3",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-lineinfo",
    "-Xcompiler=-fPIC,-fvisibility=hidden",
    "-Xlinker=--no-undefined",
]
# sm_80 and sm_90 code plus sm_90 PTX, as setup.py builds the torch library.
CUDA_ARCHS = ("80", "90")


def _gencode(archs) -> list[str]:
    archs = list(archs)
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    return flags + [f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"]


def cpu_sources(root: str = CSRC) -> list[str]:
    return sorted(glob.glob(os.path.join(root, "mindspore", "*.cpp")) + glob.glob(os.path.join(root, "kernels", "cpu", "*.cpp")))


def cuda_sources(root: str = CSRC) -> list[str]:
    return sorted(
        glob.glob(os.path.join(root, "mindspore", "*.cu"))
        + [os.path.join(root, "mindspore", "last_error.cpp")]
        + glob.glob(os.path.join(root, "kernels", "cuda", "*.cu"))
    )


def _include_flags(c10_include: str) -> list[str]:
    return ["-I" + os.path.join(CSRC, "include"), "-I" + c10_include]


def build_cpu(c10_include: str, out_dir: str = PACKAGE_DIR, cxx: str | None = None) -> str:
    """Compiles the CPU bridge library into out_dir and returns its path."""
    out = os.path.join(out_dir, CPU_LIBRARY)
    cmd = [cxx or os.environ.get("CXX", "g++"), *CXX_FLAGS, *_include_flags(c10_include), *cpu_sources(), *LINK_FLAGS, "-o", out]
    print("make_inplace_mindspore: " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return out


def build_cuda(c10_include: str, out_dir: str = PACKAGE_DIR, nvcc: str = "nvcc", archs=CUDA_ARCHS) -> str:
    """Compiles the CUDA bridge library (cudart linked statically) and returns its path."""
    out = os.path.join(out_dir, CUDA_LIBRARY)
    cmd = [nvcc, *NVCC_FLAGS, *_gencode(archs), *_include_flags(c10_include), "-shared", *cuda_sources(), "-o", out]
    print("make_inplace_mindspore: " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--c10-include", required=True, help="a torch include directory (for c10/util/Half.h)")
    parser.add_argument("--out-dir", default=PACKAGE_DIR)
    parser.add_argument("--cuda", action="store_true", help="also build the CUDA library (needs nvcc)")
    parser.add_argument("--cuda-only", action="store_true", help="build only the CUDA library")
    parser.add_argument("--cuda-arch", action="append", help=f"compute capability, repeatable (default {' '.join(CUDA_ARCHS)})")
    args = parser.parse_args()
    if not args.cuda_only:
        build_cpu(args.c10_include, args.out_dir)
    if args.cuda or args.cuda_only:
        build_cuda(args.c10_include, args.out_dir, shutil.which("nvcc") or "nvcc", args.cuda_arch or CUDA_ARCHS)


if __name__ == "__main__":
    main()
