"""softmax_ against torch.softmax (float64 reference), autograd, errors, memory."""

from __future__ import annotations

import re

import pytest
import torch

import make_inplace
from make_inplace.nn import InplaceSoftmax
from make_inplace._measure import cuda_peak_extra, fresh_cuda_memory
from conftest import launch_orders

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
WIDTHS = [1, 2, 31, 32, 33, 1000, 1025, 4097, 65537]
op = torch.ops.make_inplace


def rows_for(width: int) -> int:
    # Many rows for narrow widths (several rows per CTA/warp), few for wide ones
    # so the CPU run stays short.
    return 37 if width <= 1025 else 3


def reference(x: torch.Tensor, dim: int = -1, scale: float | None = None, causal: bool = False,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """torch.softmax in float64 of the same (already rounded) input."""
    v = x.double() * (1.0 if scale is None else scale)
    if mask is not None:
        v = v + mask.double()
    if causal:
        rows, cols = x.shape[-2], x.shape[-1]
        cut = torch.ones(rows, cols, dtype=torch.bool, device=x.device).triu(1)
        v = v.masked_fill(cut, float("-inf"))
    return torch.softmax(v, dim)


def assert_close(result: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOL[dtype]
    torch.testing.assert_close(result.double(), expected.double(), rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS + [pytest.param(262144, marks=CUDA)])
def test_widths_match_torch(device, dtype, width):
    if width == 262144 and device == "cpu":
        pytest.skip("262144 runs on CUDA only (CPU budget)")
    x = torch.randn(rows_for(width), width, device=device, dtype=dtype) * 4
    expected = reference(x)
    ptr = x.data_ptr()
    y = make_inplace.softmax_(x)
    assert y is x and x.data_ptr() == ptr
    assert_close(x, expected, dtype)


# Register rows over 2-4 warps of two 16-byte vectors a thread (float32 512
# and 1024 columns, 16-bit 1024) beside rows that stay one warp's (768 and
# float32 1000 columns).
@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [512, 768, 1000, 1024])
def test_cuda_rows_over_warps_match_torch(dtype, width):
    x = torch.randn(1000, width, device="cuda", dtype=dtype) * 4
    x[1, width - 1] = 60  # one large element: the row's max from its last thread
    expected = reference(x)
    make_inplace.softmax_(x)
    assert_close(x, expected, dtype)


# Rows of 32 KiB and more (16-byte aligned, unmasked) take the staged kernel on
# sm_90 (staged_rows.cuh): widths needing 1 to 5 slots of 32 KiB depending on
# the dtype, a last piece cut short (40008), and more rows than the persistent
# grid has CTAs, so each CTA walks its ring of slots over several rows; the
# shorter ones check the register kernels around the threshold.
# Rows too long for one CTA's ring are split over a cluster of 2, 4 or 8 CTAs
# that combine their parts' reductions: 65536 (float32), 73744 (halves with a
# short last piece) and 98304 in halves; 163840 in halves (16-bit) or
# quarters (float32); 270336 in quarters (16-bit) or eighths (float32), with
# parts ending in a short piece. float64 rows that long stream through global
# memory.
STAGED_WIDTHS = [4096, 8192, 16384, 24576, 40008, 65536, 73744, 98304, 163840, 270336]


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", STAGED_WIDTHS)
@pytest.mark.parametrize("rows", [1, 1500])
def test_cuda_staged_rows_match_torch(dtype, width, rows):
    x = torch.randn(rows, width, device="cuda", dtype=dtype) * 4
    expected = reference(x)
    make_inplace.softmax_(x)
    assert_close(x, expected, dtype)


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_split_rows_with_parts_of_minus_inf(dtype):
    """A row split over a cluster sums each part against the part's own max,
    then rescales: a part that is all -inf must add 0, not NaN."""
    x = torch.randn(4, 270336, device="cuda", dtype=dtype) * 4
    x[0, :100000] = float("-inf")  # the first parts
    x[1, -70000:] = float("-inf")  # the last part
    x[2, 5] = float("-inf")
    x[3, 1:] = float("-inf")  # one finite element: the output is one 1 and zeros
    expected = reference(x)
    make_inplace.softmax_(x)
    assert not x.isnan().any()
    assert_close(x, expected, dtype)


# Register rows (1024, 4096), staged rows of one CTA and of clusters of 2 to 8
# (16384 to 262144) and two-pass rows (1048576), in every order: a kernel's
# launch limits must hold whatever widths ran before.
ORDER_WIDTHS = [1024, 4096, 16384, 40008, 65536, 98304, 262144, 1048576]


@CUDA
@pytest.mark.fresh_process
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("order", ["increasing", "decreasing", "alternating"])
def test_cuda_widths_in_any_order(dtype, order):
    for width in launch_orders(ORDER_WIDTHS)[order]:
        x = torch.randn(64 if width < 262144 else 4, width, device="cuda", dtype=dtype) * 4
        expected = reference(x)
        make_inplace.softmax_(x)
        assert_close(x, expected, dtype)


@CUDA
@pytest.mark.fresh_process
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cuda_width_returns_after_a_narrower_staged_row(dtype):
    """65536, 40008, 65536 columns, first thing in a process: the third call
    once failed with "invalid argument" (the second had lowered the
    shared-memory limit the first had set for the same kernel)."""
    for width in (65536, 40008, 65536):
        x = torch.randn(1500, width, device="cuda", dtype=dtype)
        expected = reference(x)
        make_inplace.softmax_(x)
        assert_close(x, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("route", ["columns", "rows-masked", "rows-scaled"])
def test_a_single_element_softmax_is_exactly_one(device, dtype, route):
    """softmax over one element is exp(v - v) / exp(v - v) = 1 exactly, and its
    gradient exactly 0, however far v is from 0. On CUDA a pass that computed
    fma(x, scale, -max) instead of round(x * scale) - max once gave 1 + 2e-6
    (float32, x * scale = -52.3) and a gradient of 1.2e-5 instead of 0."""
    values = torch.tensor([12.328, -2.3474, -17.4303, 1e4 / 3], dtype=dtype)
    if route == "columns":
        x, dim, mask = values.view(1, 4), 0, None
    else:
        x, dim = values.view(4, 1), -1
        mask = torch.zeros(1, dtype=dtype, device=device) if route == "rows-masked" else None
    x = x.to(device).requires_grad_()
    y = make_inplace.softmax_(x * 1.0, dim, scale=3.0, mask=mask)
    assert torch.equal(y, torch.ones_like(y))
    y.backward(torch.randn(y.shape, dtype=dtype, device=device))
    assert torch.equal(x.grad, torch.zeros_like(x.grad))


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(300, 24576), (50, 65536), (7, 98304)])
def test_cuda_staged_rows_scale(dtype, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    expected = reference(x, -1, 0.3)
    make_inplace.softmax_(x, -1, scale=0.3)
    assert_close(x, expected, dtype)


@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 700, 4096), (1, 300, 24576), (3, 50, 40008)])
def test_cuda_staged_rows_causal_and_scale(dtype, shape):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    expected = reference(x, -1, 0.3, causal=True)
    make_inplace.softmax_(x, -1, scale=0.3, causal=True)
    assert_close(x, expected, dtype)
    cut = torch.ones(shape[-2], shape[-1], dtype=torch.bool, device="cuda").triu(1)
    assert (x[..., cut] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1, 2, -3])
@pytest.mark.parametrize("shape", [(5, 7, 33), (3, 1025, 2), (1, 4, 4097)])
def test_dims_of_3d(device, dtype, dim, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 3
    expected = reference(x, dim)
    make_inplace.softmax_(x, dim)
    assert_close(x, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 9, 9), (5, 7), (2, 7, 40), (3, 40, 7), (1, 3, 1025), (2, 4, 4100), (1, 3, 40000)])
@pytest.mark.parametrize("scale", [None, 0.125])
def test_causal_and_scale(device, dtype, shape, scale):
    x = torch.randn(shape, device=device, dtype=dtype)
    expected = reference(x, -1, scale, causal=True)
    make_inplace.softmax_(x, -1, scale=scale, causal=True)
    assert_close(x, expected, dtype)
    # masked positions are exactly zero
    cut = torch.ones(shape[-2], shape[-1], dtype=torch.bool, device=device).triu(1)
    assert (x[..., cut] == 0).all()


def test_causal_matches_sdpa_alignment():
    q, k = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 9, 8, dtype=torch.float64)
    v = torch.eye(9, dtype=torch.float64).expand(2, 9, 9)
    # SDPA with v = identity returns the attention probabilities themselves.
    probs = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    scores = q @ k.transpose(-1, -2)
    make_inplace.softmax_(scores, -1, scale=8 ** -0.5, causal=True)
    torch.testing.assert_close(scores, probs, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "x_shape,mask_shape,dim",
    [
        ((2, 3, 6, 33), (6, 33), -1),
        ((2, 3, 6, 33), (2, 1, 1, 33), -1),
        ((2, 3, 6, 1024), (2, 3, 6, 1024), -1),
        ((2, 3, 6, 4100), (1, 4100), -1),
        ((4, 6, 5), (6, 1), 1),
        ((4, 6, 5), (4, 1, 5), 0),
        ((2, 40000), (40000,), -1),
    ],
)
def test_additive_mask(device, dtype, x_shape, mask_shape, dim):
    x = torch.randn(x_shape, device=device, dtype=dtype)
    mask = torch.randn(mask_shape, device=device, dtype=dtype)
    mask[..., 0] = float("-inf") if mask.shape[-1] > 1 else 0
    mask_before = mask.clone()
    expected = reference(x, dim, 0.5, mask=mask)
    make_inplace.softmax_(x, dim, scale=0.5, mask=mask)
    assert_close(x, expected, dtype)
    assert torch.equal(mask, mask_before)


@pytest.mark.parametrize("device", DEVICES)
def test_mask_noncontiguous_and_causal(device):
    x = torch.randn(2, 7, 7, device=device)
    mask = torch.randn(7, 7, device=device).t()  # transposed view, read through strides
    expected = reference(x, -1, None, causal=True, mask=mask)
    make_inplace.softmax_(x, causal=True, mask=mask)
    assert_close(x, expected, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [5, 1000, 65537])
def test_inf_and_nan_rows_as_torch(device, dtype, width):
    x = torch.randn(4, width, device=device, dtype=dtype)
    x[0] = float("-inf")                 # all -inf -> NaN
    x[1, width // 2] = float("nan")      # NaN -> NaN row
    x[2, width - 1] = float("inf")       # +inf -> as torch
    x[3, : width // 2] = float("-inf")   # partially -inf -> normal
    expected = torch.softmax(x.double(), -1)
    make_inplace.softmax_(x)
    assert_close(x, expected, dtype)
    assert torch.isnan(x[0]).all() and torch.isnan(x[1]).all()


# Rows of 16 to 32 vectors (16-bit: 128-256 columns, float32: 64-128) are
# walked row after row by each thread group (short_rows.cuh): more rows than
# the resident grid holds at once, a last warp partly past the end, a partial
# last vector's worth of lanes (136), and -inf, NaN and +inf rows among them.
@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [64, 128, 136, 256])
@pytest.mark.parametrize("scale", [None, 0.125])
def test_cuda_walked_rows_match_torch(dtype, width, scale):
    rows = 150_001
    x = torch.randn(rows, width, device="cuda", dtype=dtype) * 4
    x[5] = float("-inf")
    x[70_000, width // 2] = float("nan")
    x[-2, width - 1] = float("inf")
    x[-1, : width // 2] = float("-inf")
    expected = reference(x, -1, scale)
    make_inplace.softmax_(x, scale=scale)
    assert_close(x, expected, dtype)
    assert torch.isnan(x[5]).all() and torch.isnan(x[70_000]).all()


def check_short_rows(dtype: torch.dtype, width: int, scale: float | None) -> None:
    """35 rows: two groups of 16 (8 on AVX2) through the CPU's transposed
    short-row path and 3 left over, with -inf, NaN and +inf rows in both."""
    x = torch.randn(35, width, dtype=dtype) * 4
    x[3] = float("-inf")
    x[17, width // 2] = float("nan")
    x[20, width - 1] = float("inf")
    x[33, : (width + 1) // 2] = float("-inf")
    x[34] = float("-inf")
    expected = reference(x, -1, scale)
    make_inplace.softmax_(x, scale=scale)
    assert_close(x, expected, dtype)
    assert torch.isnan(x[3]).all() and torch.isnan(x[17]).all() and torch.isnan(x[34]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 5, 16, 33, 100, 128, 129])
@pytest.mark.parametrize("scale", [None, 0.125])
def test_cpu_short_rows_as_torch(dtype, width, scale):
    check_short_rows(dtype, width, scale)


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_cpu_short_rows_on_narrower_vector_sets(capability):
    """ATEN_CPU_CAPABILITY caps the CPU kernels' vector set (read once per
    process): the AVX2 short-row path and the portable row path."""
    import os
    import subprocess
    import sys

    script = (
        "import itertools, torch, test_softmax as t\n"
        "for d, w, s in itertools.product(t.DTYPES[1:], [1, 5, 8, 33, 128], [None, 0.125]):\n"
        "    t.check_short_rows(d, w, s)\n"
    )
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability,
               PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_scalar(device):
    for shape, dim in [((0, 5), -1), ((4, 0), -1), ((4, 0), 0), ((), 0)]:
        x = torch.randn(shape, device=device)
        expected = torch.softmax(x, dim)
        make_inplace.softmax_(x, dim)
        torch.testing.assert_close(x, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(4, 9, device=device)
    mask = torch.randn(9, device=device)
    torch.library.opcheck(op.softmax_.default, (x, -1), {"scale": 0.5, "causal": True, "mask": mask})
    torch.library.opcheck(op.softmax_.default, (torch.randn(3, 4, 5, device=device), 1))
    y = torch.softmax(torch.randn(3, 4, 5, device=device), 1)
    torch.library.opcheck(op.softmax_backward.default, (torch.randn_like(y), y, 1, 0.5))
    torch.library.opcheck(op.softmax_backward_.default, (torch.randn_like(y), y, -1, 0.5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "shape,dim,kwargs",
    [
        ((3, 6), -1, {}),
        ((4, 3, 5), 0, {}),
        ((4, 3, 5), 1, {"scale": 0.7}),
        ((2, 5, 5), -1, {"causal": True, "scale": 1.3}),
        ((2, 4, 5), -1, {"mask": "grad"}),
        ((2, 4, 5), 1, {"mask": "const"}),
    ],
)
def test_gradcheck(device, shape, dim, kwargs):
    x = torch.randn(shape, device=device, dtype=torch.float64, requires_grad=True)
    inputs = [x]
    mask_kind = kwargs.pop("mask", None)
    if mask_kind is not None:
        mask = torch.randn(shape[-1] if dim == -1 else 1, device=device, dtype=torch.float64)
        mask = mask.reshape((1,) * (len(shape) - 1) + (-1,) if dim == -1 else (1,)).requires_grad_(mask_kind == "grad")
        inputs.append(mask)

        def fn(x, mask):
            return make_inplace.softmax_(x.clone(), dim, mask=mask, **kwargs)
    else:

        def fn(x):
            return make_inplace.softmax_(x.clone(), dim, **kwargs)

    assert torch.autograd.gradcheck(fn, tuple(inputs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((37, 1025), -1), ((3, 4097), -1), ((6, 33, 5), 1), ((9, 4, 3), 0)])
def test_grads_match_torch(device, dtype, shape, dim):
    base = torch.randn(shape, device=device, dtype=dtype)
    grad = torch.randn(shape, device=device, dtype=dtype)
    grad_before = grad.clone()
    leaf = base.clone().requires_grad_()
    y = make_inplace.softmax_(leaf * 1.0, dim, scale=0.5)
    y.backward(grad)
    ref_leaf = base.double().requires_grad_()
    torch.softmax(ref_leaf * 0.5, dim).backward(grad.double())
    assert_close(leaf.grad, ref_leaf.grad, dtype)
    assert torch.equal(grad, grad_before)  # grad_output never overwritten


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_grad", [False, True])
def test_noncontiguous_grads(device, mask_grad):
    # Expanded (y.sum()) and transposed grads go through the path that writes the
    # result over the wrapper's own contiguous copy.
    base = torch.randn(6, 33, device=device, dtype=torch.float64)
    weights = torch.randn(33, 6, device=device, dtype=torch.float64).t()
    mask0 = torch.randn(33, device=device, dtype=torch.float64)
    for loss_fn in (lambda y: y.sum(), lambda y: (y * weights).sum(), lambda y: (y * weights).pow(2).sum()):
        leaf = base.clone().requires_grad_()
        mask = mask0.clone().requires_grad_(mask_grad)
        loss_fn(make_inplace.softmax_(leaf * 1.0, -1, scale=0.3, mask=mask)).backward()
        ref_leaf = base.clone().requires_grad_()
        ref_mask = mask0.clone().requires_grad_(mask_grad)
        loss_fn(torch.softmax(ref_leaf * 0.3 + ref_mask, -1)).backward()
        torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-10, atol=1e-10)
        if mask_grad:
            torch.testing.assert_close(mask.grad, ref_mask.grad, rtol=1e-10, atol=1e-10)


def test_saves_only_the_output():
    saved = []
    x = torch.randn(4, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        h = x * 2.0  # multiplying by a Python number saves nothing
        y = make_inplace.softmax_(h)
    assert len(saved) == 1 and saved[0].data_ptr() == y.data_ptr()


def test_version_counter_and_misuse_raises():
    x = torch.randn(3, 4)
    v0 = x._version
    op.softmax_(x)  # straight through the C++ op: the ADInplaceOrView kernel bumps it
    assert x._version > v0
    a = torch.randn(3, 4, requires_grad=True)
    h = a * 1.0
    z = h * h  # saves h
    make_inplace.softmax_(h)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_leaf_requiring_grad_raises():
    x = torch.randn(3, 4, requires_grad=True)
    before = x.detach().clone()
    with pytest.raises(RuntimeError, match="leaf Variable"):
        make_inplace.softmax_(x)
    assert torch.equal(x.detach(), before)
    with torch.no_grad():
        make_inplace.softmax_(x)  # allowed without grad, as torch's in-place ops


def _bad_calls(device):
    x = torch.randn(4, 6, device=device)
    yield "dim", lambda t: op.softmax_(t, 2), x
    yield "dim", lambda t: op.softmax_(t, -3), x
    yield "x must have dtype", lambda t: op.softmax_(t), torch.arange(6, device=device).reshape(2, 3)
    yield "x must be contiguous", lambda t: op.softmax_(t), torch.randn(6, 4, device=device).t()
    yield "causal=True", lambda t: op.softmax_(t, 0, causal=True), x
    yield "causal=True", lambda t: op.softmax_(t, causal=True), torch.randn(6, device=device)
    yield "mask must have the same dtype", lambda t: op.softmax_(t, mask=torch.zeros(6, device=device, dtype=torch.float64)), x
    yield "mask must be broadcastable", lambda t: op.softmax_(t, mask=torch.zeros(5, device=device)), x
    yield "mask must be broadcastable", lambda t: op.softmax_(t, mask=torch.zeros(2, 4, 6, device=device)), x
    shared = torch.randn(5, 6, device=device)
    yield "mask must not share memory with x", lambda t: op.softmax_(t, mask=shared[3]), shared[:4]
    y = torch.softmax(torch.randn(4, 6, device=device), -1)
    yield "output must not share memory with grad", lambda t: op.softmax_backward_(t, t, -1, 1.0), y
    yield "grad must be contiguous", lambda t: op.softmax_backward_(t, y, -1, 1.0), torch.randn(6, 4, device=device).t()
    yield "grad_output must have output's shape", lambda t: op.softmax_backward(torch.zeros(4, 5, device=device), t, -1, 1.0), x
    yield "grad_output must have the same dtype", lambda t: op.softmax_backward(t.double(), t, -1, 1.0), x
    if device == "cuda":
        # torch.ops reaches the CUDA kernel, whose C++ check names the op, both arguments and the fix.
        yield (rf"^make_inplace\.softmax_: mask must be on the same device as x \({re.escape(str(x.device))}\), "
               rf"got cpu; move it with \.to\(x\.device\)"), lambda t: op.softmax_(t, mask=torch.zeros(6)), x


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise_and_change_nothing(device):
    for match, call, x in _bad_calls(device):
        before = x.clone()
        with pytest.raises((RuntimeError, ValueError, TypeError), match=match):
            call(x)
            print("did not raise:", match)
        assert torch.equal(x, before), match


@pytest.mark.parametrize("device", DEVICES)
def test_module(device):
    m = InplaceSoftmax(dim=1)
    x = torch.randn(3, 5, 4, device=device)
    expected = torch.softmax(x, 1)
    assert m(x) is x
    torch.testing.assert_close(x, expected)


# --- CUDA only: memory, streams -------------------------------------------------


@CUDA
# Every x is >= 10 MiB: a smaller one sits in a 20 MiB allocator segment whose
# free rest would hold torch's output, hiding its allocation (docs/memory.md).
@pytest.mark.parametrize("shape,kwargs", [((4096, 4096), {}), ((16, 1024, 1024), {"causal": True, "scale": 0.1}), ((64, 65536), {})])
@pytest.mark.fresh_process
def test_cuda_forward_allocates_nothing(shape, kwargs):
    fresh_cuda_memory()
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    ours = cuda_peak_extra(lambda: make_inplace.softmax_(x, -1, **kwargs))
    assert ours.reserved == 0 and ours.allocated == 0
    scale = kwargs.get("scale", 1.0)
    theirs = cuda_peak_extra(lambda: torch.softmax(x * scale, -1))
    assert theirs.allocated >= x.nbytes and theirs.reserved >= x.nbytes


@CUDA
@pytest.mark.fresh_process
def test_cuda_forward_over_middle_dim_allocates_nothing():
    fresh_cuda_memory()
    x = torch.randn(64, 1024, 256, device="cuda", dtype=torch.float16)
    mask = torch.randn(1024, 1, device="cuda", dtype=torch.float16)
    ours = cuda_peak_extra(lambda: make_inplace.softmax_(x, 1, mask=mask))
    assert ours.reserved == 0 and ours.allocated == 0
    theirs = cuda_peak_extra(lambda: torch.softmax(x + mask, 1))
    assert theirs.allocated >= x.nbytes and theirs.reserved >= x.nbytes


@CUDA
@pytest.mark.fresh_process
def test_cuda_forward_backward_peak_below_torch():
    # Scaled, masked probabilities y = softmax(h * scale + mask) of an activation h,
    # trained through loss = y.sum(). torch holds h, h*scale and h*scale + mask (or
    # h, h*scale + mask and y) at once: 3 activations. Ours writes over h (1), and in
    # backward turns the expanded grad into its own contiguous copy and writes the
    # input grad over that copy: 2 activations.
    rows, cols = 8192, 4096
    activation = rows * cols * 2
    # The loss, its grad seed and similar scalars: allocated by both runs, at
    # different moments, in 512-byte blocks.
    bookkeeping = 4 * 512

    def run(use_ours: bool):
        fresh_cuda_memory()
        leaf = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        mask = torch.randn(cols, device="cuda", dtype=torch.bfloat16)

        def step():
            h = leaf.clone()  # the activation; its node saves nothing and passes grads through
            if use_ours:
                y = make_inplace.softmax_(h, -1, scale=0.125, mask=mask)
            else:
                y = torch.softmax(h * 0.125 + mask, -1)
            del h
            y.sum().backward()

        peak = cuda_peak_extra(step)
        return peak.reserved, peak.allocated

    ours_r, ours_a = run(True)
    torch_r, torch_a = run(False)
    assert ours_a <= torch_a - activation + bookkeeping, (ours_a, torch_a)
    assert ours_r <= torch_r - activation, (ours_r, torch_r)


@CUDA
def test_cuda_current_stream():
    x = torch.randn(512, 4096, device="cuda")
    expected = torch.softmax(x, -1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            torch.cuda._sleep(1_000_000)  # a slow kernel first: a wrong stream would race
        make_inplace.softmax_(x)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(x, expected)


@pytest.mark.parametrize("device, amp", [("cpu", torch.bfloat16), pytest.param("cuda", torch.float16, marks=CUDA)])
@pytest.mark.parametrize("x_dtype", [torch.float32, "amp"])
def test_module_under_autocast_has_torchs_dtype(device, amp, x_dtype):
    """InplaceSoftmax under torch.autocast: nn.Softmax's dtype and values; in
    place where that is x's dtype, else a new tensor and x untouched."""
    torch.manual_seed(9)
    x = torch.randn(6, 40, device=device, dtype=amp if x_dtype == "amp" else x_dtype)
    before = x.clone()
    with torch.no_grad(), torch.autocast(device, dtype=amp):
        expected = torch.nn.Softmax(-1)(x)
        y = InplaceSoftmax(-1)(x)
    assert y.dtype == expected.dtype
    torch.testing.assert_close(y, expected, rtol=TOL[y.dtype], atol=TOL[y.dtype])
    if y.dtype == x.dtype:
        assert y.data_ptr() == x.data_ptr()
    else:
        assert torch.equal(x, before)
