"""Property tests: outer_product(+backward) against a[..., :, None] * b[..., None, :] in float64."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import make_inplace
from _properties import DEVICES, Guarded, capped, dtypes, randn, same_bytes, seeds, sizes, with_layout

# The tolerances of tests/test_outer_product.py (atol scaled by sqrt(length) for sums).
TOL = {
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
}
LAYOUTS = ["contiguous", "transposed", "strided", "broadcast"]


def close(actual, expected, dtype, scale=1.0):
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=tol["rtol"], atol=tol["atol"] * scale)


def reference_grads(grad_out, a, b):
    g = grad_out.double()
    return (g * b.double()[..., None, :]).sum(-1), (g * a.double()[..., :, None]).sum(-2)


def _laid_out(shape, dtype, device, gen, layout):
    if layout == "broadcast" and len(shape) >= 2:
        # Stride 0 along the first batch dim, as an expanded tensor.
        return randn((1, *shape[1:]), dtype, device, gen).expand(shape)
    return with_layout(randn(shape, dtype, device, gen), layout)


@st.composite
def outer_inputs(draw, device, dtype=None):
    dtype = draw(dtypes) if dtype is None else dtype
    lead = [draw(sizes()) for _ in range(draw(st.integers(0, 3)))]
    n, m = draw(sizes(wide=True)), draw(sizes(wide=True))
    if n * m > 70000:
        # One wide side at a time, few batches: the product is the allocation.
        n, m = (n, min(m, 3)) if draw(st.booleans()) else (min(n, 3), m)
        lead = [min(s, 2) for s in lead]
    *lead, n, m = capped([*lead, n, m], cap=1 << 21)
    gen = torch.Generator().manual_seed(draw(seeds))
    a = _laid_out([*lead, n], dtype, device, gen, draw(st.sampled_from(LAYOUTS)))
    b = _laid_out([*lead, m], dtype, device, gen, draw(st.sampled_from(LAYOUTS)))
    return a, b


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_forward_matches_reference(device, data):
    a, b = data.draw(outer_inputs(device))
    expected = a.double()[..., :, None] * b.double()[..., None, :]
    before = a.clone(), b.clone()
    if data.draw(st.booleans()):
        out = Guarded(torch.full(expected.shape, float("nan"), dtype=a.dtype, device=device))
        assert make_inplace.outer_product(a, b, out=out.tensor) is out.tensor
        assert out.intact()
        result = out.tensor
    else:
        result = make_inplace.outer_product(a, b)
    close(result, expected, a.dtype)
    assert same_bytes(a, before[0]) and same_bytes(b, before[1])


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_backward_matches_reference(device, data):
    a, b = data.draw(outer_inputs(device))
    dtype = a.dtype
    n, m = a.shape[-1], b.shape[-1]
    gen = torch.Generator().manual_seed(data.draw(seeds))
    layout = data.draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    grad_out = with_layout(randn((*a.shape, m), dtype, device, gen), layout)
    accumulate = data.draw(st.booleans())
    ref_a, ref_b = reference_grads(grad_out, a, b)
    before = grad_out.clone()
    if data.draw(st.booleans()):
        start_a, start_b = randn(a.shape, dtype, device, gen), randn(b.shape, dtype, device, gen)
        buf_a, buf_b = Guarded(start_a), Guarded(start_b)
        ga, gb = make_inplace.outer_product_backward(grad_out, a, b, grad_a=buf_a.tensor, grad_b=buf_b.tensor,
                                                     accumulate=accumulate)
        assert ga is buf_a.tensor and gb is buf_b.tensor and buf_a.intact() and buf_b.intact()
        if accumulate:
            ref_a, ref_b = ref_a + start_a.double(), ref_b + start_b.double()
    else:
        ga, gb = make_inplace.outer_product_backward(grad_out, a, b, accumulate=accumulate)
    close(ga, ref_a, dtype, scale=max(m, 1) ** 0.5)
    close(gb, ref_b, dtype, scale=max(n, 1) ** 0.5)
    assert same_bytes(grad_out, before)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_autograd_matches_reference(device, data):
    dtype = data.draw(st.sampled_from([torch.float64, torch.float32]))
    a, b = data.draw(outer_inputs(device, dtype))
    need = data.draw(st.sampled_from(["a", "b", "both"]))
    a_leaf = a.detach().clone().requires_grad_(need != "b")
    b_leaf = b.detach().clone().requires_grad_(need != "a")
    gen = torch.Generator().manual_seed(data.draw(seeds))
    grad_out = randn((*a.shape, b.shape[-1]), dtype, device, gen)
    make_inplace.outer_product(a_leaf, b_leaf).backward(grad_out)
    ref_a, ref_b = reference_grads(grad_out, a, b)
    if need != "b":
        close(a_leaf.grad, ref_a, dtype, scale=max(b.shape[-1], 1) ** 0.5)
    if need != "a":
        close(b_leaf.grad, ref_b, dtype, scale=max(a.shape[-1], 1) ** 0.5)
