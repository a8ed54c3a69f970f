"""Shared helpers of the MindSpore bridge tests (run in the MindSpore venv).

References are float64 numpy with the formulas the PyTorch tests use (torch
is not installed beside mindspore==2.10.0 and numpy<2; see docs/mindspore.md).
Every test runs in PYNATIVE and in GRAPH mode (the `mode` fixture); in GRAPH
mode forward and gradient go through a compiled Cell.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys

import mindspore as ms
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ms.set_device("CPU")

# Relative tolerances (of the reference's largest magnitude), per dtype.
TOL = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}
MS_DTYPE = {"float64": ms.float64, "float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}


@pytest.fixture(params=["pynative", "graph"])
def mode(request):
    ms.set_context(mode=ms.GRAPH_MODE if request.param == "graph" else ms.PYNATIVE_MODE)
    yield request.param
    ms.set_context(mode=ms.PYNATIVE_MODE)


def tensor(array: np.ndarray, dtype: str) -> ms.Tensor:
    """A MindSpore tensor of `dtype` from float64 data (bfloat16 via float32)."""
    if dtype == "bfloat16":
        return ms.Tensor(array.astype(np.float32)).astype(ms.bfloat16)
    return ms.Tensor(array.astype(dtype))


def numpy64(t: ms.Tensor) -> np.ndarray:
    """A tensor's values as float64 (the rounded inputs the reference must use)."""
    if t.dtype == ms.bfloat16:
        t = t.astype(ms.float32)
    return t.asnumpy().astype(np.float64)


def cotangent(array: np.ndarray, dtype: str) -> np.ndarray:
    """`array` rounded to `dtype` (so the reference sees what the op sees), as
    float32 for the half types (numpy has no bfloat16)."""
    rounded = numpy64(tensor(array, dtype))
    return rounded.astype(np.float32 if dtype in ("float16", "bfloat16") else dtype)


def assert_close(actual: ms.Tensor, expected: np.ndarray, dtype: str, what: str = "") -> None:
    got = numpy64(actual)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite values (an unwritten output?)"
    scale = max(float(np.abs(expected).max(initial=0.0)), 1.0)
    err = float(np.abs(got - expected).max(initial=0.0)) / scale
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]} ({dtype})"


class _Apply(ms.nn.Cell):
    """out = op(*inputs), compiled in GRAPH mode."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def construct(self, *inputs):
        return self.op(*inputs)


class _Loss(ms.nn.Cell):
    """sum(op(*inputs)[k] * cotangent[k]) over the outputs, so the gradient
    is the bprop applied to the given cotangents."""

    def __init__(self, op, cotangents):
        super().__init__()
        self.op = op
        self.cotangents = cotangents

    def construct(self, *inputs):
        out = self.op(*inputs)
        if isinstance(out, tuple):
            total = 0
            for o, c in zip(out, self.cotangents):
                total = total + (o * c).sum()
            return total
        return (out * self.cotangents[0]).sum()


def forward(op, *inputs):
    """op(*inputs), through a compiled Cell in GRAPH mode."""
    if ms.get_context("mode") == ms.GRAPH_MODE:
        return _Apply(op)(*inputs)
    return op(*inputs)


def grads(op, inputs, cotangents, positions):
    """mindspore.grad of sum(op(*inputs) * cotangents) w.r.t. inputs[positions]."""
    loss = _Loss(op, [ms.Tensor(c) for c in cotangents])
    g = ms.grad(loss, grad_position=tuple(positions))(*inputs)
    return g if isinstance(g, tuple) else (g,)


def call_entry(name: str, arrays: list[np.ndarray], dtypes: list[str]) -> int:
    """Calls a CPU entry point directly with the AOT convention (inputs, then outputs)."""
    import make_inplace_mindspore as mims

    lib = ctypes.CDLL(mims.library_path("CPU"))
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int
    n = len(arrays)
    params = (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays])
    ndims = (ctypes.c_int * n)(*[a.ndim for a in arrays])
    shape_arrays = [(ctypes.c_int64 * max(a.ndim, 1))(*a.shape) for a in arrays]
    shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in shape_arrays])
    types = (ctypes.c_char_p * n)(*[d.encode() for d in dtypes])
    return fn(n, params, ndims, shapes, types, None, None)


def assert_refused(name: str, arrays: list[np.ndarray], dtypes: list[str], outputs: int, match: str) -> None:
    """The entry point returns non-zero, keeps a message matching `match`, and
    leaves every array (outputs included) unchanged."""
    import make_inplace_mindspore as mims

    before = [a.copy() for a in arrays]
    assert call_entry(name, arrays, dtypes) != 0
    message = mims.last_error("CPU")
    assert re.search(match, message), message
    assert name in message
    for a, b in zip(arrays, before):
        np.testing.assert_array_equal(a, b)
