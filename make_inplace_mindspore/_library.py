"""Finds the bridge libraries and builds the ``mindspore.ops.Custom`` objects.

The libraries (see _build.py) sit next to this package, or in the directory
named by ``MAKE_INPLACE_MINDSPORE_LIB_DIR``. Which one an op uses follows
MindSpore's device target when the op is first made: ``CPU`` ->
``libmake_inplace_ms_cpu.so``, ``GPU`` -> ``libmake_inplace_ms_cuda.so``.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable

import mindspore as ms
from mindspore import ops

from ._build import CPU_LIBRARY, CUDA_LIBRARY, PACKAGE_DIR

LIB_DIR_ENV = "MAKE_INPLACE_MINDSPORE_LIB_DIR"

FLOAT_DTYPES = (ms.float16, ms.bfloat16, ms.float32, ms.float64)

_LIBRARIES = {"CPU": CPU_LIBRARY, "GPU": CUDA_LIBRARY}
_cache: dict[tuple[str, str, bool], ops.Custom] = {}


def device_target() -> str:
    return ms.get_context("device_target")


def library_path(target: str | None = None) -> str:
    """The bridge library for a MindSpore device target ("CPU" or "GPU")."""
    target = target or device_target()
    if target not in _LIBRARIES:
        raise RuntimeError(f"make_inplace_mindspore: device target must be CPU or GPU, got {target!r}")
    path = os.path.join(os.environ.get(LIB_DIR_ENV, PACKAGE_DIR), _LIBRARIES[target])
    if not os.path.isfile(path):
        raise RuntimeError(
            f"make_inplace_mindspore: {path} not found; build it with "
            "`python make_inplace_mindspore/_build.py --c10-include <torch include dir>` "
            f"(add --cuda for the GPU library) or set {LIB_DIR_ENV}"
        )
    return path


def last_error(target: str | None = None) -> str:
    """The message of the last failed bridge call in this process ("" if none).

    MindSpore reports a failed AOT call only as "Return value ... is N"; the
    bridge also prints its message to stderr and keeps it for this function.
    """
    lib = ctypes.CDLL(library_path(target))
    lib.MakeInplaceLastError.restype = ctypes.c_char_p
    return lib.MakeInplaceLastError().decode()


def element_type(dtype) -> ms.Type:
    """The element dtype of what an out_dtype function receives (a TensorType)."""
    return dtype.element_type() if hasattr(dtype, "element_type") else dtype


def check_float(op: str, name: str, dtype) -> None:
    if element_type(dtype) not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float16, bfloat16, float32 or float64, got {element_type(dtype)}")


def check_same_dtype(op: str, name: str, dtype, like_name: str, like) -> None:
    if element_type(dtype) != element_type(like):
        raise TypeError(f"{op}: {name} must have the dtype of {like_name} ({element_type(like)}), got {element_type(dtype)}")


def widen(t: ms.Tensor) -> ms.Tensor:
    """float16/bfloat16 as float32, for the reductions the bprops leave to
    MindSpore (its CPU MatMul and ReduceSum have no bfloat16 kernels, and
    float32 accumulation is what the bridge's kernels use too)."""
    if t.dtype == ms.float16 or t.dtype == ms.bfloat16:
        return ops.cast(t, ms.float32)
    return t


def custom(name: str, out_shape: Callable, out_dtype: Callable, bprop: Callable | None = None) -> ops.Custom:
    """The Custom op calling entry point `name` of the current target's library (cached).

    Each entry point has its own function string "lib.so:Name", which MindSpore
    keys its shape inference by, so every op and variant gets a distinct name.
    The same entry point may also be made without a bprop (for use inside
    another op's bprop); both share the same shape and dtype functions.
    """
    target = device_target()
    key = (target, name, bprop is not None)
    if key not in _cache:
        _cache[key] = ops.Custom(
            f"{library_path(target)}:{name}", out_shape=out_shape, out_dtype=out_dtype, func_type="aot", bprop=bprop
        )
    return _cache[key]
