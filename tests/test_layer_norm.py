"""layer_norm_ against torch.nn.functional.layer_norm (float64 reference), autograd, errors, memory."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import make_inplace
from make_inplace.nn import InplaceLayerNorm
from make_inplace._measure import cuda_peak_extra, fresh_cuda_memory
from conftest import launch_orders

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
# Outputs are O(1) normalized values; half types round them to their own precision.
ATOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
WIDTHS = [1, 2, 31, 32, 33, 1000, 1025, 4097, 65537]
op = torch.ops.make_inplace


def rows_for(width: int) -> int:
    return 37 if width <= 1025 else 3


def reference(x, shape, weight=None, bias=None, eps=1e-5):
    w = None if weight is None else weight.double()
    b = None if bias is None else bias.double()
    return F.layer_norm(x.double(), shape, w, b, eps)


def assert_close(result, expected, dtype):
    torch.testing.assert_close(result.double(), expected.double(), rtol=TOL[dtype], atol=ATOL[dtype])


def affine(shape, device, dtype, kind):
    if kind == "none":
        return None, None
    w = torch.randn(shape, device=device, dtype=dtype)
    b = torch.randn(shape, device=device, dtype=dtype)
    return {"weight": (w, None), "bias": (None, b)}.get(kind, (w, b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS + [pytest.param(262144, marks=CUDA)])
@pytest.mark.parametrize("kind", ["none", "affine"])
def test_widths_match_torch(device, dtype, width, kind):
    if width == 262144 and device == "cpu":
        pytest.skip("262144 runs on CUDA only (CPU budget)")
    x = torch.randn(rows_for(width), width, device=device, dtype=dtype) * 3 + 1.5
    w, b = affine((width,), device, dtype, kind)
    expected = reference(x, (width,), w, b)
    ptr = x.data_ptr()
    y = make_inplace.layer_norm_(x, width, w, b)
    assert y is x and x.data_ptr() == ptr
    assert_close(x, expected, dtype)


# Long rows on sm_90: 16-bit and float32 rows of up to 16384 columns take the
# register kernel (packed at 32 elements per thread); longer ones, and float64
# rows of 32 KiB and more, the staged kernel (staged_rows.cuh): widths needing
# 1 to 5 slots of 32 KiB depending on the dtype, a last piece cut short
# (40008), and more rows than the persistent grid has CTAs. Rows of 4+ slots
# whose halves fit a ring, and rows too long for one ring, are split over a
# cluster of 2, 4 or 8 CTAs that combine their parts' moments: 65536, 73744
# (halves with a short last piece) and 98304 in halves, 163840 in halves
# (16-bit) or quarters (float32), 270336 in quarters (16-bit) or eighths
# (float32), parts ending in a short piece; float64 rows too long for a ring
# stream through global memory. The four weight/bias
# combinations are four kernels; rows offset far from zero check the one-pass
# moments and the shifted statistics.
STAGED_WIDTHS = [4096, 8192, 16384, 24576, 40008, 65536, 73744, 98304, 163840, 270336]


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", STAGED_WIDTHS)
@pytest.mark.parametrize("rows", [1, 1500])
@pytest.mark.parametrize("kind", ["none", "weight", "bias", "affine"])
@pytest.mark.parametrize("offset", [1.5, 1000.0])
def test_cuda_staged_rows_match_torch(dtype, width, rows, kind, offset):
    if offset != 1.5 and (rows != 1500 or kind != "affine"):
        pytest.skip("far-from-zero rows: one case per dtype and width")
    x = torch.randn(rows, width, device="cuda", dtype=dtype) * 3 + offset
    w, b = affine((width,), "cuda", dtype, kind)
    expected = reference(x, (width,), w, b)
    _, mean_ref, rstd_ref = torch.ops.aten.native_layer_norm(x.double(), [width], None, None, 1e-5)
    mean, rstd = op.layer_norm_stats_(x, [width], w, b, 1e-5)
    assert_close(x, expected, dtype)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(mean.double(), mean_ref.reshape(rows), rtol=tol, atol=tol)
    torch.testing.assert_close(rstd.double(), rstd_ref.reshape(rows), rtol=tol, atol=tol)


# Rows held in registers (16-byte vectors, up to 16384 columns): sub-warp,
# warp and CTA-wide rows, 16-bit rows kept packed (32 elements per thread at
# 1024 and 16384), each weight/bias kernel path, and rows far from zero for
# the statistics taken about the row's first element.
REGISTER_WIDTHS = [8, 32, 128, 1024, 4096, 16384]


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", REGISTER_WIDTHS)
@pytest.mark.parametrize("kind", ["none", "weight", "bias", "affine"])
@pytest.mark.parametrize("offset", [1.5, 1000.0])
def test_cuda_register_rows_match_torch(dtype, width, kind, offset):
    rows = 1000 if width <= 1024 else 70
    x = torch.randn(rows, width, device="cuda", dtype=dtype) * 3 + offset
    x[0] = offset  # a constant row: variance 0, every deviation from the first element 0
    x[1, 0] += 40  # an outlier first element: the shift far from the mean
    w, b = affine((width,), "cuda", dtype, kind)
    expected = reference(x, (width,), w, b)
    _, mean_ref, rstd_ref = torch.ops.aten.native_layer_norm(x.double(), [width], None, None, 1e-5)
    mean, rstd = op.layer_norm_stats_(x, [width], w, b, 1e-5)
    assert_close(x, expected, dtype)
    torch.testing.assert_close(mean.double(), mean_ref.reshape(rows), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd.double(), rstd_ref.reshape(rows), rtol=1e-5, atol=1e-5)


# float32 register rows over 2-4 warps of two 16-byte vectors a thread (512
# and 1024 columns) beside rows that stay one warp's (768 and 1000 columns,
# and 16-bit rows, kept packed); a constant row and rows far from zero for the
# second pass's CTA-wide vote.
@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [512, 768, 1000, 1024])
def test_cuda_rows_over_warps_match_torch(dtype, width):
    x = torch.randn(1000, width, device="cuda", dtype=dtype) * 3 + 1000.0
    x[0] = 1000.0
    x[1, 0] += 40
    w, b = affine((width,), "cuda", dtype, "affine")
    expected = reference(x, (width,), w, b)
    make_inplace.layer_norm_(x, (width,), w, b)
    assert_close(x, expected, dtype)


# 16-bit rows of up to 64 vectors are walked row after row by each thread
# group (short_rows.cuh): more rows than the resident grid holds at once, a
# last warp partly past the end, partial groups of vectors (24, 136), and a
# constant row and an outlier first element far from zero near the end.
@CUDA
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [8, 24, 32, 128, 136, 512])
@pytest.mark.parametrize("kind", ["none", "affine"])
@pytest.mark.parametrize("offset", [1.5, 1000.0])
def test_cuda_walked_rows_match_torch(dtype, width, kind, offset):
    rows = 150_001
    x = torch.randn(rows, width, device="cuda", dtype=dtype) * 3 + offset
    x[-1] = offset
    x[-2, 0] += 40
    w, b = affine((width,), "cuda", dtype, kind)
    expected = reference(x, (width,), w, b)
    _, mean_ref, rstd_ref = torch.ops.aten.native_layer_norm(x.double(), [width], None, None, 1e-5)
    mean, rstd = op.layer_norm_stats_(x, [width], w, b, 1e-5)
    assert_close(x, expected, dtype)
    torch.testing.assert_close(mean.double(), mean_ref.reshape(rows), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd.double(), rstd_ref.reshape(rows), rtol=1e-5, atol=1e-5)


# Register rows (1024, 4096, 16384), staged rows of one CTA and of clusters of
# 2 to 8 (24576 to 262144) and two-pass rows (1048576), in every order: a
# kernel's launch limits must hold whatever widths ran before.
ORDER_WIDTHS = [1024, 4096, 16384, 24576, 40008, 65536, 98304, 262144, 1048576]


@CUDA
@pytest.mark.fresh_process
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("order", ["increasing", "decreasing", "alternating"])
def test_cuda_widths_in_any_order(dtype, order):
    for width in launch_orders(ORDER_WIDTHS)[order]:
        x = torch.randn(64 if width < 262144 else 8, width, device="cuda", dtype=dtype) * 3 + 1.5
        w, b = affine((width,), "cuda", dtype, "affine")
        expected = reference(x, (width,), w, b)
        make_inplace.layer_norm_(x, width, w, b)
        assert_close(x, expected, dtype)


@CUDA
@pytest.mark.fresh_process
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cuda_width_returns_after_a_narrower_staged_row(dtype):
    """65536, 40008, 65536 columns, first thing in a process: the third call
    once failed with "invalid argument" (the second had lowered the
    shared-memory limit the first had set for the same kernel)."""
    for width in (65536, 40008, 65536):
        x = torch.randn(1500, width, device="cuda", dtype=dtype) * 3 + 1.5
        w, b = affine((width,), "cuda", dtype, "affine")
        expected = reference(x, (width,), w, b)
        make_inplace.layer_norm_(x, width, w, b)
        assert_close(x, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape,norm_shape", [((4, 5, 6, 7), (6, 7)), ((3, 33, 31), (33, 31)), ((2, 3, 4), (4,)), ((5, 128, 9), (128, 9))])
@pytest.mark.parametrize("kind", ["none", "weight", "affine"])
def test_trailing_dims(device, dtype, x_shape, norm_shape, kind):
    x = torch.randn(x_shape, device=device, dtype=dtype)
    w, b = affine(norm_shape, device, dtype, kind)
    expected = reference(x, norm_shape, w, b, eps=1e-3)
    make_inplace.layer_norm_(x, norm_shape, w, b, eps=1e-3)
    assert_close(x, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_bias_only_and_large_mean(device):
    x = torch.randn(6, 300, device=device, dtype=torch.float32) + 1e3  # large offset: no cancellation
    b = torch.randn(300, device=device)
    expected = reference(x, (300,), None, b)
    make_inplace.layer_norm_(x, 300, None, b)
    assert_close(x, expected, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_stats_match_torch(device, dtype):
    x = torch.randn(5, 7, 300, device=device, dtype=dtype)
    _, mean_ref, rstd_ref = torch.ops.aten.native_layer_norm(x.double(), [300], None, None, 1e-5)
    mean, rstd = op.layer_norm_stats_(x, [300], None, None, 1e-5)
    stat = torch.float64 if dtype == torch.float64 else torch.float32
    assert mean.dtype == stat and rstd.dtype == stat and mean.shape == (5, 7)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(mean.double(), mean_ref.reshape(5, 7), rtol=tol, atol=tol)
    torch.testing.assert_close(rstd.double(), rstd_ref.reshape(5, 7), rtol=tol, atol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    for shape in [(0, 5), (3, 0)]:
        x = torch.randn(shape, device=device)
        make_inplace.layer_norm_(x, shape[-1])
        assert x.shape == shape


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(4, 3, 9, device=device)
    w, b = torch.randn(3, 9, device=device), torch.randn(3, 9, device=device)
    torch.library.opcheck(op.layer_norm_.default, (x, [3, 9], w, b, 1e-5))
    torch.library.opcheck(op.layer_norm_.default, (torch.randn(4, 9, device=device), [9]))
    torch.library.opcheck(op.layer_norm_stats_.default, (x, [9], None, b[0], 1e-5))
    y = F.layer_norm(torch.randn(4, 3, 9, device=device), (3, 9), w, b)
    _, rstd = op.layer_norm_stats_(torch.randn(4, 3, 9, device=device), [3, 9], w, b, 1e-5)
    torch.library.opcheck(op.layer_norm_backward.default, (torch.randn_like(y), y, [3, 9], w, b, rstd, [True, True, True]))
    torch.library.opcheck(op.layer_norm_backward.default, (torch.randn_like(y), y, [3, 9], None, None, rstd, [True, False, False]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_shape", [(7,), (3, 7)])
@pytest.mark.parametrize("kind", ["none", "weight", "affine"])
def test_gradcheck(device, norm_shape, kind):
    x = torch.randn((4,) + norm_shape, device=device, dtype=torch.float64, requires_grad=True)
    w, b = affine(norm_shape, device, torch.float64, kind)
    params = tuple(t.requires_grad_() for t in (w, b) if t is not None)

    def fn(x, *p):
        weight = p[0] if len(p) > 0 else None
        bias = p[1] if len(p) > 1 else None
        return make_inplace.layer_norm_(x.clone(), norm_shape, weight, bias)

    assert torch.autograd.gradcheck(fn, (x,) + params)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,norm_shape", [((37, 1025), (1025,)), ((3, 4097), (4097,)), ((6, 4, 33), (4, 33)), ((50, 32), (32,))])
def test_grads_match_torch(device, dtype, shape, norm_shape):
    base = torch.randn(shape, device=device, dtype=dtype)
    # |w| >= 0.5: x_hat is rebuilt as (y - b) / w, so y's rounding error is
    # amplified by 1/|w| (documented); small weights are covered in float64 below.
    sign = torch.randint(0, 2, norm_shape, device=device) * 2 - 1
    w0 = (sign * (0.5 + torch.rand(norm_shape, device=device))).to(dtype)
    b0 = torch.randn(norm_shape, device=device, dtype=dtype)
    grad = torch.randn(shape, device=device, dtype=dtype)
    grad_before = grad.clone()
    leaf, w, b = (t.clone().requires_grad_() for t in (base, w0, b0))
    y = make_inplace.layer_norm_(leaf * 1.0, norm_shape, w, b)
    y.backward(grad)
    rl, rw, rb = (t.double().requires_grad_() for t in (base, w0, b0))
    F.layer_norm(rl, norm_shape, rw, rb).backward(grad.double())
    # Grads are sums over a row / over rows: scale the tolerance by their magnitude.
    for ours, ref in [(leaf.grad, rl.grad), (w.grad, rw.grad), (b.grad, rb.grad)]:
        scale = ref.abs().max().item() + 1
        tol = TOL[dtype] * 4 if dtype in (torch.float16, torch.bfloat16) else TOL[dtype] * 10
        torch.testing.assert_close(ours.double() / scale, ref / scale, rtol=tol, atol=tol)
    assert torch.equal(grad, grad_before)  # grad_output never overwritten


def test_weight_clamp_keeps_grads_finite():
    x = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64)
    w[3] = 0.0  # x_hat of feature 3 cannot be rebuilt from y
    w.requires_grad_()
    b = torch.randn(16, dtype=torch.float64, requires_grad=True)
    make_inplace.layer_norm_(x * 1.0, 16, w, b).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all()
    assert w.grad[3] == 0  # the documented effect: lost x_hat -> zero weight grad there
    rx, rw, rb = (t.detach().clone().requires_grad_() for t in (x, w, b))
    F.layer_norm(rx, (16,), rw, rb).pow(2).sum().backward()
    keep = torch.ones(16, dtype=torch.bool)
    keep[3] = False
    torch.testing.assert_close(w.grad[keep], rw.grad[keep])
    torch.testing.assert_close(b.grad, rb.grad)
    # Other features are exact (feature 3 adds dy * w * x_hat = 0 to the row sums
    # either way); feature 3's own grad_input misses its x_hat term.
    torch.testing.assert_close(x.grad[:, keep], rx.grad[:, keep])
    assert not torch.allclose(x.grad[:, 3], rx.grad[:, 3])


def test_saves_no_copy_of_x():
    saved = []
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        h = x * 2.0  # saves nothing
        y = make_inplace.layer_norm_(h, 8, w, b)
    big = [t for t in saved if t.numel() == y.numel()]
    assert len(big) == 1 and big[0].data_ptr() == y.data_ptr()
    assert sum(t.numel() for t in saved) == y.numel() + 8 + 8 + 4  # y, weight, bias, rstd


def test_version_counter_and_misuse_raises():
    x = torch.randn(3, 4)
    v0 = x._version
    op.layer_norm_(x, [4])
    assert x._version > v0
    v1 = x._version
    op.layer_norm_stats_(x, [4])
    assert x._version > v1
    a = torch.randn(3, 4, requires_grad=True)
    h = a * 1.0
    z = h * h
    make_inplace.layer_norm_(h, 4)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()
    # and the layer norm's own saved output, modified afterwards
    h2 = a * 1.0
    y = make_inplace.layer_norm_(h2, 4)
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_leaf_requiring_grad_raises():
    x = torch.randn(3, 4, requires_grad=True)
    before = x.detach().clone()
    with pytest.raises(RuntimeError, match="leaf Variable"):
        make_inplace.layer_norm_(x, 4)
    assert torch.equal(x.detach(), before)


def _bad_calls(device):
    x = torch.randn(4, 6, device=device)
    w6 = torch.randn(6, device=device)
    yield "normalized_shape \\[5\\] must equal the last 1 dim", lambda t: op.layer_norm_(t, [5]), (x,)
    yield "normalized_shape \\[4, 6, 1\\]", lambda t: op.layer_norm_(t, [4, 6, 1]), (x,)
    yield "normalized_shape must have at least one dim", lambda t: op.layer_norm_(t, []), (x,)
    yield "x must have dtype", lambda t: op.layer_norm_(t, [3]), (torch.arange(6, device=device).reshape(2, 3),)
    yield "x must be contiguous", lambda t: op.layer_norm_(t, [4]), (torch.randn(4, 6, device=device).t(),)
    yield "weight must have shape", lambda t, w: op.layer_norm_(t, [6], w), (x, torch.randn(5, device=device))
    yield "bias must have shape", lambda t, b: op.layer_norm_(t, [6], None, b), (x, torch.randn(6, 1, device=device))
    yield "weight must have the same dtype", lambda t, w: op.layer_norm_(t, [6], w), (x, w6.double())
    yield "bias must have the same dtype", lambda t, b: op.layer_norm_(t, [6], w6, b), (x, w6.half())
    yield "weight must be contiguous", lambda t, w: op.layer_norm_(t, [2, 3], w), (torch.randn(4, 2, 3, device=device), torch.randn(3, 2, device=device).t())
    shared = torch.randn(5, 6, device=device)
    yield "weight must not share memory with x", lambda t, w: op.layer_norm_(t, [6], w), (shared[:4], shared[3])
    yield "bias must not share memory with x", lambda t, b: op.layer_norm_(t, [6], None, b), (shared[:4], shared[0])
    yield "eps must be >= 0", lambda t: op.layer_norm_(t, [6], None, None, -1.0), (x,)
    yield "rstd must have dtype", lambda g, y: op.layer_norm_backward(g, y, [6], None, None, torch.ones(4, dtype=torch.float64, device=device), [True, False, False]), (x, x.clone())
    yield "rstd must be contiguous with one value per row", lambda g, y: op.layer_norm_backward(g, y, [6], None, None, torch.ones(3, device=device), [True, False, False]), (x, x.clone())
    yield "grad_output must have output's shape", lambda g, y: op.layer_norm_backward(g, y, [6], None, None, torch.ones(4, device=device), [True, False, False]), (torch.randn(4, 5, device=device), x)
    if device == "cuda":
        # torch.ops reaches the CUDA kernel, whose C++ check names the op, both arguments and the fix.
        yield (rf"^make_inplace\.layer_norm_: weight must be on the same device as x \({re.escape(str(x.device))}\), "
               rf"got cpu; move it with \.to\(x\.device\)"), lambda t, w: op.layer_norm_(t, [6], w), (x, torch.randn(6))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise_and_change_nothing(device):
    for match, call, tensors in _bad_calls(device):
        before = [t.clone() for t in tensors]
        with pytest.raises((RuntimeError, ValueError, TypeError), match=match):
            call(*tensors)
            print("did not raise:", match)
        assert all(torch.equal(t, b) for t, b in zip(tensors, before)), match


@pytest.mark.parametrize("device", DEVICES)
def test_module_matches_torch_and_loads_state(device):
    for kwargs in [{}, {"elementwise_affine": False}, {"bias": False}, {"eps": 1e-3}]:
        ref = torch.nn.LayerNorm((3, 8), device=device, **kwargs)
        with torch.no_grad():
            for p in ref.parameters():
                p.normal_()
        ours = InplaceLayerNorm((3, 8), device=device, **kwargs)
        assert list(ours.state_dict()) == list(ref.state_dict())
        ours.load_state_dict(ref.state_dict())
        ref.load_state_dict(ours.state_dict())
        x = torch.randn(5, 3, 8, device=device)
        expected = ref(x)
        assert ours(x) is x
        torch.testing.assert_close(x, expected)
    # training step: grads reach the parameters
    ours = InplaceLayerNorm(8, device=device)
    inp = torch.randn(4, 8, device=device, requires_grad=True)
    ours(inp * 1.0).pow(2).sum().backward()
    assert ours.weight.grad is not None and ours.bias.grad is not None and inp.grad is not None


# --- CUDA only: memory, streams -------------------------------------------------


@CUDA
# Every x is >= 10 MiB: a smaller one sits in a 20 MiB allocator segment whose
# free rest would hold torch's output, hiding its allocation (docs/memory.md).
@pytest.mark.parametrize("shape,affine_params", [((4096, 4096), True), ((1 << 20, 32), False), ((32, 262144), True)])
@pytest.mark.fresh_process
def test_cuda_forward_allocates_nothing(shape, affine_params):
    fresh_cuda_memory()
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(shape[-1], device="cuda", dtype=torch.bfloat16) if affine_params else None
    b = torch.randn(shape[-1], device="cuda", dtype=torch.bfloat16) if affine_params else None
    ours = cuda_peak_extra(lambda: make_inplace.layer_norm_(x, shape[-1], w, b))
    assert ours.reserved == 0 and ours.allocated == 0
    theirs = cuda_peak_extra(lambda: F.layer_norm(x, (shape[-1],), w, b))
    assert theirs.allocated >= x.nbytes and theirs.reserved >= x.nbytes


@CUDA
@pytest.mark.fresh_process
def test_cuda_forward_with_grad_needs_allocates_only_stats():
    fresh_cuda_memory()
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ours = cuda_peak_extra(lambda: make_inplace.layer_norm_(x, 4096, w))
    assert ours.allocated <= 2 * 8192 * 4 + 1024  # mean and rstd (float32 per row) only


@CUDA
@pytest.mark.fresh_process
def test_cuda_forward_backward_peak_below_torch():
    # Three blocks h <- layer_norm(h) @ W with trainable W, as in a transformer:
    # torch's layer norm saves its input h and the matmul saves the norm's output
    # y for W's grad (2 activations per block); ours saves only y, which is h
    # overwritten, and the matmul saves that same y (1 per block).
    rows, cols, blocks = 4096, 2048, 3
    activation = rows * cols * 2

    def run(use_ours: bool):
        fresh_cuda_memory()
        leaf = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        norms = [(torch.randn(cols, device="cuda", dtype=torch.bfloat16, requires_grad=True),
                  torch.randn(cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)) for _ in range(blocks)]
        mats = [(torch.randn(cols, cols, device="cuda", dtype=torch.bfloat16) / cols**0.5).requires_grad_()
                for _ in range(blocks)]
        params = [leaf, *[p for pair in norms for p in pair], *mats]

        def step():
            h = leaf.clone()  # its node saves nothing and passes grads through
            for (w, b), mat in zip(norms, mats):
                y = make_inplace.layer_norm_(h, cols, w, b) if use_ours else F.layer_norm(h, (cols,), w, b)
                h = y @ mat
            del y
            h.float().sum().backward()

        # One step first: cuBLAS's workspace for the backward matmuls is allocated
        # once per process and would otherwise land in whichever run goes first.
        step()
        for p in params:
            p.grad = None
        fresh_cuda_memory()
        peak = cuda_peak_extra(step)
        return peak.reserved, peak.allocated

    ours_r, ours_a = run(True)
    torch_r, torch_a = run(False)
    assert ours_a <= torch_a - activation, (ours_a, torch_a)
    assert ours_r <= torch_r - activation, (ours_r, torch_r)


@CUDA
def test_cuda_current_stream():
    x = torch.randn(512, 4096, device="cuda")
    expected = F.layer_norm(x, (4096,))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(3_000_000)
        make_inplace.layer_norm_(x, 4096)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(x, expected)


@pytest.mark.parametrize("device, amp", [("cpu", torch.bfloat16), pytest.param("cuda", torch.float16, marks=CUDA)])
@pytest.mark.parametrize("x_dtype", [torch.float32, "amp"])
def test_module_under_autocast_has_torchs_dtype(device, amp, x_dtype):
    """InplaceLayerNorm under torch.autocast: nn.LayerNorm's dtype and values; in
    place where that is x's dtype, else a new tensor and x untouched."""
    torch.manual_seed(8)
    ref = torch.nn.LayerNorm(40, device=device)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5), ref.bias.normal_()
    ours = InplaceLayerNorm(40, device=device)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(6, 40, device=device, dtype=amp if x_dtype == "amp" else x_dtype)
    before = x.clone()
    with torch.no_grad(), torch.autocast(device, dtype=amp):
        expected = ref(x)
        y = ours(x)
    assert y.dtype == expected.dtype
    tol = TOL[amp]
    torch.testing.assert_close(y, expected, rtol=tol, atol=tol)
    if y.dtype == x.dtype:
        assert y.data_ptr() == x.data_ptr()
    else:
        assert torch.equal(x, before)
