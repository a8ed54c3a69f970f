"""square_matmul through the MindSpore bridge: values, gradients, errors."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from conftest import assert_close, assert_refused, cotangent, forward, grads, numpy64, tensor

import make_inplace_mindspore as mims
from make_inplace_mindspore.square_matmul import _out_dtype, _out_shape

SHAPES = [(1, 1), (5, 33), (2, 3, 17), (0, 8), (65, 64)]


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward(mode, dtype, transpose, has_bias, shape):
    rng = np.random.default_rng(sum(shape) + 7 * transpose + 3 * has_bias)
    n = shape[-1]
    x = tensor(rng.standard_normal(shape), dtype)
    w = tensor(rng.standard_normal((n, n)) / np.sqrt(n), dtype)
    b = tensor(rng.standard_normal(n), dtype)
    inputs = (x, w, b) if has_bias else (x, w)
    y = forward(mims.square_matmul_op(transpose, has_bias), *inputs)
    w64 = numpy64(w)
    expected = numpy64(x) @ (w64.T if transpose else w64) + (numpy64(b) if has_bias else 0.0)
    assert y.dtype == x.dtype
    assert_close(y, expected, dtype, "y")


def test_functional_form_matches_op():
    x = tensor(np.random.default_rng(1).standard_normal((4, 6)), "float32")
    w = tensor(np.random.default_rng(2).standard_normal((6, 6)), "float32")
    b = tensor(np.random.default_rng(3).standard_normal(6), "float32")
    expected = numpy64(x) @ numpy64(w).T + numpy64(b)
    assert_close(mims.square_matmul(x, w, b, transpose=True), expected, "float32")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("has_bias", [False, True])
def test_grad(mode, dtype, transpose, has_bias):
    rng = np.random.default_rng(11 + 2 * transpose + has_bias)
    shape, n = (3, 4, 9), 9
    x64, w64, b64 = rng.standard_normal(shape), rng.standard_normal((n, n)), rng.standard_normal(n)
    dy = cotangent(rng.standard_normal(shape), dtype)
    inputs = [tensor(x64, dtype), tensor(w64, dtype)] + ([tensor(b64, dtype)] if has_bias else [])
    x64, w64 = numpy64(inputs[0]), numpy64(inputs[1])
    op = mims.square_matmul_op(transpose, has_bias)
    got = grads(op, inputs, [dy], range(len(inputs)))
    x2, d2 = x64.reshape(-1, n), dy.astype(np.float64).reshape(-1, n)
    wm = w64.T if transpose else w64
    expected = [(d2 @ wm.T).reshape(shape), d2.T @ x2 if transpose else x2.T @ d2]
    if has_bias:
        expected.append(d2.sum(axis=0))
    assert len(got) == len(expected)
    for g, e, name in zip(got, expected, ["grad_x", "grad_weight", "grad_bias"]):
        assert_close(g, e, dtype, name)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (((4, 6), (6, 5)), ValueError, r"weight must have shape \(6, 6\).*got \(6, 5\)"),
        (((4, 6), (6, 6), (5,)), ValueError, r"bias must have shape \(6,\), got \(5,\)"),
        (((), (1, 1)), ValueError, r"x must have at least one dimension"),
    ],
)
def test_bad_shapes_raise_with_message(mode, args, error, match):
    rng = np.random.default_rng(0)
    inputs = [tensor(rng.standard_normal(s), "float32") for s in args]
    op = mims.square_matmul_op(False, len(inputs) == 3)
    with pytest.raises(error, match=match):
        forward(op, *inputs)


@pytest.mark.parametrize(
    ("dtypes", "match"),
    [
        ((ms.int32, ms.int32), r"x must be float16, bfloat16, float32 or float64, got Int32"),
        ((ms.float32, ms.float64), r"weight must have the dtype of x \(Float32\), got Float64"),
    ],
)
def test_bad_dtypes_raise_with_message(mode, dtypes, match):
    x = ms.Tensor(np.ones((3, 4)), dtypes[0])
    w = ms.Tensor(np.ones((4, 4)), dtypes[1])
    with pytest.raises(TypeError, match=match):
        forward(mims.square_matmul_op(), x, w)


def test_c_checks_reached_through_mindspore_raise_not_crash():
    """With shape inference that lets a bad weight through, the bridge's own
    check refuses it: MindSpore raises and the message is kept."""
    permissive = ms.ops.Custom(
        f"{mims.library_path()}:MakeInplaceSquareMatmul",
        out_shape=lambda x, w: x,
        out_dtype=lambda x, w: x,
        func_type="aot",
    )
    x = ms.Tensor(np.ones((3, 4), np.float32))
    w = ms.Tensor(np.ones((4, 5), np.float32))
    with pytest.raises(RuntimeError, match="MakeInplaceSquareMatmul"):
        permissive(x, w).asnumpy()
    assert "weight must have shape (4, 4) to match x's last dimension, got (4, 5)" in mims.last_error()


@pytest.mark.parametrize(
    ("arrays", "dtypes", "match"),
    [
        ([np.ones((2, 3)), np.ones((3, 3)), np.zeros((2, 3))], ["int32"] * 3, "x must be float16, bfloat16, float32 or float64, got int32"),
        ([np.ones((2, 3)), np.ones((3, 3)), np.zeros((2, 4))], ["float64"] * 3, r"output must have the shape of x \(2, 3\), got \(2, 4\)"),
        ([np.ones((2, 3)), np.ones((3, 3))], ["float64"] * 2, "expected 3 tensors"),
        ([np.ones((2, 3)), np.ones((3, 3)), np.zeros((2, 3))], ["float64", "float32", "float64"], r"weight must have the dtype of x \(float64\), got float32"),
    ],
)
def test_entry_point_refuses_bad_calls_before_writing(arrays, dtypes, match):
    assert_refused("MakeInplaceSquareMatmul", arrays, dtypes, 1, match)


def test_shape_functions_agree_with_entry_point():
    assert _out_shape([2, 3], [3, 3]) == [2, 3]
    assert _out_dtype(ms.float32, ms.float32) == ms.float32


def test_package_imports_without_torch():
    import sys

    assert "torch" not in sys.modules
