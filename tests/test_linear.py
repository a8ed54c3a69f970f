"""InplaceLinear against torch.nn.Linear(n, n) with the same weights."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import make_inplace
from make_inplace.nn import InplaceLinear

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _pair(n: int, bias: bool, device: str, dtype: torch.dtype) -> tuple[torch.nn.Linear, InplaceLinear]:
    ref = torch.nn.Linear(n, n, bias=bias, device=device, dtype=dtype)
    ours = InplaceLinear(n, bias=bias, device=device, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def test_same_parameters_and_state_dict_as_linear():
    ref = torch.nn.Linear(12, 12)
    ours = InplaceLinear(12)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in ref.named_parameters()]
    assert InplaceLinear(12, bias=False).bias is None
    # Loads into a plain Linear too.
    torch.nn.Linear(12, 12).load_state_dict(ours.state_dict())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 8), (3, 33, 8), (0, 8)])
def test_no_grad_forward_in_place_matches_linear(device, dtype, bias, shape):
    n = shape[-1]
    ref, ours = _pair(n, bias, device, dtype)
    x = torch.randn(shape, device=device, dtype=dtype)
    expected = F.linear(x.double(), ref.weight.double(), None if ref.bias is None else ref.bias.double())
    ptr, version = x.data_ptr(), x._version
    with torch.no_grad():
        y = ours(x)
    assert y is x and y.data_ptr() == ptr
    assert x._version > version
    torch.testing.assert_close(y.double(), expected, rtol=TOL[dtype], atol=TOL[dtype])


def test_trainable_weight_runs_out_of_place_with_one_warning_and_matches_grads():
    torch.manual_seed(0)
    ref, ours = _pair(8, True, "cpu", torch.float64)
    x = torch.randn(5, 8, dtype=torch.float64)
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    with pytest.warns(UserWarning, match="out of place"):
        y = ours(x_ours)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours(x_ours)  # once per module
    assert y.data_ptr() != x_ours.data_ptr()
    torch.testing.assert_close(x_ours.detach(), x)
    g = torch.randn(5, 8, dtype=torch.float64)
    ref(x_ref).backward(g)
    y.backward(g)
    torch.testing.assert_close(x_ours.grad, x_ref.grad)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad)
    torch.testing.assert_close(ours.bias.grad, ref.bias.grad)


def test_frozen_weight_in_place_with_grads_for_input_and_bias():
    torch.manual_seed(1)
    ref, ours = _pair(8, True, "cpu", torch.float64)
    for layer in (ref, ours):
        layer.weight.requires_grad_(False)
    leaf_ref = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    leaf_ours = leaf_ref.detach().clone().requires_grad_()
    h = leaf_ours * 2  # a non-leaf buffer no backward reads
    ptr = h.data_ptr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ours(h)
    assert y.data_ptr() == ptr
    g = torch.randn(4, 8, dtype=torch.float64)
    ref(leaf_ref * 2).backward(g)
    y.backward(g)
    torch.testing.assert_close(leaf_ours.grad, leaf_ref.grad)
    torch.testing.assert_close(ours.bias.grad, ref.bias.grad)


def test_overwriting_a_tensor_autograd_saved_is_caught():
    ours = InplaceLinear(8, dtype=torch.float64).requires_grad_(False)
    a = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    h = a.exp()  # exp's backward reads its output h
    y = ours(h)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_non_contiguous_input_is_refused_and_left_unchanged():
    ours = InplaceLinear(8)
    x = torch.randn(8, 6).t()
    before = x.clone()
    with torch.no_grad(), pytest.raises(RuntimeError, match="x must be contiguous"):
        ours(x)
    torch.testing.assert_close(x, before)


def test_exported():
    assert make_inplace.nn.InplaceLinear is InplaceLinear


AUTOCAST = [("cpu", torch.bfloat16), pytest.param("cuda", torch.float16, marks=CUDA), pytest.param("cuda", torch.bfloat16, marks=CUDA)]


@pytest.mark.parametrize("device, amp", AUTOCAST)
@pytest.mark.parametrize("bias", [True, False])
def test_autocast_follows_linears_dtype(device, amp, bias):
    """Under torch.autocast: an input in the autocast dtype is overwritten with
    the result (weight and bias cast as autocast casts them); a float32 input is
    left alone and the result is new, in the autocast dtype, as nn.Linear's."""
    torch.manual_seed(3)
    ref, ours = _pair(48, bias, device, torch.float32)
    ours.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no out-of-place warning: the weight is not trained here
        for x in (torch.randn(5, 48, device=device, dtype=amp), torch.randn(5, 48, device=device)):
            before = x.clone()
            with torch.no_grad(), torch.autocast(device, dtype=amp):
                expected = ref(x)
                y = ours(x)
            assert y.dtype == expected.dtype == amp
            torch.testing.assert_close(y, expected, rtol=TOL[amp], atol=TOL[amp])
            if x.dtype == amp:
                assert y.data_ptr() == x.data_ptr()
            else:
                assert torch.equal(x, before)
