"""Property tests: trilinear_interpolation(+backward) against the formula in float64."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import make_inplace
from make_inplace._testing import trilinear_reference
from _properties import DEVICES, Guarded, dtypes, randn, same_bytes, seeds, sizes, with_layout

# The tolerances of tests/test_trilinear.py.
TOL = {
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
}
FEATS_LAYOUTS = ["contiguous", "channels-first", "strided", "broadcast"]




def reference_grads(feats, points, grad_out):
    """The formula's gradients in float64 on the CPU, whatever the inputs' device
    (the accumulate case adds the buffers' starting values, moved to the CPU, to them)."""
    f64 = feats.detach().double().cpu().requires_grad_()
    p64 = points.detach().double().cpu().requires_grad_()
    trilinear_reference(f64, p64).backward(grad_out.double().cpu())
    return f64.grad, p64.grad


def close(actual, expected, dtype, scale=1.0):
    # scale: grad_points sums F products, so (as tests/test_outer_product.py does
    # for its sums) its absolute error grows like sqrt(F).
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=tol["rtol"],
                               atol=tol["atol"] * scale)


@st.composite
def trilinear_inputs(draw, device, dtype=None):
    """feats (N, 8, F) in any layout; points (N, 3), also outside [-1, 1]."""
    dtype = draw(dtypes) if dtype is None else dtype
    n, f = draw(sizes()), draw(sizes(zero=False, wide=draw(st.booleans())))
    if f > 1000:
        n = min(n, 3)
    gen = torch.Generator().manual_seed(draw(seeds))
    layout = draw(st.sampled_from(FEATS_LAYOUTS))
    if layout == "channels-first":
        feats = randn((n, f, 8), dtype, device, gen).transpose(1, 2)
    elif layout == "broadcast":
        feats = randn((1, 8, f), dtype, device, gen).expand(n, 8, f)  # stride 0 over points
    else:
        feats = with_layout(randn((n, 8, f), dtype, device, gen), layout)
    spread = draw(st.sampled_from([1.0, 1.5]))  # 1.5: extrapolated, as documented
    points = ((torch.rand(n, 3, generator=gen, dtype=torch.float64) * 2 - 1) * spread).to(dtype).to(device)
    points = with_layout(points, draw(st.sampled_from(["contiguous", "transposed", "strided"])))
    return feats, points


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_forward_matches_formula(device, data):
    feats, points = data.draw(trilinear_inputs(device))
    expected = trilinear_reference(feats.double(), points.double())
    before = feats.clone(), points.clone()
    if data.draw(st.booleans()):
        out = Guarded(torch.full(expected.shape, float("nan"), dtype=feats.dtype, device=device))
        assert make_inplace.trilinear_interpolation(feats, points, out=out.tensor) is out.tensor
        assert out.intact()
        result = out.tensor
    else:
        result = make_inplace.trilinear_interpolation(feats, points)
    close(result, expected, feats.dtype)
    assert same_bytes(feats, before[0]) and same_bytes(points, before[1])


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_backward_matches_formula(device, data):
    feats, points = data.draw(trilinear_inputs(device))
    dtype = feats.dtype
    n, _, f = feats.shape
    gen = torch.Generator().manual_seed(data.draw(seeds))
    grad_out = randn((n, f), dtype, device, gen)
    if data.draw(st.booleans()):
        grad_out = with_layout(grad_out, data.draw(st.sampled_from(["transposed", "strided"])))
    with_feats = data.draw(st.booleans())
    accumulate = data.draw(st.booleans())
    given_buffers = data.draw(st.booleans())
    ref_feats, ref_points = reference_grads(feats, points, grad_out)
    before = grad_out.clone()
    if given_buffers:
        start_f, start_p = randn((n, 8, f), dtype, device, gen), randn((n, 3), dtype, device, gen)
        gf_buf, gp_buf = Guarded(start_f), Guarded(start_p) if with_feats else None
        gf, gp = make_inplace.trilinear_interpolation_backward(
            grad_out, points, feats if with_feats else None, grad_feats=gf_buf.tensor,
            grad_points=gp_buf.tensor if with_feats else None, accumulate=accumulate)
        assert gf is gf_buf.tensor and gf_buf.intact()
        if with_feats:
            assert gp is gp_buf.tensor and gp_buf.intact()
        if accumulate:
            ref_feats, ref_points = ref_feats + start_f.double().cpu(), ref_points + start_p.double().cpu()
    else:
        gf, gp = make_inplace.trilinear_interpolation_backward(
            grad_out, points, feats if with_feats else None, accumulate=accumulate)
    close(gf, ref_feats, dtype)
    if with_feats:
        close(gp, ref_points, dtype, scale=f**0.5)
    else:
        assert gp is None
    assert same_bytes(grad_out, before)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_autograd_matches_formula(device, data):
    dtype = data.draw(st.sampled_from([torch.float64, torch.float32]))
    feats, points = data.draw(trilinear_inputs(device, dtype))
    need = data.draw(st.sampled_from(["feats", "points", "both"]))
    f_leaf = feats.detach().clone().requires_grad_(need != "points")
    p_leaf = points.detach().clone().requires_grad_(need != "feats")
    gen = torch.Generator().manual_seed(data.draw(seeds))
    grad_out = randn((feats.shape[0], feats.shape[2]), dtype, device, gen)
    make_inplace.trilinear_interpolation(f_leaf, p_leaf).backward(grad_out)
    ref_feats, ref_points = reference_grads(feats, points, grad_out)
    if need != "points":
        close(f_leaf.grad, ref_feats, dtype)
    if need != "feats":
        close(p_leaf.grad, ref_points, dtype, scale=feats.shape[2] ** 0.5)
