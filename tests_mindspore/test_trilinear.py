"""trilinear_interpolation through the MindSpore bridge: values, gradients, errors."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from conftest import assert_close, assert_refused, cotangent, forward, grads, numpy64, tensor

import make_inplace_mindspore as mims


def _weights(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Corner weights (N, 8) and their derivatives (N, 8, 3), float64."""
    u = (points + 1) / 2
    w = np.empty((len(points), 8))
    dw = np.empty((len(points), 8, 3))
    for k in range(8):
        bits = ((k >> 2) & 1, (k >> 1) & 1, k & 1)
        factors = [u[:, d] if bits[d] else 1 - u[:, d] for d in range(3)]
        w[:, k] = factors[0] * factors[1] * factors[2]
        for d in range(3):
            others = np.prod([factors[e] for e in range(3) if e != d], axis=0)
            dw[:, k, d] = (0.5 if bits[d] else -0.5) * others
    return w, dw


def _inputs(n: int, f: int, dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    feats = tensor(rng.standard_normal((n, 8, f)), dtype)
    # Some points outside [-1, 1]: the kernels extrapolate with the same polynomial.
    points = tensor(rng.uniform(-1.2, 1.2, (n, 3)), dtype)
    return feats, points


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("n", "f"), [(1, 1), (33, 5), (7, 130), (0, 4), (3, 0)])
def test_forward(mode, dtype, n, f):
    feats, points = _inputs(n, f, dtype, n * 100 + f)
    out = forward(mims.trilinear_interpolation_op(), feats, points)
    w, _ = _weights(numpy64(points))
    assert out.dtype == feats.dtype
    assert_close(out, np.einsum("pk,pkf->pf", w, numpy64(feats)), dtype, "out")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_grad(mode, dtype):
    n, f = 17, 6
    feats, points = _inputs(n, f, dtype, 5)
    g = cotangent(np.random.default_rng(6).standard_normal((n, f)), dtype)
    gf, gp = grads(mims.trilinear_interpolation_op(), [feats, points], [g], (0, 1))
    w, dw = _weights(numpy64(points))
    g64 = g.astype(np.float64)
    assert_close(gf, w[:, :, None] * g64[:, None, :], dtype, "grad_feats")
    assert_close(gp, np.einsum("pkd,pkf,pf->pd", dw, numpy64(feats), g64), dtype, "grad_points")


def test_functional_form():
    feats, points = _inputs(4, 3, "float32", 1)
    w, _ = _weights(numpy64(points))
    assert_close(mims.trilinear_interpolation(feats, points), np.einsum("pk,pkf->pf", w, numpy64(feats)), "float32")


@pytest.mark.parametrize(
    ("feats", "points", "match"),
    [
        ((4, 7, 2), (4, 3), r"feats must have shape \(N, 8, F\), got \(4, 7, 2\)"),
        ((4, 8, 2), (5, 3), r"points must have shape \(4, 3\) to match feats, got \(5, 3\)"),
    ],
)
def test_bad_shapes_raise_with_message(mode, feats, points, match):
    with pytest.raises(ValueError, match=match):
        forward(mims.trilinear_interpolation_op(), tensor(np.ones(feats), "float32"), tensor(np.ones(points), "float32"))


def test_bad_dtype_raises_with_message(mode):
    feats = ms.Tensor(np.ones((2, 8, 3), np.float32))
    points = ms.Tensor(np.ones((2, 3), np.float64))
    with pytest.raises(TypeError, match=r"points must have the dtype of feats \(Float32\), got Float64"):
        forward(mims.trilinear_interpolation_op(), feats, points)


@pytest.mark.parametrize(
    ("name", "shapes", "dtypes", "match"),
    [
        ("MakeInplaceTrilinear", [(2, 8, 3), (2, 3), (2, 4)], ["float64"] * 3, r"output must have shape \(N, F\) of feats, got \(2, 4\)"),
        ("MakeInplaceTrilinear", [(2, 8, 3), (2, 2), (2, 3)], ["float64"] * 3, r"points must have shape \(2, 3\) to match feats, got \(2, 2\)"),
        ("MakeInplaceTrilinear", [(2, 8, 3), (2, 3), (2, 3)], ["float64", "float16", "float64"], r"points must have the dtype of feats \(float64\), got float16"),
        ("MakeInplaceTrilinearBackward", [(2, 3), (2, 3), (2, 8, 3), (2, 8, 3), (2, 4)], ["float64"] * 5, r"grad_points must have the shape of points \(2, 3\), got \(2, 4\)"),
        ("MakeInplaceTrilinearBackward", [(2, 4), (2, 3), (2, 8, 3), (2, 8, 3), (2, 3)], ["float64"] * 5, r"grad_out must have shape \(N, F\) of feats, got \(2, 4\)"),
        ("MakeInplaceTrilinearBackward", [(2, 3), (2, 3), (2, 8, 3), (2, 8, 3)], ["float64"] * 4, "expected 5 tensors"),
    ],
)
def test_entry_points_refuse_bad_calls_before_writing(name, shapes, dtypes, match):
    arrays = [np.random.default_rng(0).standard_normal(s) for s in shapes]
    assert_refused(name, arrays, dtypes, 1, match)
