"""Property tests: square_matmul_ and InplaceLinear against float64 matmul."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import make_inplace
from make_inplace._measure import relative_error
from make_inplace._testing import FORCED_ROUTES, forced_route
from make_inplace.nn import InplaceLinear
from _properties import DEVICES, Guarded, dtypes, randn, same_bytes, seeds

# The tolerance of tests/test_square_matmul.py: relative (Frobenius) error.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.2e-2, torch.float32: 2e-5, torch.float64: 1e-12}
WIDTHS = [1, 2, 3, 5, 7, 8, 16, 31, 32, 33, 64, 127, 128, 257]
ROWS = [0, 1, 2, 3, 5, 17, 64, 128, 257, 1000]
# None: the default bound; 0: no workspace (in-register kernels); small: a few
# rows' worth (panels of a few rows); large: whole-x panels.
WORKSPACES = ["none", "zero", "small", "large"]


@st.composite
def square_matmul_calls(draw, device, dtype=None):
    dtype = draw(dtypes) if dtype is None else dtype
    n = draw(st.sampled_from(WIDTHS))
    lead = [draw(st.sampled_from(ROWS))] + [draw(st.sampled_from([1, 2, 3])) for _ in range(draw(st.integers(0, 2)))]
    gen = torch.Generator().manual_seed(draw(seeds))
    x = randn(lead[::-1] + [n], dtype, device, gen)
    w = randn((n, n), dtype, device, gen, scale=n**-0.5)
    if draw(st.booleans()):
        w = w.t().contiguous().t()  # the transpose of a contiguous matrix: read in place
    transpose = draw(st.booleans())
    bias = randn((n,), dtype, device, gen) if draw(st.booleans()) else None
    mode = draw(st.sampled_from(WORKSPACES))
    row_bytes = n * x.element_size()
    workspace = {"none": None, "zero": 0, "small": draw(st.integers(1, 4 * row_bytes)), "large": 1 << 30}[mode]
    return x, w, bias, transpose, workspace


def reference(x, w, bias, transpose):
    out = x.double() @ (w.double().t() if transpose else w.double())
    return out if bias is None else out + bias.double()


def routes(device):
    # On CUDA every route the library can force, each where it can run the call.
    return st.sampled_from([None, *FORCED_ROUTES]) if device == "cuda" else st.just(None)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_matches_matmul_and_writes_only_x(device, data):
    x, w, bias, transpose, workspace = data.draw(square_matmul_calls(device))
    route = data.draw(routes(device))
    expected = reference(x, w, bias, transpose)
    target = Guarded(x)
    inputs = [t.clone() for t in (w, bias) if t is not None]
    with forced_route(route):
        out = make_inplace.square_matmul_(target.tensor, w, bias, transpose=transpose, workspace_bytes=workspace)
    assert out is target.tensor
    if x.numel():
        assert relative_error(out, expected) < TOL[x.dtype], (relative_error(out, expected), route)
    assert target.intact()
    assert all(same_bytes(a, b) for a, b in zip([t for t in (w, bias) if t is not None], inputs))


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_gradients_match_torch(device, data):
    dtype = data.draw(st.sampled_from([torch.float64, torch.float32]))
    x, w, bias, transpose, workspace = data.draw(square_matmul_calls(device, dtype))
    gen = torch.Generator().manual_seed(data.draw(seeds))
    grad = randn(x.shape, dtype, device, gen)
    leaf = x.clone().requires_grad_()
    b = None if bias is None else bias.clone().requires_grad_()
    make_inplace.square_matmul_(leaf * 1.0, w, b, transpose=transpose, workspace_bytes=workspace).backward(grad)
    ref_leaf = x.double().requires_grad_()
    ref_b = None if bias is None else bias.double().requires_grad_()
    reference(ref_leaf, w, ref_b, transpose).backward(grad.double())
    if x.numel():
        assert relative_error(leaf.grad, ref_leaf.grad) < TOL[dtype]
        if b is not None:
            assert relative_error(b.grad, ref_b.grad) < TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_inplace_linear_matches_nn_linear(device, data):
    mode = data.draw(st.sampled_from(["no_grad", "frozen weight", "trainable weight"]))
    dtype = None if mode == "no_grad" else data.draw(st.sampled_from([torch.float64, torch.float32]))
    x, w, bias, _, _ = data.draw(square_matmul_calls(device, dtype))
    n = x.shape[-1]
    ours = InplaceLinear(n, bias=bias is not None, device=device, dtype=x.dtype)
    ref = torch.nn.Linear(n, n, bias=bias is not None, device=device, dtype=torch.float64)
    with torch.no_grad():
        for module in (ours, ref):
            module.weight.copy_(w)
            if bias is not None:
                module.bias.copy_(bias)
    ours.weight.requires_grad_(mode == "trainable weight")
    ref.weight.requires_grad_(mode == "trainable weight")
    leaf = x.clone().requires_grad_(mode != "no_grad")
    ref_leaf = x.double().requires_grad_(mode != "no_grad")
    with torch.set_grad_enabled(mode != "no_grad"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the once-per-module out-of-place warning
        inp = leaf * 1.0 if leaf.requires_grad else leaf
        y = ours(inp)
        expected = ref(ref_leaf)
    # In place exactly when autograd allows it: no grad, or a frozen weight.
    assert (y is inp) == (mode != "trainable weight")
    if x.numel():
        assert relative_error(y, expected) < TOL[x.dtype]
    if mode == "no_grad":
        return
    gen = torch.Generator().manual_seed(data.draw(seeds))
    grad = randn(x.shape, x.dtype, device, gen)
    y.backward(grad)
    expected.backward(grad.double())
    pairs = [(leaf.grad, ref_leaf.grad)] + [(p.grad, q.grad) for p, q in zip(ours.parameters(), ref.parameters())
                                            if q.requires_grad]
    for ours_grad, ref_grad in pairs:
        if ref_grad.numel() and ref_grad.abs().max() > 0:
            assert relative_error(ours_grad, ref_grad) < TOL[x.dtype]
