"""Builds the MindSpore bridge libraries, without MindSpore and without linking torch.

Sources and flags: the ``mindspore_bridge`` part of build_config.json plus its
common flags (read through make_inplace/_sources.py, as setup.py and CMake read
them): csrc/mindspore/*.cpp and the torch-free CPU kernels into
``libmake_inplace_ms_cpu.so``; with CUDA, csrc/mindspore/*.cu, last_error.cpp
and the CUDA kernels into ``libmake_inplace_ms_cuda.so``. The kernels include
the header-only ``c10/util/Half.h``/``BFloat16.h``, so the include directory of
an installed torch is passed as headers only (``--c10-include``); nothing of
torch is linked, and the C++ standard is the one that torch asks for.

Used by setup.py (``MAKE_INPLACE_BUILD_MINDSPORE=1``) and scripts/mindspore_test.sh::

    python make_inplace_mindspore/_build.py --c10-include "$(python -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')"
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.path.dirname(PACKAGE_DIR)

CPU_LIBRARY = "libmake_inplace_ms_cpu.so"
CUDA_LIBRARY = "libmake_inplace_ms_cuda.so"
TARGET = "mindspore_bridge"


def _load_sources():
    # By path: importing make_inplace would import torch.
    path = os.path.join(SOURCE_ROOT, "make_inplace", "_sources.py")
    spec = importlib.util.spec_from_file_location("make_inplace_sources", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_sources = _load_sources()


def _bridge(key: str) -> list[str]:
    return list(_sources.config()[TARGET][key])


def _std_flags(c10_include: str) -> list[str]:
    std = _sources.torch_cxx_standard(c10_include)
    if std is None:
        raise SystemExit(f"make_inplace_mindspore: no TorchConfig.cmake beside {c10_include} says which C++ standard its headers need")
    return [f"-std=c++{std}"]


def gencode_flags(arch_list: str) -> list[str]:
    """nvcc -gencode flags for a TORCH_CUDA_ARCH_LIST ("8.0+PTX;9.0a"; "90" also reads as 9.0)."""
    flags = []
    for arch in (a for a in re.split(r"[;, ]+", arch_list.strip()) if a):
        base, ptx = arch[:-4] if arch.endswith("+PTX") else arch, arch.endswith("+PTX")
        number = base.replace(".", "")
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return flags


def default_arch_list() -> str:
    return os.environ.get("TORCH_CUDA_ARCH_LIST") or _sources.default_cuda_arch_list()


def _include_flags(c10_include: str) -> list[str]:
    return ["-I" + d for d in _sources.include_dirs(TARGET)] + ["-isystem", c10_include]


def build_cpu(c10_include: str, out_dir: str = PACKAGE_DIR, cxx: str | None = None) -> str:
    """Compiles the CPU bridge library into out_dir and returns its path."""
    out = os.path.join(out_dir, CPU_LIBRARY)
    flags = _sources.cxx_flags() + _bridge("cxx_flags") + _std_flags(c10_include) + ["-fPIC"]
    link = ["-shared", *_sources.link_flags(), *_bridge("link_flags")]
    cmd = [cxx or os.environ.get("CXX", "g++"), *flags, *_include_flags(c10_include), *_sources.cpu_sources(TARGET), *link, "-o", out]
    print("make_inplace_mindspore: " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return out


def build_cuda(c10_include: str, out_dir: str = PACKAGE_DIR, nvcc: str = "nvcc", archs=None) -> str:
    """Compiles the CUDA bridge library (cudart linked statically) and returns its path.
    archs: a TORCH_CUDA_ARCH_LIST string or a sequence of its entries
    (default: TORCH_CUDA_ARCH_LIST, else build_config.json's)."""
    arch_list = default_arch_list() if archs is None else archs if isinstance(archs, str) else ";".join(archs)
    out = os.path.join(out_dir, CUDA_LIBRARY)
    host = ",".join(["-fPIC", *_bridge("nvcc_host_flags")])
    link = [f"-Xlinker={flag[len('-Wl,'):]}" if flag.startswith("-Wl,") else flag for flag in _bridge("link_flags")]
    cmd = [
        nvcc, *_sources.nvcc_flags(), *_std_flags(c10_include), f"-Xcompiler={host}", *link, *gencode_flags(arch_list),
        *_include_flags(c10_include), "-shared", *_sources.cuda_sources(TARGET), "-o", out,
    ]
    print("make_inplace_mindspore: " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--c10-include", required=True, help="a torch include directory (for c10/util/Half.h)")
    parser.add_argument("--out-dir", default=PACKAGE_DIR)
    parser.add_argument("--cuda", action="store_true", help="also build the CUDA library (needs nvcc)")
    parser.add_argument("--cuda-only", action="store_true", help="build only the CUDA library")
    parser.add_argument("--cuda-arch-list", help="TORCH_CUDA_ARCH_LIST-style archs (default: TORCH_CUDA_ARCH_LIST, else build_config.json's)")
    args = parser.parse_args()
    if not args.cuda_only:
        build_cpu(args.c10_include, args.out_dir)
    if args.cuda or args.cuda_only:
        build_cuda(args.c10_include, args.out_dir, shutil.which("nvcc") or "nvcc", args.cuda_arch_list)


if __name__ == "__main__":
    main()
