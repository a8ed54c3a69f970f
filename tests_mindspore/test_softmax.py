"""softmax through the MindSpore bridge: values, gradients, errors."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from conftest import assert_close, assert_refused, cotangent, forward, grads, numpy64, tensor

import make_inplace_mindspore as mims


def _reference(x: np.ndarray, mask: np.ndarray | None, causal: bool) -> np.ndarray:
    z = x + (0.0 if mask is None else mask)
    if causal:
        rows, cols = z.shape[-2], z.shape[-1]
        z = np.where(np.arange(cols)[None, :] > np.arange(rows)[:, None], -np.inf, z)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("shape", "causal"),
    [(s, c) for s in [(1,), (3, 33), (2, 5, 1025), (0, 7), (4, 2, 3)] for c in (False, True) if len(s) >= 2 or not c],
    ids=str,
)
@pytest.mark.parametrize("masked", [False, True])
def test_forward(mode, dtype, shape, causal, masked):
    rng = np.random.default_rng(len(shape) + shape[-1])
    x = tensor(3 * rng.standard_normal(shape), dtype)
    mask = tensor(rng.standard_normal((1,) * (len(shape) - 1) + shape[-1:]), dtype) if masked else None
    inputs = (x, mask) if masked else (x,)
    y = forward(mims.softmax_op(causal, masked), *inputs)
    assert y.dtype == x.dtype
    assert_close(y, _reference(numpy64(x), None if mask is None else numpy64(mask), causal), dtype, "y")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("causal", "masked"), [(False, False), (True, False), (False, True), (True, True)])
def test_grad(mode, dtype, causal, masked):
    rng = np.random.default_rng(4)
    shape = (2, 5, 6)
    x64, m64 = rng.standard_normal(shape), rng.standard_normal((2, 1, 6))
    g = cotangent(rng.standard_normal(shape), dtype)
    inputs = [tensor(x64, dtype)] + ([tensor(m64, dtype)] if masked else [])
    got = grads(mims.softmax_op(causal, masked), inputs, [g], range(len(inputs)))
    y = _reference(numpy64(inputs[0]), numpy64(inputs[1]) if masked else None, causal)
    g64 = g.astype(np.float64)
    dz = y * (g64 - (g64 * y).sum(axis=-1, keepdims=True))
    assert_close(got[0], dz, dtype, "grad_x")
    if masked:
        assert_close(got[1], dz.sum(axis=1, keepdims=True), dtype, "grad_mask")


def test_functional_scale_and_axis():
    rng = np.random.default_rng(0)
    x = tensor(rng.standard_normal((3, 4, 5)), "float64")
    y = mims.softmax(x, axis=1, scale=0.5)
    expected = np.moveaxis(_reference(np.moveaxis(numpy64(x) * 0.5, 1, -1), None, False), -1, 1)
    assert_close(y, expected, "float64", "y")
    gx = ms.grad(lambda t: (mims.softmax(t, scale=0.5) * ms.Tensor(np.arange(5.0))).sum())(x)
    yy = _reference(numpy64(x) * 0.5, None, False)
    g = np.broadcast_to(np.arange(5.0), yy.shape)
    assert_close(gx, 0.5 * yy * (g - (g * yy).sum(-1, keepdims=True)), "float64", "grad_x")


def test_functional_causal_needs_last_axis():
    with pytest.raises(ValueError, match="causal=True needs axis to be the last axis"):
        mims.softmax(tensor(np.ones((3, 3)), "float32"), axis=0, causal=True)


def test_bad_mask_raises_with_message(mode):
    with pytest.raises(ValueError, match=r"mask must have x's rank with each dim equal to x's or 1 \(x \(2, 3\)\), got \(2, 2\)"):
        forward(mims.softmax_op(False, True), tensor(np.ones((2, 3)), "float32"), tensor(np.ones((2, 2)), "float32"))


def test_bad_dtype_raises_with_message(mode):
    with pytest.raises(TypeError, match=r"x must be float16, bfloat16, float32 or float64, got Int32"):
        forward(mims.softmax_op(), ms.Tensor(np.ones((2, 3), np.int32)))


@pytest.mark.parametrize(
    ("name", "shapes", "dtypes", "match"),
    [
        ("MakeInplaceSoftmax", [(2, 3), (3, 2)], ["float64"] * 2, r"output must have the shape of x \(2, 3\), got \(3, 2\)"),
        ("MakeInplaceSoftmaxCausal", [(3,), (3,)], ["float64"] * 2, r"causal softmax needs x with at least 2 dims"),
        ("MakeInplaceSoftmaxMask", [(2, 3), (2, 2), (2, 3)], ["float64"] * 3, r"mask must have x's rank"),
        ("MakeInplaceSoftmaxMask", [(2, 3), (1, 3), (2, 3)], ["float64", "float32", "float64"], r"mask must have the dtype of x \(float64\), got float32"),
        ("MakeInplaceSoftmaxBackward", [(2, 3), (2, 4), (2, 4)], ["float64"] * 3, r"grad_output must have the shape of y \(2, 4\), got \(2, 3\)"),
    ],
)
def test_entry_points_refuse_bad_calls_before_writing(name, shapes, dtypes, match):
    arrays = [np.random.default_rng(0).standard_normal(s) for s in shapes]
    assert_refused(name, arrays, dtypes, 1, match)
