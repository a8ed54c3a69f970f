"""Property tests: softmax_ and InplaceSoftmax against torch.softmax (float64 reference)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import make_inplace
from make_inplace.nn import InplaceSoftmax
from _properties import DEVICES, Guarded, LAYOUTS, capped, dtypes, randn, same_bytes, seeds, sizes, with_layout

TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
# Gradients are sums over a row: their error grows with the row's length.
GRAD_TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


@st.composite
def softmax_calls(draw, device, dtype=None):
    """x (guarded), dim, scale, causal and a mask broadcastable to x in any layout."""
    dtype = draw(dtypes) if dtype is None else dtype
    rank = draw(st.integers(1, 4))
    dim = draw(st.integers(-rank, rank - 1))
    shape = capped([draw(sizes()) for _ in range(rank)])
    if draw(st.booleans()):
        # One wide row axis (the normalized one), the rest small.
        shape = [draw(st.sampled_from([1, 2, 3])) for _ in range(rank)]
        shape[dim] = draw(sizes(wide=True))
    gen = torch.Generator().manual_seed(draw(seeds))
    spread = draw(st.sampled_from([1.0, 8.0]))
    x = randn(shape, dtype, device, gen, scale=spread)
    scale = draw(st.one_of(st.none(), st.sampled_from([0.125, 0.7, 3.0])))
    causal = rank >= 2 and dim in (-1, rank - 1) and draw(st.booleans())
    mask = None
    if draw(st.booleans()):
        # Broadcastable: drop some leading dims, make some of the rest 1.
        kept = draw(st.integers(0, rank))
        mask_shape = [s if draw(st.booleans()) else 1 for s in shape[rank - kept :]]
        mask = randn(mask_shape, dtype, device, gen)
        if draw(st.booleans()) and mask.numel() > 1:
            mask.view(-1)[0] = float("-inf")  # masked out, as attention masks do
        mask = with_layout(mask, draw(st.sampled_from(LAYOUTS)))
    return x, dim, scale, causal, mask


def reference(x, dim, scale, causal, mask):
    v = x.double() * (1.0 if scale is None else scale)
    if mask is not None:
        v = v + mask.double()
    if causal:
        rows, cols = x.shape[-2], x.shape[-1]
        v = v.masked_fill(torch.ones(rows, cols, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
    return torch.softmax(v, dim)


def close(result, expected, tol):
    torch.testing.assert_close(result.double(), expected, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_matches_torch_and_writes_only_x(device, data):
    x, dim, scale, causal, mask = data.draw(softmax_calls(device))
    expected = reference(x, dim, scale, causal, mask)
    target = Guarded(x)
    mask_before = None if mask is None else mask.clone()
    out = make_inplace.softmax_(target.tensor, dim, scale=scale, causal=causal, mask=mask)
    assert out is target.tensor
    close(out, expected, TOL[x.dtype])
    assert target.intact()
    assert mask is None or same_bytes(mask, mask_before)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_gradients_match_torch(device, data):
    dtype = data.draw(st.sampled_from([torch.float64, torch.float32]))
    x, dim, scale, causal, mask = data.draw(softmax_calls(device, dtype))
    mask_grad = mask is not None and data.draw(st.booleans())
    gen = torch.Generator().manual_seed(data.draw(seeds))
    grad = randn(x.shape, dtype, device, gen)
    if data.draw(st.booleans()) and x.dim() >= 2:
        grad = with_layout(grad, "transposed")  # autograd may hand any strides

    leaf = x.clone().requires_grad_()
    m = None if mask is None else mask.detach().clone().requires_grad_(mask_grad)
    make_inplace.softmax_(leaf * 1.0, dim, scale=scale, causal=causal, mask=m).backward(grad)

    ref_leaf = x.double().requires_grad_()
    ref_m = None if mask is None else mask.double().requires_grad_(mask_grad)
    y_ref = reference(ref_leaf, dim, scale, causal, ref_m)
    y_ref.backward(grad.double())
    # A row that became NaN (every position masked out) has NaN gradients in
    # both; torch's are 0 where its masked_fill cut the causal part, which a
    # backward from the output alone cannot tell apart: compared where finite.
    nan_rows = ~torch.isfinite(y_ref.detach()).all(dim, keepdim=True).expand_as(y_ref) if x.dim() else None
    if nan_rows is not None and nan_rows.any():
        assert torch.isnan(leaf.grad[nan_rows & torch.isnan(ref_leaf.grad)]).all()
        leaf.grad[nan_rows] = 0
        ref_leaf.grad[nan_rows] = 0
    close(leaf.grad, ref_leaf.grad, GRAD_TOL[dtype])
    if mask_grad:
        ours_m, ref_mg = m.grad.double(), ref_m.grad
        if nan_rows is not None and nan_rows.any():
            # The mask's gradient sums over rows: a NaN row makes it NaN along the
            # columns it reaches, in ours everywhere, in torch except at its cut.
            assert torch.isnan(ours_m[torch.isnan(ref_mg)]).all()
            both = torch.isfinite(ours_m) & torch.isfinite(ref_mg)
            ours_m, ref_mg = ours_m[both], ref_mg[both]
        scale_sum = max(1.0, ref_mg.abs().max().item()) if ref_mg.numel() else 1.0
        torch.testing.assert_close(ours_m / scale_sum, ref_mg / scale_sum,
                                   rtol=GRAD_TOL[dtype], atol=GRAD_TOL[dtype], equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_module_matches_nn_softmax(device, data):
    x, dim, _, _, _ = data.draw(softmax_calls(device))
    expected = torch.nn.Softmax(dim)(x.double())
    module = InplaceSoftmax(dim)
    y = x.clone()
    assert module(y) is y
    close(y, expected, TOL[x.dtype])
