"""rms_norm_ against torch.nn.functional.rms_norm (float64 reference), autograd, errors, memory."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import make_inplace
from conftest import launch_orders

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
# Outputs are O(|weight|) values; half types round them to their own precision.
ATOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
# On sm_90, 16-bit and float32 rows of 16-byte vectors longer than the
# register fast path holds (16384 columns) are staged in shared memory
# (65536; see STAGED_WIDTHS); 65537 takes the CTA-per-row kernel, odd widths
# the unvectorized one.
WIDTHS = [1, 2, 31, 32, 33, 1000, 1025, 4096, 4097, 65536, 65537]
op = torch.ops.make_inplace


def rows_for(width: int) -> int:
    return 37 if width <= 4097 else 3


def reference(x, shape, weight=None, eps=None):
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    return F.rms_norm(x.double(), shape, None if weight is None else weight.double(), eps)


def assert_close(result, expected, dtype):
    torch.testing.assert_close(result.double(), expected.double(), rtol=TOL[dtype], atol=ATOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS + [pytest.param(262144, marks=CUDA)])
@pytest.mark.parametrize("weighted", [False, True])
def test_widths_match_torch(device, dtype, width, weighted):
    if width == 262144 and device == "cpu":
        pytest.skip("262144 runs on CUDA only (CPU budget)")
    x = torch.randn(rows_for(width), width, device=device, dtype=dtype) * 3 + 1.5
    w = torch.randn(width, device=device, dtype=dtype) if weighted else None
    expected = reference(x, (width,), w)
    ptr = x.data_ptr()
    y = make_inplace.rms_norm_(x, width, w)
    assert y is x and x.data_ptr() == ptr
    assert_close(x, expected, dtype)


# Register rows over 2-4 warps of two 16-byte vectors a thread (float32 512
# and 1024 columns, 16-bit 1024) beside rows that stay one warp's (768 and
# float32 1000 columns).
@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [512, 768, 1000, 1024])
def test_cuda_rows_over_warps_match_torch(dtype, width):
    x = torch.randn(1000, width, device="cuda", dtype=dtype) * 3 + 1.5
    x[0] = 0  # a zero row: rstd from eps alone
    w = torch.randn(width, device="cuda", dtype=dtype)
    expected = reference(x, (width,), w)
    make_inplace.rms_norm_(x, width, w)
    assert_close(x, expected, dtype)


# Staged rows (sm_90, 16-bit and float32): one CTA per row at 1-3 slots of
# 32 KiB (a last piece cut short at 40008), a 2-CTA cluster splitting rows of
# four or more slots (65536, 73744 with halves ending short, 98304) and rows
# too long for one ring (float32 65536 and up), clusters of 4 and 8 for rows
# of up to 8 rings (163840, 270336: parts ending short); more rows than the
# persistent grid has CTAs, and a single row.
STAGED_WIDTHS = [16392, 24576, 40008, 65536, 73744, 98304, 163840, 270336]


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", STAGED_WIDTHS)
@pytest.mark.parametrize("rows", [1, 1500])
@pytest.mark.parametrize("weighted", [False, True])
def test_cuda_staged_rows_match_torch(dtype, width, rows, weighted):
    x = torch.randn(rows, width, device="cuda", dtype=dtype) * 3 + 1.5
    w = torch.randn(width, device="cuda", dtype=dtype) if weighted else None
    expected = reference(x, (width,), w)
    make_inplace.rms_norm_(x, width, w)
    assert_close(x, expected, dtype)


@CUDA
@pytest.mark.fresh_process
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("order", ["increasing", "decreasing", "alternating"])
def test_cuda_widths_in_any_order(dtype, order):
    # Register, staged (one CTA, clusters of 2 to 8) and CTA-per-row widths, in
    # every order: a kernel's launch limits must hold whatever widths ran before.
    for width in launch_orders([1024, 16384, 24576, 40008, 65536, 98304, 262144, 1048576])[order]:
        x = torch.randn(64 if width < 262144 else 8, width, device="cuda", dtype=dtype) * 3 + 1.5
        w = torch.randn(width, device="cuda", dtype=dtype)
        expected = reference(x, (width,), w)
        make_inplace.rms_norm_(x, width, w)
        assert_close(x, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_eps_none_is_finfo_eps_as_torch(device, dtype):
    # Tiny rows: the mean square is of the order of eps, so eps's value shows.
    x = torch.randn(9, 64, device=device, dtype=dtype) * torch.finfo(dtype).eps ** 0.5
    expected = F.rms_norm(x.double(), (64,), None, torch.finfo(dtype).eps)
    wrong = F.rms_norm(x.double(), (64,), None, 1e-6)
    make_inplace.rms_norm_(x, 64)
    assert_close(x, expected, dtype)
    assert not torch.allclose(expected, wrong, rtol=TOL[dtype], atol=ATOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape,norm_shape", [((4, 5, 6, 7), (6, 7)), ((3, 33, 31), (33, 31)), ((2, 3, 4), (4,))])
def test_trailing_dims_and_eps(device, dtype, x_shape, norm_shape):
    x = torch.randn(x_shape, device=device, dtype=dtype)
    w = torch.randn(norm_shape, device=device, dtype=dtype)
    expected = reference(x, norm_shape, w, eps=1e-3)
    make_inplace.rms_norm_(x, norm_shape, w, eps=1e-3)
    assert_close(x, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_stats_match_torch(device, dtype):
    x = torch.randn(5, 7, 300, device=device, dtype=dtype)
    expected = torch.rsqrt(x.double().pow(2).mean(-1) + 1e-5)
    rstd = op.rms_norm_stats_(x, [300], None, 1e-5)
    stat = torch.float64 if dtype == torch.float64 else torch.float32
    assert rstd.dtype == stat and rstd.shape == (5, 7)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(rstd.double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    for shape in [(0, 5), (3, 0)]:
        x = torch.randn(shape, device=device)
        make_inplace.rms_norm_(x, shape[-1])
        assert x.shape == shape


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(4, 3, 9, device=device)
    w = torch.randn(3, 9, device=device)
    torch.library.opcheck(op.rms_norm_.default, (x, [3, 9], w, 1e-5))
    torch.library.opcheck(op.rms_norm_.default, (torch.randn(4, 9, device=device), [9]))
    torch.library.opcheck(op.rms_norm_stats_.default, (x, [9], w[0], None))
    y = F.rms_norm(torch.randn(4, 3, 9, device=device), (3, 9), w)
    rstd = op.rms_norm_stats_(torch.randn(4, 3, 9, device=device), [3, 9], w, None)
    torch.library.opcheck(op.rms_norm_backward.default, (torch.randn_like(y), y, [3, 9], w, rstd, [True, True]))
    torch.library.opcheck(op.rms_norm_backward.default, (torch.randn_like(y), y, [3, 9], None, rstd, [True, False]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_shape", [(7,), (3, 7)])
@pytest.mark.parametrize("weighted", [False, True])
def test_gradcheck(device, norm_shape, weighted):
    x = torch.randn((4,) + norm_shape, device=device, dtype=torch.float64, requires_grad=True)
    params = (torch.randn(norm_shape, device=device, dtype=torch.float64, requires_grad=True),) if weighted else ()

    def fn(x, *p):
        return make_inplace.rms_norm_(x.clone(), norm_shape, p[0] if p else None, 1e-5)

    assert torch.autograd.gradcheck(fn, (x,) + params)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,norm_shape", [((37, 1025), (1025,)), ((3, 4097), (4097,)), ((6, 4, 33), (4, 33)), ((50, 32), (32,))])
def test_grads_match_torch(device, dtype, shape, norm_shape):
    base = torch.randn(shape, device=device, dtype=dtype)
    # |w| >= 0.5: x_hat is rebuilt as y / w, so y's rounding is amplified by 1/|w| (documented).
    sign = torch.randint(0, 2, norm_shape, device=device) * 2 - 1
    w0 = (sign * (0.5 + torch.rand(norm_shape, device=device))).to(dtype)
    grad = torch.randn(shape, device=device, dtype=dtype)
    grad_before = grad.clone()
    leaf, w = (t.clone().requires_grad_() for t in (base, w0))
    make_inplace.rms_norm_(leaf * 1.0, norm_shape, w, 1e-5).backward(grad)
    rl, rw = (t.double().requires_grad_() for t in (base, w0))
    F.rms_norm(rl, norm_shape, rw, 1e-5).backward(grad.double())
    for ours, ref in [(leaf.grad, rl.grad), (w.grad, rw.grad)]:
        scale = ref.abs().max().item() + 1
        tol = TOL[dtype] * 4 if dtype in (torch.float16, torch.bfloat16) else TOL[dtype] * 10
        torch.testing.assert_close(ours.double() / scale, ref / scale, rtol=tol, atol=tol)
    assert torch.equal(grad, grad_before)  # grad_output never overwritten


def test_weight_clamp_keeps_grads_finite():
    x = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64)
    w[3] = 0.0  # x_hat of feature 3 cannot be rebuilt from y
    w.requires_grad_()
    make_inplace.rms_norm_(x * 1.0, 16, w).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all()
    assert w.grad[3] == 0
    rx, rw = (t.detach().clone().requires_grad_() for t in (x, w))
    F.rms_norm(rx, (16,), rw, torch.finfo(torch.float64).eps).pow(2).sum().backward()
    keep = torch.ones(16, dtype=torch.bool)
    keep[3] = False
    torch.testing.assert_close(w.grad[keep], rw.grad[keep])
    torch.testing.assert_close(x.grad[:, keep], rx.grad[:, keep])


def test_saves_no_copy_of_x():
    saved = []
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        h = x * 2.0  # saves nothing
        y = make_inplace.rms_norm_(h, 8, w)
    big = [t for t in saved if t.numel() == y.numel()]
    assert len(big) == 1 and big[0].data_ptr() == y.data_ptr()
    assert sum(t.numel() for t in saved) == y.numel() + 8 + 4  # y, weight, rstd


def test_version_counter_and_misuse_raises():
    x = torch.randn(3, 4)
    v0 = x._version
    op.rms_norm_(x, [4])
    assert x._version > v0
    v1 = x._version
    op.rms_norm_stats_(x, [4])
    assert x._version > v1
    a = torch.randn(3, 4, requires_grad=True)
    h = a * 1.0
    z = h * h
    make_inplace.rms_norm_(h, 4)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()
    h2 = a * 1.0
    y = make_inplace.rms_norm_(h2, 4)
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_leaf_requiring_grad_raises():
    x = torch.randn(3, 4, requires_grad=True)
    before = x.detach().clone()
    with pytest.raises(RuntimeError, match="leaf Variable"):
        make_inplace.rms_norm_(x, 4)
    assert torch.equal(x.detach(), before)


def _bad_calls(device):
    x = torch.randn(4, 6, device=device)
    w6 = torch.randn(6, device=device)
    yield "normalized_shape \\[5\\] must equal the last 1 dim", lambda t: op.rms_norm_(t, [5]), (x,)
    yield "normalized_shape must have at least one dim", lambda t: op.rms_norm_(t, []), (x,)
    yield "x must have dtype", lambda t: op.rms_norm_(t, [3]), (torch.arange(6, device=device).reshape(2, 3),)
    yield "x must be contiguous", lambda t: op.rms_norm_(t, [4]), (torch.randn(4, 6, device=device).t(),)
    yield "weight must have shape", lambda t, w: op.rms_norm_(t, [6], w), (x, torch.randn(5, device=device))
    yield "weight must have the same dtype", lambda t, w: op.rms_norm_(t, [6], w), (x, w6.double())
    yield "weight must be contiguous", lambda t, w: op.rms_norm_(t, [2, 3], w), (torch.randn(4, 2, 3, device=device), torch.randn(3, 2, device=device).t())
    shared = torch.randn(5, 6, device=device)
    yield "weight must not share memory with x", lambda t, w: op.rms_norm_(t, [6], w), (shared[:4], shared[3])
    yield "eps must be >= 0", lambda t: op.rms_norm_(t, [6], None, -1.0), (x,)
    yield "rstd must have dtype", lambda g, y: op.rms_norm_backward(g, y, [6], None, torch.ones(4, dtype=torch.float64, device=device), [True, False]), (x, x.clone())
    yield "rstd must be contiguous with one value per row", lambda g, y: op.rms_norm_backward(g, y, [6], None, torch.ones(3, device=device), [True, False]), (x, x.clone())
    yield "grad_output must have output's shape", lambda g, y: op.rms_norm_backward(g, y, [6], None, torch.ones(4, device=device), [True, False]), (torch.randn(4, 5, device=device), x)
    if device == "cuda":
        # torch.ops reaches the CUDA kernel, whose C++ check names the op, both arguments and the fix.
        yield (rf"^make_inplace\.rms_norm_: weight must be on the same device as x \({re.escape(str(x.device))}\), "
               rf"got cpu; move it with \.to\(x\.device\)"), lambda t, w: op.rms_norm_(t, [6], w), (x, torch.randn(6))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise_and_change_nothing(device):
    for match, call, tensors in _bad_calls(device):
        before = [t.clone() for t in tensors]
        with pytest.raises((RuntimeError, ValueError, TypeError), match=match):
            call(*tensors)
            print("did not raise:", match)
        assert all(torch.equal(t, b) for t, b in zip(tensors, before)), match


def test_exported():
    assert "rms_norm_" in make_inplace.__all__ and make_inplace.rms_norm_ is make_inplace.ops.rms_norm_


# --- CUDA only: memory ------------------------------------------------------------


@CUDA
# Every x is >= 10 MiB: a smaller one sits in an allocator segment whose free
# rest would hold torch's output, hiding its allocation.
@pytest.mark.parametrize("shape,weighted", [((4096, 4096), True), ((1 << 20, 32), False), ((32, 262144), True)])
def test_cuda_forward_allocates_nothing(shape, weighted):
    import gc

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(shape[-1], device="cuda", dtype=torch.bfloat16) if weighted else None

    def peak(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        a0, r0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        out = fn()
        torch.cuda.synchronize()
        result = torch.cuda.max_memory_allocated() - a0, torch.cuda.max_memory_reserved() - r0
        del out
        return result

    assert peak(lambda: make_inplace.rms_norm_(x, shape[-1], w)) == (0, 0)
    allocated, reserved = peak(lambda: F.rms_norm(x, (shape[-1],), w))
    assert allocated >= x.nbytes and reserved >= x.nbytes
