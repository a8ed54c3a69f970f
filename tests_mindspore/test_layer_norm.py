"""layer_norm through the MindSpore bridge: values, mean/rstd, gradients, errors."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from conftest import assert_close, assert_refused, cotangent, forward, grads, numpy64, tensor

import make_inplace_mindspore as mims

EPS = 1e-5


def _stats(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    mean = x.mean(axis=-1)
    return mean, 1.0 / np.sqrt(x.var(axis=-1) + eps)


def _affine_inputs(rng, n: int, dtype: str, has_weight: bool, has_bias: bool) -> list:
    out = []
    if has_weight:
        out.append(tensor(1 + 0.5 * rng.standard_normal(n), dtype))
    if has_bias:
        out.append(tensor(rng.standard_normal(n), dtype))
    return out


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("rows", "n"), [(1, 1), (7, 33), (3, 1025), (0, 8)])
@pytest.mark.parametrize(("has_weight", "has_bias"), [(False, False), (True, False), (False, True), (True, True)])
def test_forward(mode, dtype, rows, n, has_weight, has_bias):
    rng = np.random.default_rng(rows * 31 + n)
    x = tensor(2 + 3 * rng.standard_normal((rows, n)), dtype)
    affine = _affine_inputs(rng, n, dtype, has_weight, has_bias)
    y, mean, rstd = forward(mims.layer_norm_op(has_weight, has_bias), x, *affine, ms.Tensor([EPS], ms.float64))
    x64 = numpy64(x)
    m, r = _stats(x64, EPS)
    expected = (x64 - m[:, None]) * r[:, None]
    if has_weight:
        expected = expected * numpy64(affine[0])
    if has_bias:
        expected = expected + numpy64(affine[-1])
    assert y.dtype == x.dtype
    assert mean.dtype == (ms.float64 if dtype == "float64" else ms.float32)
    assert_close(y, expected, dtype, "y")
    stat_tol = "float64" if dtype == "float64" else "float32"
    assert_close(mean, m, stat_tol, "mean")
    assert_close(rstd, r, dtype if dtype in ("float16", "bfloat16") else stat_tol, "rstd")


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("has_weight", "has_bias"), [(False, False), (True, False), (False, True), (True, True)])
def test_grad(mode, dtype, has_weight, has_bias):
    rng = np.random.default_rng(9)
    rows, n = 6, 10
    x = tensor(rng.standard_normal((rows, n)), dtype)
    affine = _affine_inputs(rng, n, dtype, has_weight, has_bias)
    eps = ms.Tensor([EPS], ms.float64)
    g = cotangent(rng.standard_normal((rows, n)), dtype)
    cotangents = [g, np.zeros(rows, np.float64 if dtype == "float64" else np.float32)]
    cotangents.append(cotangents[1])
    got = grads(mims.layer_norm_op(has_weight, has_bias), [x, *affine, eps], cotangents, range(1 + len(affine)))
    x64, g64 = numpy64(x), g.astype(np.float64)
    m, r = _stats(x64, EPS)
    xhat = (x64 - m[:, None]) * r[:, None]
    w = numpy64(affine[0]) if has_weight else np.ones(n)
    gw_in = g64 * w
    gx = r[:, None] * (gw_in - gw_in.mean(-1, keepdims=True) - xhat * (gw_in * xhat).mean(-1, keepdims=True))
    expected = [gx] + ([(g64 * xhat).sum(0)] if has_weight else []) + ([g64.sum(0)] if has_bias else [])
    assert len(got) == len(expected)
    for t, e, name in zip(got, expected, ["grad_x", "grad_weight/bias", "grad_bias"]):
        assert_close(t, e, dtype, name)


def test_functional_form_and_grad():
    rng = np.random.default_rng(2)
    x = tensor(rng.standard_normal((2, 3, 4, 5)), "float64")
    w = tensor(rng.standard_normal((4, 5)), "float64")
    b = tensor(rng.standard_normal((4, 5)), "float64")
    y = mims.layer_norm(x, (4, 5), w, b, eps=1e-3)
    x2 = numpy64(x).reshape(6, 20)
    m, r = _stats(x2, 1e-3)
    expected = ((x2 - m[:, None]) * r[:, None]).reshape(2, 3, 4, 5) * numpy64(w) + numpy64(b)
    assert_close(y, expected, "float64", "y")
    gb = ms.grad(lambda b: mims.layer_norm(x, (4, 5), w, b).sum())(b)
    assert_close(gb, np.full((4, 5), 6.0), "float64", "grad_bias")


def test_functional_bad_normalized_shape():
    with pytest.raises(ValueError, match=r"trailing dims must equal normalized_shape \(4,\), got \(2, 3\)"):
        mims.layer_norm(tensor(np.ones((2, 3)), "float32"), (4,))


def test_bad_weight_raises_with_message(mode):
    with pytest.raises(ValueError, match=r"weight must have shape \(3,\) \(normalized_shape flattened\), got \(4,\)"):
        forward(mims.layer_norm_op(True, False), tensor(np.ones((2, 3)), "float32"), tensor(np.ones(4), "float32"), ms.Tensor([EPS], ms.float64))


def test_bad_eps_dtype_raises_with_message(mode):
    with pytest.raises(TypeError, match=r"eps must be float64, got Float32"):
        forward(mims.layer_norm_op(False, False), tensor(np.ones((2, 3)), "float32"), ms.Tensor([EPS], ms.float32))


@pytest.mark.parametrize(
    ("name", "shapes", "dtypes", "match"),
    [
        ("MakeInplaceLayerNorm", [(2, 3), (1,), (2, 3), (2,), (3,)], ["float32", "float64", "float32", "float32", "float32"], r"rstd must have shape \(2,\), got \(3,\)"),
        ("MakeInplaceLayerNorm", [(2, 3), (1,), (2, 3), (2,), (2,)], ["float32", "float64", "float32", "float64", "float32"], r"mean must be float32, got float64"),
        ("MakeInplaceLayerNormWeight", [(2, 3), (4,), (1,), (2, 3), (2,), (2,)], ["float64"] * 6, r"weight must have shape \(3,\), got \(4,\)"),
        ("MakeInplaceLayerNorm", [(2, 3), (1,), (2, 3), (2,), (2,)], ["float64", "float32", "float64", "float64", "float64"], r"eps must be float64, got float32"),
        ("MakeInplaceLayerNormBackward", [(2, 3), (2, 3), (2,), (2, 3), (0,)], ["float64", "float64", "float64", "float64", "float32"], r"workspace must be a 1-D uint8 tensor"),
        ("MakeInplaceLayerNormBackwardBias", [(2, 3), (2, 4), (3,), (2,), (2, 3), (3,), (0,)], ["float64"] * 6 + ["uint8"], r"grad_output must have shape \(2, 4\), got \(2, 3\)"),
    ],
)
def test_entry_points_refuse_bad_calls_before_writing(name, shapes, dtypes, match):
    arrays = [np.random.default_rng(0).standard_normal(s) for s in shapes]
    assert_refused(name, arrays, dtypes, 1, match)
