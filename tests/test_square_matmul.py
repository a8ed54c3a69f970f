"""square_matmul_: values, storage, autograd, version counter, errors, memory, streams."""

import itertools
import re

import pytest
import torch

import make_inplace
from make_inplace._testing import forced_route
from make_inplace._measure import cuda_peak_extra, fresh_cuda_memory, relative_error
from conftest import CUDA, DEVICES, device_mismatch, launch_orders, requires_cuda

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# Relative (Frobenius) error against float64 math on the same rounded inputs.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.2e-2, torch.float32: 2e-5, torch.float64: 1e-12}


def make(rows, n, dtype, device, bias=False, shape=None):
    x = torch.randn(*(shape or (rows, n)), dtype=dtype, device=device)
    w = (torch.randn(n, n, dtype=dtype, device=device) / n**0.5).to(dtype)
    b = torch.randn(n, dtype=dtype, device=device) if bias else None
    return x, w, b


def reference(x, w, b, transpose):
    mat = w.double().t() if transpose else w.double()
    out = x.double() @ mat
    return out + b.double() if b is not None else out


def check(x, w, b=None, transpose=False, workspace_bytes=None):
    expected = reference(x, w, b, transpose)
    ptr = x.data_ptr()
    out = make_inplace.square_matmul_(x, w, b, transpose=transpose, workspace_bytes=workspace_bytes)
    assert out is x and x.data_ptr() == ptr
    if x.numel():
        assert not torch.isnan(x).any()
        assert relative_error(x, expected) < TOL[x.dtype], (relative_error(x, expected), x.dtype)


# Every (n, rows, dtype) of the acceptance grid; transpose, bias and the
# workspace mode rotate through the grid so each meets every shape class.
GRID = list(itertools.product([1, 7, 32, 33, 128, 1000], [0, 1, 5, 1000], DTYPES))
MODES = [(False, False, None), (True, True, None), (False, True, 0), (True, False, 0), (False, False, 4096)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,rows,dtype", GRID)
def test_values_against_float64(device, n, rows, dtype):
    transpose, bias, workspace = MODES[(n + rows + DTYPES.index(dtype)) % len(MODES)]
    x, w, b = make(rows, n, dtype, device, bias)
    check(x, w, b, transpose, workspace)


# The CPU row kernel's register-tile heights: its 96 KiB panel holds 12 or
# more rows up to n = 2048, 4-11 rows up to 6144, 2-3 up to 12288.
@pytest.mark.parametrize("n", [2049, 6200])
@pytest.mark.parametrize("transpose", [False, True])
def test_cpu_row_kernel_on_wide_rows(n, transpose):
    x, w, b = make(13, n, torch.bfloat16, "cpu", bias=True)
    check(x, w, b, transpose, workspace_bytes=0)


# Threads with room on their stack take a 384 KiB panel and pack all of w once
# (n <= 512, more rows than one panel); the others a 96 KiB panel.
@pytest.mark.parametrize("n,rows", [(33, 7000), (257, 1000), (512, 900), (700, 500)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transpose", [False, True])
def test_cpu_row_kernel_tall_panels(n, rows, dtype, transpose):
    x, w, b = make(rows, n, dtype, "cpu", bias=True)
    check(x, w, b, transpose, workspace_bytes=0)


# bfloat16 rows of even width multiply pairs of k with AVX512-BF16 dot products
# where the CPU has them (elsewhere, and at odd widths, the float32 tile):
# column tiles of one and two vectors and a partial last one, slices of w past
# 256 pairs (n > 512), rows past a register tile, both layouts, a bias.
@pytest.mark.parametrize("n", [2, 30, 32, 34, 48, 94, 512, 514, 1026])
@pytest.mark.parametrize("rows", [1, 13, 1000])
@pytest.mark.parametrize("transpose,bias", [(False, False), (True, True), (False, True)])
def test_cpu_row_kernel_bfloat16_pairs(n, rows, transpose, bias):
    x, w, b = make(rows, n, torch.bfloat16, "cpu", bias=bias)
    check(x, w, b, transpose, workspace_bytes=0)


# float32 rows of up to 64 elements (AVX-512) are computed whole in registers,
# 6 rows at a time, without a panel copy: every column count of 1-4 vectors,
# every remainder of rows, and one to three last columns as dot products
# (17, 33-35, 49, 51; 18 keeps a vector).
@pytest.mark.parametrize("n", [1, 16, 17, 18, 33, 34, 35, 48, 49, 51, 63, 64, 65])
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 1000])
@pytest.mark.parametrize("transpose,bias", [(False, False), (True, True)])
def test_cpu_register_rows(n, rows, transpose, bias):
    x, w, b = make(rows, n, torch.float32, "cpu", bias=bias)
    check(x, w, b, transpose, workspace_bytes=0)


_SMALL_STACK_SCRIPT = """
import threading, torch, make_inplace
threading.stack_size(128 * 1024)
errors = []
def run():
    for dtype in (torch.float32, torch.bfloat16):
        for rows, n in [(13, 64), (900, 512), (100, 33)]:
            x = torch.randn(rows, n).to(dtype)
            w = (torch.randn(n, n) / n**0.5).to(dtype)
            expected = x.double() @ w.double()
            make_inplace.square_matmul_(x, w, workspace_bytes=0)
            errors.append((dtype, ((x.double() - expected).norm() / expected.norm()).item()))
thread = threading.Thread(target=run)
thread.start()
thread.join()
assert len(errors) == 6 and all(e < (2e-5 if d == torch.float32 else 1.2e-2) for d, e in errors), errors
"""


def test_cpu_row_kernel_on_a_thread_with_a_small_stack():
    """A 128 KiB thread stack cannot hold the panel: the buffers go to the heap
    instead of overflowing the stack (which crashed the process)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _SMALL_STACK_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


_ISA_SCRIPT = """
import itertools, torch, make_inplace
for (n, rows), dtype, transpose, bias in itertools.product(
        [*itertools.product([1, 7, 33, 100, 257], [1, 13, 100]), (257, 1000), (512, 900)],
        [torch.float32, torch.bfloat16, torch.float16], [False, True], [False, True]):
    x = torch.randn(rows, n, dtype=dtype)
    w = (torch.randn(n, n) / n**0.5).to(dtype)
    b = torch.randn(n, dtype=dtype) if bias else None
    mat = w.double().t() if transpose else w.double()
    expected = x.double() @ mat + (b.double() if bias else 0)
    make_inplace.square_matmul_(x, w, b, transpose=transpose, workspace_bytes=0)
    err = ((x.double() - expected).norm() / expected.norm()).item()
    assert err < {torch.float32: 2e-5, torch.bfloat16: 1.2e-2, torch.float16: 2e-3}[dtype], (n, rows, dtype, transpose, err)
"""


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_cpu_row_kernel_on_narrower_vector_sets(capability):
    """ATEN_CPU_CAPABILITY caps the CPU kernels' vector set too (read once per
    process): the AVX2 and portable row kernels, each in a fresh process."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    done = subprocess.run([sys.executable, "-c", _ISA_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("workspace_bytes", [None, 0, 1, 33 * 8, 1 << 20])
def test_modes(device, transpose, bias, workspace_bytes):
    x, w, b = make(77, 33, torch.float64, device, bias)
    check(x, w, b, transpose, workspace_bytes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_three_dim_x(device, dtype):
    x, w, b = make(0, 48, dtype, device, True, shape=(3, 17, 48))
    check(x, w, b)


@pytest.mark.parametrize("device", DEVICES)
def test_transposed_weight_view_is_read_in_place(device):
    x, w, _ = make(9, 16, torch.float64, device)
    check(x, w.t())  # a non-contiguous weight whose transpose is contiguous
    x, w, _ = make(9, 16, torch.float64, device)
    check(x, w.t(), transpose=True)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    for dtype in (torch.float32, torch.bfloat16):
        x, w, b = make(6, 8, dtype, device, True)
        torch.library.opcheck(torch.ops.make_inplace.square_matmul_.default, (x, w, b), {"transpose": True})
        torch.library.opcheck(torch.ops.make_inplace.square_matmul_.default, (x, w), {"workspace_bytes": 0})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transpose", [False, True])
def test_gradcheck(device, transpose):
    w = torch.randn(5, 5, dtype=torch.float64, device=device)
    x0 = torch.randn(3, 5, dtype=torch.float64, device=device, requires_grad=True)
    b0 = torch.randn(5, dtype=torch.float64, device=device, requires_grad=True)

    def f(x, b):
        return make_inplace.square_matmul_(x.clone(), w, b, transpose=transpose)

    assert torch.autograd.gradcheck(f, (x0, b0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grads_match_torch(device, dtype):
    x, w, b = make(10, 24, dtype, device, True)
    x1, b1 = x.clone().requires_grad_(), b.clone().requires_grad_()
    x2, b2 = x.clone().requires_grad_(), b.clone().requires_grad_()
    g = torch.randn(10, 24, dtype=dtype, device=device)
    torch.nn.functional.linear(x1 * 2, w, b1).backward(g)
    make_inplace.square_matmul_(x2 * 2, w, b2, transpose=True).backward(g)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert relative_error(x2.grad, x1.grad) < tol
    assert relative_error(b2.grad, b1.grad) < tol


@pytest.mark.parametrize("device", DEVICES)
def test_version_counter_bumped_even_through_torch_ops(device):
    x, w, _ = make(4, 4, torch.float32, device)
    v = x._version
    make_inplace.square_matmul_(x, w)
    assert x._version > v
    v = x._version
    torch.ops.make_inplace.square_matmul_(x, w)  # no Python wrapper involved
    assert x._version > v


@pytest.mark.parametrize("device", DEVICES)
def test_overwriting_a_saved_tensor_is_caught(device):
    a = torch.randn(4, 4, device=device, requires_grad=True)
    w = torch.randn(4, 4, device=device)
    x = a.exp()  # exp saves its output x for the backward
    with torch.no_grad():
        make_inplace.square_matmul_(x, w)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        x.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_weight_requiring_grad_is_refused_before_writing(device):
    x, w, _ = make(4, 4, torch.float32, device)
    x_before, w = x.clone(), w.requires_grad_()
    with pytest.raises(RuntimeError, match="weight requires grad.*dW"):
        make_inplace.square_matmul_(x, w)
    assert torch.equal(x, x_before)
    with torch.no_grad():  # inference with a trainable weight is fine
        make_inplace.square_matmul_(x, w)


@pytest.mark.parametrize("device", DEVICES)
def test_leaf_requiring_grad_is_refused_before_writing(device):
    x, w, _ = make(4, 4, torch.float32, device)
    x.requires_grad_()
    x_before = x.detach().clone()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        make_inplace.square_matmul_(x, w)
    assert torch.equal(x.detach(), x_before)


def bad_inputs(device):
    """(description, args, kwargs, message pattern) for each bad input."""
    f32 = dict(device=device, dtype=torch.float32)
    x = torch.randn(5, 4, **f32)
    w = torch.randn(4, 4, **f32)
    b = torch.randn(4, **f32)
    base = torch.randn(5, 8, **f32)
    cases = [
        ("weight not square", (x, torch.randn(4, 5, **f32)), {}, r"weight must have shape \(4, 4\)"),
        ("weight wrong size", (x, torch.randn(3, 3, **f32)), {}, r"weight must have shape \(4, 4\)"),
        ("bias wrong shape", (x, w, torch.randn(5, **f32)), {}, r"bias must have shape \(4\)"),
        ("bias 2-d", (x, w, torch.randn(1, 4, **f32)), {}, r"bias must have shape \(4\)"),
        ("weight dtype", (x, w.double()), {}, "weight must have the same dtype as x"),
        ("bias dtype", (x, w, b.half()), {}, "bias must have the same dtype as x"),
        ("integer x", (torch.ones(5, 4, dtype=torch.int32, device=device), w.int()), {}, "x must have dtype float16"),
        ("bool x", (torch.ones(5, 4, dtype=torch.bool, device=device), w.bool()), {}, "x must have dtype float16"),
        ("0-dim x", (torch.tensor(1.0, device=device), w), {}, "x must have at least one dimension"),
        ("non-contiguous x", (base[:, ::2], w), {}, "x must be contiguous"),
        ("weight shares x's memory", (base[:, :4].contiguous(), None), {}, None),
        ("negative workspace", (x, w), {"workspace_bytes": -1}, "workspace_bytes must be None or >= 0"),
    ]
    # weight as a view into x's own storage
    xw = torch.randn(8, 4, **f32)
    cases[10] = ("weight shares x's memory", (xw, xw[:4]), {}, "weight must not share memory with x")
    xb = torch.randn(3, 4, **f32)
    cases.append(("bias shares x's memory", (xb, w, xb[1]), {}, "bias must not share memory with x"))
    # Another device: the real other one where CUDA is present; a meta mix (which
    # dispatch would send to the fake kernel, writing nothing) everywhere.
    others = ["meta"] + (["cpu" if device == "cuda" else "cuda"] if CUDA else [])
    for other in others:
        w_other, b_other = w.to(other), b.to(other)
        cases.append((f"weight on {other}", (x, w_other), {}, device_mismatch("square_matmul_", "weight", w_other, "x", x)))
        cases.append((f"bias on {other}", (x, w, b_other), {}, device_mismatch("square_matmul_", "bias", b_other, "x", x)))
    return cases



@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise_and_change_nothing(device):
    for name, args, kwargs, pattern in bad_inputs(device):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        before = [t.clone() for t in tensors]
        with pytest.raises(RuntimeError, match=pattern):
            make_inplace.square_matmul_(*args, **kwargs)
        for t, t0 in zip(tensors, before):
            assert t.device.type == "meta" or torch.equal(t, t0), name  # meta holds no values


# ---------------------------------------------------------------- CUDA only


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows,n", [(65536, 768), (4097, 8192), (1025, 4096), (3, 8192), (65536, 33)])
@pytest.mark.parametrize("workspace_bytes", [None, 0])
def test_cuda_large(dtype, rows, n, workspace_bytes):
    x, w, b = make(rows, n, dtype, "cuda", bias=True)
    check(x, w, b, transpose=(rows % 2 == 1), workspace_bytes=workspace_bytes)


@requires_cuda
@pytest.mark.parametrize(
    "rows,n,dtype,workspace_bytes",
    [
        (262144, 1024, torch.bfloat16, 4 << 20),  # 4 blocks of 510 rows: more sub-panels than one pointer run holds
        (16391, 2048, torch.float16, 6 << 20),  # 6 blocks; the last panel has 4 full blocks and a partial one
        (65536, 1030, torch.bfloat16, None),  # rows not 16-byte multiples: unaligned sub-panels, element-wise copy
        (40000, 1024, torch.float32, None),  # fp32, 8 blocks of 255 rows
    ],
)
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "per-block"])
def test_cuda_small_block_panels(rows, n, dtype, workspace_bytes, batched):
    """The panel route whose workspace is 1 MiB blocks (bounds of 2-10 MiB), forced
    (the wgmma and FFMA kernels would take some of these shapes), with one batched
    GEMM per panel and with one GEMM per block."""
    x, w, b = make(rows, n, dtype, "cuda", bias=True)
    with forced_route("panels", panels_batched=batched):
        names = _kernel_names(lambda: check(x, w, b, transpose=(n % 2 == 0), workspace_bytes=workspace_bytes))
    assert "copy_blocks_kernel" in names and "square_matmul_wgmma" not in names and "square_matmul_ffma" not in names


@requires_cuda
def test_cuda_fp32_follows_allow_tf32():
    x, w, _ = make(2048, 1024, torch.float32, "cuda")
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        for ws in (None, 0):
            check(x.clone(), w, workspace_bytes=ws)  # strict fp32 tolerance
        torch.backends.cuda.matmul.allow_tf32 = True
        for ws in (None, 0):
            y = x.clone()
            make_inplace.square_matmul_(y, w, workspace_bytes=ws)
            assert relative_error(y, reference(x, w, None, False)) < 2e-3  # tf32 accuracy
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _memory_case(rows, n, dtype, workspace_bytes):
    fresh_cuda_memory()
    x, w, b = make(rows, n, dtype, "cuda", bias=True)
    # cuBLAS/cuBLASLt handles and workspaces are created once per stream on first
    # use; warm them (the panel route uses mm and addmm) outside the measurement.
    torch.matmul(x[:2], w)
    torch.addmm(b, x[:2], w)
    fresh_cuda_memory()
    ours = cuda_peak_extra(lambda: make_inplace.square_matmul_(x, w, b, workspace_bytes=workspace_bytes))
    fresh_cuda_memory()
    x2 = torch.randn_like(x)
    theirs = cuda_peak_extra(lambda: torch.addmm(b, x2, w))
    return x, ours, theirs


@requires_cuda
@pytest.mark.parametrize("rows,n,dtype", [(65536, 4096, torch.bfloat16), (16384, 1024, torch.bfloat16), (40000, 1024, torch.float32)])
@pytest.mark.fresh_process
def test_cuda_memory_within_default_bound(rows, n, dtype):
    x, ours, theirs = _memory_case(rows, n, dtype, None)
    bound = min(x.nbytes // 16, 64 << 20)
    assert ours.allocated <= bound and ours.reserved <= bound, (ours, bound)
    assert theirs.allocated >= x.nbytes and theirs.reserved >= x.nbytes, theirs


@requires_cuda
@pytest.mark.parametrize(
    "rows,n,dtype",
    [(16384, 4096, torch.bfloat16), (20000, 777, torch.float32), (20000, 776, torch.float32), (4096, 1000, torch.float16)],
)
@pytest.mark.fresh_process
def test_cuda_zero_workspace_adds_no_allocation(rows, n, dtype):
    x, ours, theirs = _memory_case(rows, n, dtype, 0)
    assert ours.allocated == 0 and ours.reserved == 0, ours
    assert theirs.allocated >= x.nbytes and theirs.reserved >= x.nbytes, theirs


@requires_cuda
@pytest.mark.parametrize("workspace_bytes", [None, 0, 64 << 20])
def test_cuda_runs_on_the_current_stream_after_pending_work(workspace_bytes):
    x, w, b = make(8192, 2048, torch.bfloat16, "cuda", bias=True)
    source = torch.randn_like(x)
    expected = reference(source, w, b, False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)  # keep the stream busy so a wrong-stream launch would read stale x
        x.copy_(source)
        make_inplace.square_matmul_(x, w, b, workspace_bytes=workspace_bytes)
    stream.synchronize()
    assert relative_error(x, expected) < TOL[x.dtype]


@requires_cuda
@pytest.mark.fresh_process
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("workspace_bytes", [None, 0, 4 << 20])
@pytest.mark.parametrize("order", ["increasing", "decreasing", "alternating"])
def test_cuda_widths_in_any_order(dtype, workspace_bytes, order):
    """Each route's kernels (wgmma, FFMA, panels, zero-workspace) over widths in
    every order: cached launch facts must hold whatever ran before."""
    for n in launch_orders([256, 512, 768, 1024, 2048, 4096])[order]:
        x, w, b = make(4096, n, dtype, "cuda", bias=True)
        check(x, w, b, transpose=(n % 1024 == 0), workspace_bytes=workspace_bytes)


# ------------------------------------------------- CUDA: the Hopper wgmma kernel

HOPPER = CUDA and torch.cuda.get_device_capability() == (9, 0)
requires_hopper = pytest.mark.skipif(not HOPPER, reason="needs an sm_90 GPU (H100/H200)")


def _kernel_names(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events())


def _check_kernel_with_sentinel(kernel, rows, n, dtype, transpose, workspace_bytes):
    """Runs square_matmul_ on the first `rows` rows of a buffer one row longer: the named
    kernel must run, the result must match float64, and the row after x must stay unwritten.
    Odd row counts also add a bias."""
    x, w, b = make(rows, n, dtype, "cuda", bias=(rows % 2 == 1))
    x_extra = torch.randn(rows + 1, n, dtype=dtype, device="cuda")
    x_extra[:rows] = x
    sentinel = x_extra[rows].clone()
    view = x_extra[:rows]
    expected = reference(view, w, b, transpose)
    names = _kernel_names(
        lambda: make_inplace.square_matmul_(view, w, b, transpose=transpose, workspace_bytes=workspace_bytes)
    )
    assert kernel in names, names
    assert relative_error(view, expected) < TOL[dtype], relative_error(view, expected)
    assert torch.equal(x_extra[rows], sentinel)
    return names


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "rows,n",
    # n: one tile, a partial tile, a partial k-step, clusters of 1-16 CTAs, odd
    # tile counts, and two tiles per CTA (n > 4096); rows: partial, single and
    # several row-blocks, and more row-blocks than clusters.
    [(1, 8), (5, 40), (127, 256), (128, 264), (129, 1000), (1000, 1024), (4097, 768), (300, 2056),
     (1025, 4096), (257, 4104), (130, 8192), (20000, 512)],
)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("tiles_per_cta", [None, 2], ids=["auto", "2"])
@pytest.mark.parametrize("col_tile", [None, 192], ids=["width-auto", "192"])
@pytest.mark.parametrize(
    "mode,workspace_bytes",
    [("wgmma_clusters", 0), ("wgmma_grid", 0), ("wgmma_counted", 4 << 20)],
    ids=["clusters", "grid", "counters"],
)
def test_cuda_wgmma_kernel_values(dtype, rows, n, transpose, tiles_per_cta, col_tile, mode, workspace_bytes):
    """Every shape the Hopper kernel takes goes to it, with the policy's choice of
    tiles per CTA and with two forced (the second held in registers and written
    once the row-block is free), with the policy's tile width and with 192 columns
    forced, in all three modes: clusters and the grid's barrier (no workspace), and
    per-row-block counters (a 4 MiB bound)."""
    # Where clusters of 192-column tiles do not fit (more than 16 CTAs), the
    # policy takes that width at the grid's barrier: 192 columns run every time.
    with forced_route(mode, tiles_per_cta=tiles_per_cta, col_tile=col_tile):
        names = _check_kernel_with_sentinel("square_matmul_wgmma", rows, n, dtype, transpose, workspace_bytes)
    if col_tile == 192:
        assert re.search(r"square_matmul_wgmma_kernel<[^>]*, 192>", names), names


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "rows,n",
    # n: the narrowest (three k-steps, one partial), one half-tile, a partial
    # k-step, a partial second half, full rows; rows: partial, single and
    # several row-blocks, more row-blocks than CTAs (also at the narrowest).
    [(1, 136), (9000, 136), (63, 264), (64, 392), (65, 448), (1000, 504), (4097, 512), (20000, 512)],
)
@pytest.mark.parametrize("transpose", [False, True])
def test_cuda_wgmma_rows_kernel_values(dtype, rows, n, transpose):
    """Every width from 136 to 512 goes to the 64-row kernel when forced (no
    workspace needed), with a bias on odd row counts."""
    with forced_route("wgmma_rows"):
        _check_kernel_with_sentinel("square_matmul_wgmma_rows", rows, n, dtype, transpose, 0)


@requires_hopper
@pytest.mark.parametrize("n", [8, 128])
def test_cuda_wgmma_rows_kernel_declines_fewer_than_three_k_steps(n):
    """Rows of two k-steps or fewer take another kernel even when forced, still correct."""
    x, w, b = make(9000, n, torch.bfloat16, "cuda", bias=True)
    expected = reference(x, w, b, False)
    with forced_route("wgmma_rows"):
        names = _kernel_names(lambda: make_inplace.square_matmul_(x, w, b, workspace_bytes=0))
    assert "square_matmul_wgmma_rows" not in names, names
    assert relative_error(x, expected) < TOL[torch.bfloat16]


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("workspace_bytes", [None, 0])
@pytest.mark.fresh_process
def test_cuda_wgmma_rows_kernel_runs_at_the_benchmark_shape(dtype, workspace_bytes):
    """(16384, 512) takes the 64-row kernel by default, allocating nothing in either mode."""
    rows, n = 16384, 512
    x, ours, _ = _memory_case(rows, n, dtype, workspace_bytes)
    assert ours.allocated == 0 and ours.reserved == 0, ours
    w = torch.randn(n, n, dtype=dtype, device="cuda") / n**0.5
    names = _kernel_names(lambda: make_inplace.square_matmul_(x, w, workspace_bytes=workspace_bytes))
    assert "square_matmul_wgmma_rows" in names, names


@requires_hopper
@pytest.mark.parametrize("rows,n,dtype", [(40000, 1024, torch.bfloat16), (16384, 4096, torch.float16), (65536, 768, torch.bfloat16)])
@pytest.mark.parametrize("workspace_bytes", [None, 0])
@pytest.mark.fresh_process
def test_cuda_wgmma_kernel_runs_at_the_benchmark_shapes(rows, n, dtype, workspace_bytes):
    """The benchmark shapes in 16-bit types take the Hopper kernel: the default mode
    allocates only its row-block counters (within the bound), workspace_bytes=0 nothing
    (its groups meet at the grid's barrier)."""
    x, ours, _ = _memory_case(rows, n, dtype, workspace_bytes)
    if workspace_bytes == 0:
        assert ours.allocated == 0 and ours.reserved == 0, ours
    else:
        bound = min(x.nbytes // 16, 64 << 20)
        assert 0 < ours.allocated <= (rows + 127) // 128 * 4 + 512 and ours.reserved <= bound, ours
    w = torch.randn(n, n, dtype=dtype, device="cuda") / n**0.5
    assert "square_matmul_wgmma" in _kernel_names(lambda: make_inplace.square_matmul_(x, w, workspace_bytes=workspace_bytes))


@requires_hopper
@pytest.mark.parametrize("transpose", [False, True])
def test_cuda_wgmma_counters_start_from_any_contents(transpose):
    """The counted mode's counters come from the caching allocator as they are
    (the kernel zeroes them itself): a block of their size left all ones, which
    the allocator hands back for them, must not let a group write early."""
    rows, n = 40000, 1024
    counter_bytes = (rows + 127) // 128 * 4
    for _ in range(3):
        x, w, b = make(rows, n, torch.bfloat16, "cuda", bias=True)
        expected = reference(x, w, b, transpose)
        dirty = torch.full((counter_bytes,), 0xFF, dtype=torch.uint8, device="cuda")
        del dirty
        names = _kernel_names(lambda: make_inplace.square_matmul_(x, w, b, transpose=transpose))
        assert "square_matmul_wgmma" in names, names
        assert relative_error(x, expected) < TOL[torch.bfloat16], relative_error(x, expected)


@requires_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_wgmma_kernel_declines_misaligned_x(dtype):
    """TMA needs 16-byte aligned rows: an x at a 2-byte offset takes another kernel, still
    correct, even with the wgmma route forced."""
    rows, n = 4096, 1024
    storage = torch.randn(rows * n + 1, dtype=dtype, device="cuda")
    x = storage[1:].view(rows, n)
    w = torch.randn(n, n, dtype=dtype, device="cuda") / n**0.5
    expected = reference(x, w, None, False)
    with forced_route("wgmma"):
        names = _kernel_names(lambda: make_inplace.square_matmul_(x, w, workspace_bytes=0))
    assert "square_matmul_wgmma" not in names, names
    assert relative_error(x, expected) < TOL[dtype]


# ------------------------------------------------- CUDA: the fp32 FFMA kernel

FFMA_WORKSPACE = 4 << 20  # room for the row-block counters (the kernel needs a 2 MiB bound)


@requires_cuda
@pytest.mark.parametrize(
    "rows,n",
    # n: the smallest width, partial tiles and partial k-slices, one to 64
    # column tiles per group (odd counts: the last CTA of two tiles has one);
    # rows: partial, single and several row-blocks, and more row-blocks than
    # groups.
    [(1, 4), (5, 36), (127, 128), (128, 132), (129, 1000), (1000, 1024), (4097, 768), (300, 2052),
     (1025, 4096), (20000, 512), (65, 8192)],
)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("tiles_per_cta", [None, 2], ids=["auto", "2"])
@pytest.mark.parametrize("workspace_bytes", [0, FFMA_WORKSPACE], ids=["grid-barrier", "counters"])
def test_cuda_ffma_kernel_values(rows, n, transpose, tiles_per_cta, workspace_bytes):
    """Every fp32 shape the FFMA kernel takes goes to it (forced_route("ffma")), with the
    policy's choice of tiles per CTA and with two forced (the first parked in shared
    memory until the row-block is free), in both modes: row-block counters (a 4 MiB
    bound) and the grid barrier once a round (no memory); a sentinel row after x must
    stay unwritten."""
    assert not torch.backends.cuda.matmul.allow_tf32
    kernel = f"square_matmul_ffma_kernel<{str(transpose).lower()}, {tiles_per_cta or ''}"
    with forced_route("ffma", tiles_per_cta=tiles_per_cta):
        names = _check_kernel_with_sentinel(kernel, rows, n, torch.float32, transpose, workspace_bytes)
    counted = "true" if workspace_bytes else "false"  # the counters' variant, or the grid barrier's
    assert re.search(rf"square_matmul_ffma_kernel<\w+, \d, {counted}>", names), names


@requires_cuda
@pytest.mark.parametrize("rows,n,workspace_bytes", [(r, n, ws) for r, n in [(40000, 1024), (16384, 2048), (65536, 768),
                                                                           (16384, 512)] for ws in (None, 0)]
                         + [(16384, 4096, 0)])
@pytest.mark.fresh_process
def test_cuda_ffma_kernel_runs_at_the_benchmark_shapes(rows, n, workspace_bytes):
    """The fp32 benchmark shapes take the FFMA kernel: below n = 4096 the default mode
    allocates only its row-block counters (within the bound); workspace_bytes=0 meets at
    the grid barrier and allocates nothing. (With a workspace n = 4096 keeps the panels:
    see test_cuda_ffma_kernel_declines.)"""
    x, ours, _ = _memory_case(rows, n, torch.float32, workspace_bytes)
    if workspace_bytes == 0:
        assert ours.allocated == 0 and ours.reserved == 0, ours
    else:
        bound = min(x.nbytes // 16, 64 << 20)
        assert 0 < ours.allocated <= (rows + 127) // 128 * 4 + 512 and ours.reserved <= bound, ours
    w = torch.randn(n, n, device="cuda") / n**0.5
    names = _kernel_names(lambda: make_inplace.square_matmul_(x, w, workspace_bytes=workspace_bytes))
    assert "square_matmul_ffma" in names, names


@requires_cuda
@pytest.mark.parametrize(
    "case", ["x at a 4-byte offset", "bias at a 4-byte offset", "n not a multiple of 4", "tf32 allowed", "contiguous panels at n = 4096"]
)
def test_cuda_ffma_kernel_declines(case):
    """Cases the FFMA kernel does not take go elsewhere, still correct: 16-byte loads need
    aligned x, w, bias and n % 4 == 0; with TF32 allowed, cuBLAS's TF32 is faster (these
    four decline even with the route forced); from n = 4096 a contiguous panel buffer
    (bound >= 10 MiB) keeps cuBLAS's panels (the policy's choice: its 16 row-blocks
    would otherwise take the FFMA kernel)."""
    rows, n = 2048, 1026 if case == "n not a multiple of 4" else 1024
    if case == "contiguous panels at n = 4096":
        rows, n = 2048, 4096
    storage = torch.randn(rows * n + 1, device="cuda")
    x = storage[1:].view(rows, n) if case == "x at a 4-byte offset" else storage[: rows * n].view(rows, n)
    w = torch.randn(n, n, device="cuda") / n**0.5
    b = torch.randn(n + 1, device="cuda")[1:] if case == "bias at a 4-byte offset" else None
    expected = reference(x, w, b, False)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = case == "tf32 allowed"
    try:
        workspace = 16 << 20 if case == "contiguous panels at n = 4096" else FFMA_WORKSPACE
        with forced_route(None if case == "contiguous panels at n = 4096" else "ffma"):
            names = _kernel_names(lambda: make_inplace.square_matmul_(x, w, b, workspace_bytes=workspace))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert "square_matmul_ffma" not in names, names
    assert relative_error(x, expected) < (2e-3 if case == "tf32 allowed" else TOL[torch.float32])


# ------------------------------------------- CUDA: the zero-workspace waves kernel


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 1), (33, 7), (1000, 1030), (4097, 768)])
@pytest.mark.parametrize("transpose", [False, True])
def test_cuda_waves_kernel_values(dtype, rows, n, transpose):
    """The zero-workspace waves kernel (forced_route("waves")) on any GPU and dtype:
    odd widths, partial row-blocks; a sentinel row after x must stay unwritten."""
    with forced_route("waves"):
        _check_kernel_with_sentinel("square_matmul_waves", rows, n, dtype, transpose, 0)
