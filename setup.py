"""The setuptools route: `pip install --no-build-isolation .` (or `-e .`).

Builds CUDA kernels when nvcc and a CUDA build of torch are both present
(default archs sm_80 with PTX and sm_90a, the Hopper variant that has the
wgmma square matmul; TORCH_CUDA_ARCH_LIST overrides),
otherwise a CPU-only library. It never fails for lack of CUDA.
"""

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_inplace"))
import _sources  # noqa: E402  (the package's source list, importable without torch ops)

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

force_cpu = os.environ.get("MAKE_INPLACE_CPU_ONLY") == "1"
with_cuda = not force_cpu and torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
if with_cuda:
    # No plain sm_90 beside sm_90a: an H100 must load the sm_90a code.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0+PTX;9.0a")
    print(f"make_inplace: building CPU and CUDA kernels ({os.environ['TORCH_CUDA_ARCH_LIST']})")
else:
    print("make_inplace: building the CPU kernels only (no nvcc or no CUDA build of torch)")

root = os.path.relpath(_sources.CSRC, os.getcwd()) if os.path.isabs(_sources.CSRC) else _sources.CSRC
defines = ["-DMAKE_INPLACE_WITH_CUDA"] if with_cuda else []
if with_cuda and _sources.has_sm90a(os.environ["TORCH_CUDA_ARCH_LIST"]):
    defines.append("-DMAKE_INPLACE_SM90A")  # the wgmma square matmul may launch
common = dict(
    name="make_inplace._C",
    include_dirs=[os.path.abspath(d) for d in _sources.include_dirs()],
    extra_compile_args={"cxx": _sources.CXX_FLAGS + defines, "nvcc": _sources.NVCC_FLAGS + defines},
    extra_link_args=_sources.LINK_FLAGS,
)
sources = [os.path.relpath(s) for s in _sources.cpu_sources()]
if with_cuda:
    sources += [os.path.relpath(s) for s in _sources.cuda_sources()]
    ext = cpp_extension.CUDAExtension(sources=sources, **common)
else:
    ext = cpp_extension.CppExtension(sources=sources, **common)

# MAKE_INPLACE_BUILD_MINDSPORE=1: also build the MindSpore bridge libraries
# into make_inplace_mindspore/ (torch's headers only; see its _build.py).
if os.environ.get("MAKE_INPLACE_BUILD_MINDSPORE") == "1":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_inplace_mindspore"))
    import _build as _mindspore_build  # noqa: E402

    _mindspore_build.build_cpu(cpp_extension.include_paths()[0])
    if with_cuda:
        _mindspore_build.build_cuda(cpp_extension.include_paths()[0], nvcc=os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc"))

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
