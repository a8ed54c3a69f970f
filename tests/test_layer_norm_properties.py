"""Property tests: layer_norm_ and InplaceLayerNorm against torch's layer norm (float64 reference)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import make_inplace
from make_inplace.nn import InplaceLayerNorm
from _properties import DEVICES, Guarded, dtypes, randn, same_bytes, seeds, sizes

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


def reference(x, norm, weight, bias, eps):
    as64 = lambda t: None if t is None else t.double()  # noqa: E731
    return F.layer_norm(x.double(), norm, as64(weight), as64(bias), eps)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_matches_torch_and_writes_only_x(device, data):
    x, norm, weight, bias, eps = data.draw(layer_norm_calls(device))
    expected = reference(x, norm, weight, bias, eps)
    target = Guarded(x)
    params = [t.clone() for t in (weight, bias) if t is not None]
    out = make_inplace.layer_norm_(target.tensor, norm, weight, bias, eps)
    assert out is target.tensor
    torch.testing.assert_close(out.double(), expected, rtol=TOL[x.dtype], atol=ATOL[x.dtype])
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
    # tolerance scales with their magnitude.
    tol = TOL[dtype] * 4 if dtype in (torch.float16, torch.bfloat16) else TOL[dtype] * 10
    for ours, ref in zip(leaves, refs):
        if ours is None:
            continue
        scale = ref.grad.abs().max().item() + 1 if ref.grad.numel() else 1.0
        torch.testing.assert_close(ours.grad.double() / scale, ref.grad / scale, rtol=tol, atol=tol)


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
    torch.testing.assert_close(y.double(), expected, rtol=TOL[x.dtype], atol=ATOL[x.dtype])
