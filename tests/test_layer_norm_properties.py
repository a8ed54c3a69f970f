"""Property tests: layer_norm_ and InplaceLayerNorm against torch's layer norm (float64 reference)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import make_inplace
from make_inplace.nn import InplaceLayerNorm
from _properties import DEVICES, Guarded, capped, dtypes, randn, same_bytes, seeds, sizes

# The tolerances of tests/test_layer_norm.py.
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
ATOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@st.composite
def layer_norm_calls(draw, device, dtype=None):
    """x (guarded values), normalized_shape, weight, bias, eps."""
    dtype = draw(dtypes) if dtype is None else dtype
    batch = [draw(sizes()) for _ in range(draw(st.integers(0, 2)))]
    if draw(st.booleans()):
        norm = [draw(sizes(zero=False, wide=True))]
        batch = [min(b, 3) for b in batch]
    else:
        norm = [draw(sizes(zero=False)) for _ in range(draw(st.integers(1, 2)))]
        shape = capped(batch + norm)
        batch, norm = shape[: len(batch)], shape[len(batch) :]
    gen = torch.Generator().manual_seed(draw(seeds))
    # An offset mean checks that the variance is not taken as E[x^2] - E[x]^2.
    x = randn(batch + norm, dtype, device, gen, scale=draw(st.sampled_from([1.0, 0.01, 30.0])),
              shift=draw(st.sampled_from([0.0, 5.0])))
    weight = bias = None
    if draw(st.booleans()):
        # |weight| >= 0.5: the backward rebuilds x_hat = (y - bias) / weight (documented).
        sign = torch.randint(0, 2, norm, generator=gen).double() * 2 - 1
        weight = (sign * (0.5 + torch.rand(norm, generator=gen, dtype=torch.float64))).to(dtype).to(device)
    if draw(st.booleans()):
        bias = randn(norm, dtype, device, gen)
    eps = draw(st.sampled_from([1e-5, 1e-3, 0.5] + ([0.0] if max(norm) > 1 else [])))
    return x, norm, weight, bias, eps


def _finite_max(t: torch.Tensor) -> float:
    # Constant rows with eps = 0 give NaN (as in torch): scales come from the rest.
    finite = t.detach().double().abs()[torch.isfinite(t.detach())]
    return finite.max().item() if finite.numel() else 0.0


def reference(x, norm, weight, bias, eps):
    as64 = lambda t: None if t is None else t.double()  # noqa: E731
    return F.layer_norm(x.double(), norm, as64(weight), as64(bias), eps)


def conditioning_atol(x, norm, expected) -> float:
    """The forward error any normalization computed in float32 (float64 for
    float64 x) has: x - mean loses |mean| / std of the compute precision, so the
    error grows linearly with that ratio (a variance taken as E[x^2] - E[x]^2
    would grow with its square, far beyond this)."""
    if x.numel() == 0:
        return 0.0
    dims = tuple(range(-len(norm), 0))
    x64 = x.double()
    ratio = _finite_max(x64.mean(dims).abs() / x64.std(dims, correction=0)) + 1
    unit = 2.0**-53 if x.dtype == torch.float64 else 2.0**-24
    return 8 * unit * ratio * max(_finite_max(expected), 1.0)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_matches_torch_and_writes_only_x(device, data):
    x, norm, weight, bias, eps = data.draw(layer_norm_calls(device))
    expected = reference(x, norm, weight, bias, eps)
    target = Guarded(x)
    params = [t.clone() for t in (weight, bias) if t is not None]
    out = make_inplace.layer_norm_(target.tensor, norm, weight, bias, eps)
    assert out is target.tensor
    atol = ATOL[x.dtype] + conditioning_atol(x, norm, expected)
    torch.testing.assert_close(out.double(), expected, rtol=TOL[x.dtype], atol=atol, equal_nan=True)
    assert target.intact()
    assert all(same_bytes(a, b) for a, b in zip([t for t in (weight, bias) if t is not None], params))


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_gradients_match_torch(device, data):
    x, norm, weight, bias, eps = data.draw(layer_norm_calls(device))
    dtype = x.dtype
    gen = torch.Generator().manual_seed(data.draw(seeds))
    grad = randn(x.shape, dtype, device, gen)
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, weight, bias)]
    make_inplace.layer_norm_(leaves[0] * 1.0, norm, leaves[1], leaves[2], eps).backward(grad)
    refs = [t.double().requires_grad_() if t is not None else None for t in (x, weight, bias)]
    F.layer_norm(refs[0], norm, refs[1], refs[2], eps).backward(grad.double())
    # As tests/test_layer_norm.py: grads are sums over a row or over rows, so the
    # tolerance scales with their magnitude. grad_x is rstd * (g*w minus its
    # projections), terms that cancel (exactly, for two features): its scale is
    # that of the terms, rstd * |g * w|, not of the small difference.
    tol = TOL[dtype] * 4 if dtype in (torch.float16, torch.bfloat16) else TOL[dtype] * 10
    dims = tuple(range(-len(norm), 0))
    batch = tuple(range(x.dim() - len(norm)))
    gw = grad.double() * (1.0 if weight is None else weight.double())
    rstd = _finite_max((refs[0].detach().var(dims, unbiased=False) + eps).rsqrt()) if x.numel() else 0.0
    # The documented error of the backward: x_hat is rebuilt as (y - bias) / weight
    # from the rounded y, off by up to ulp(y) / |weight|. In half types that is the
    # larger term when x_hat is small beside the bias (e.g. a large eps).
    x_hat_error = 0.0
    if dtype in (torch.float16, torch.bfloat16) and x.numel():
        unit = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]
        y_max = _finite_max(F.layer_norm(refs[0].detach(), norm, None if weight is None else weight.double(),
                                         None if bias is None else bias.double(), eps))
        w_min = 1.0 if weight is None else weight.double().abs().min().item()
        x_hat_error = 2 * unit * max(y_max, 1.0) / w_min
    extra = [3 * rstd * (gw.abs().max().item() if x.numel() else 0.0) * x_hat_error,
             (grad.double().abs().sum(batch).max().item() if x.numel() else 0.0) * x_hat_error, 0.0]
    terms = rstd * gw.abs().max().item() if x.numel() else 0.0
    for k, (ours, ref) in enumerate(zip(leaves, refs)):
        if ours is None:
            continue
        scale = _finite_max(ref.grad) + 1
        if k == 0:
            scale = max(scale, terms)
        torch.testing.assert_close(ours.grad.double() / scale, ref.grad / scale, rtol=tol,
                                   atol=tol + extra[k] / scale, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_module_matches_nn_layer_norm(device, data):
    x, norm, weight, bias, eps = data.draw(layer_norm_calls(device))
    affine = weight is not None
    ref = torch.nn.LayerNorm(norm, eps=eps, elementwise_affine=affine, bias=affine and bias is not None,
                             device=device, dtype=torch.float64)
    ours = InplaceLayerNorm(norm, eps=eps, elementwise_affine=affine, bias=affine and bias is not None,
                            device=device, dtype=x.dtype)
    with torch.no_grad():
        if affine:
            ref.weight.copy_(weight)
            ours.weight.copy_(weight)
            if bias is not None:
                ref.bias.copy_(bias)
                ours.bias.copy_(bias)
        y = x.clone()
        assert ours(y) is y
        expected = ref(x.double())
    atol = ATOL[x.dtype] + conditioning_atol(x, norm, expected)
    torch.testing.assert_close(y.double(), expected, rtol=TOL[x.dtype], atol=atol, equal_nan=True)
