"""outer_product through the MindSpore bridge: values, gradients, errors."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from conftest import assert_close, assert_refused, cotangent, forward, grads, numpy64, tensor

import make_inplace_mindspore as mims


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("a_shape", "m"), [((1,), 1), ((5, 33), 17), ((2, 3, 4), 65), ((0, 3), 2), ((3, 0), 4)], ids=str)
def test_forward(mode, dtype, a_shape, m):
    rng = np.random.default_rng(sum(a_shape) + m)
    a = tensor(rng.standard_normal(a_shape), dtype)
    b = tensor(rng.standard_normal((*a_shape[:-1], m)), dtype)
    out = forward(mims.outer_product_op(), a, b)
    assert out.dtype == a.dtype
    assert_close(out, numpy64(a)[..., :, None] * numpy64(b)[..., None, :], dtype, "out")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_grad(mode, dtype):
    rng = np.random.default_rng(3)
    a, b = tensor(rng.standard_normal((2, 3, 5)), dtype), tensor(rng.standard_normal((2, 3, 7)), dtype)
    g = cotangent(rng.standard_normal((2, 3, 5, 7)), dtype)
    ga, gb = grads(mims.outer_product_op(), [a, b], [g], (0, 1))
    g64 = g.astype(np.float64)
    assert_close(ga, np.einsum("sij,sj->si", g64.reshape(6, 5, 7), numpy64(b).reshape(6, 7)).reshape(2, 3, 5), dtype, "grad_a")
    assert_close(gb, np.einsum("sij,si->sj", g64.reshape(6, 5, 7), numpy64(a).reshape(6, 5)).reshape(2, 3, 7), dtype, "grad_b")


def test_functional_form():
    a = tensor(np.arange(3.0), "float32")
    b = tensor(np.arange(4.0), "float32")
    assert_close(mims.outer_product(a, b), np.outer(np.arange(3.0), np.arange(4.0)), "float32")


def test_bad_shapes_raise_with_message(mode):
    with pytest.raises(ValueError, match=r"a and b must have the same leading dimensions, got \(2, 3\) and \(3, 3\)"):
        forward(mims.outer_product_op(), tensor(np.ones((2, 3)), "float32"), tensor(np.ones((3, 3)), "float32"))


def test_bad_dtype_raises_with_message(mode):
    with pytest.raises(TypeError, match=r"a must be float16, bfloat16, float32 or float64, got Int64"):
        forward(mims.outer_product_op(), ms.Tensor(np.ones(3, np.int64)), ms.Tensor(np.ones(3, np.int64)))


@pytest.mark.parametrize(
    ("name", "shapes", "dtypes", "match"),
    [
        ("MakeInplaceOuterProduct", [(2, 3), (2, 4), (2, 4, 3)], ["float64"] * 3, r"output must have shape \(\.\.\., 3, 4\) with the leading dimensions of a \(2, 3\), got \(2, 4, 3\)"),
        ("MakeInplaceOuterProduct", [(2, 3), (3, 4), (2, 3, 4)], ["float64"] * 3, "a and b must have the same leading dimensions"),
        ("MakeInplaceOuterProduct", [(2, 3), (2, 4), (2, 3, 4)], ["float64", "float64", "bfloat16"], r"output must have the dtype of a \(float64\), got bfloat16"),
        ("MakeInplaceOuterProductBackward", [(2, 3, 4), (2, 3), (2, 4), (2, 3), (2, 5)], ["float64"] * 5, r"grad_b must have the shape of b \(2, 4\), got \(2, 5\)"),
        ("MakeInplaceOuterProductBackward", [(2, 3, 5), (2, 3), (2, 4), (2, 3), (2, 4)], ["float64"] * 5, r"grad_out must have shape \(\.\.\., 3, 4\)"),
    ],
)
def test_entry_points_refuse_bad_calls_before_writing(name, shapes, dtypes, match):
    arrays = [np.random.default_rng(0).standard_normal(s) for s in shapes]
    assert_refused(name, arrays, dtypes, 1, match)
