"""outer_product and its backward against a float64 plain-torch reference."""

from __future__ import annotations

import pytest
import torch

import make_inplace
from make_inplace._measure import cuda_peak_extra, fresh_cuda_memory
from conftest import device_mismatch

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TOL = {
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
}
SIZES = [1, 5, 511, 512, 1025]


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[..., :, None] * b[..., None, :]


def reference_grads(grad_out, a, b):
    g = grad_out.double()
    return (g * b.double()[..., None, :]).sum(-1), (g * a.double()[..., :, None]).sum(-2)


def close(actual, expected, dtype, scale=1.0):
    tol = TOL[dtype]
    torch.testing.assert_close(
        actual.double().cpu(), expected.double().cpu(), rtol=tol["rtol"], atol=tol["atol"] * scale
    )


def make(shape, dtype, device):
    return torch.randn(shape, dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("m", SIZES)
def test_forward_into_out(device, dtype, n, m):
    a, b = make((3, n), dtype, device), make((3, m), dtype, device)
    out = torch.full((3, n, m), float("nan"), dtype=dtype, device=device)
    ptr = out.data_ptr()
    assert make_inplace.outer_product(a, b, out=out) is out and out.data_ptr() == ptr
    expected = reference(a.double(), b.double())
    close(out, expected, dtype)
    close(make_inplace.outer_product(a, b), expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("m", SIZES)
def test_backward_into_buffers(device, dtype, n, m):
    a, b = make((3, n), dtype, device), make((3, m), dtype, device)
    grad_out = make((3, n, m), dtype, device)
    grad_out_before = grad_out.clone()
    grad_a = torch.full_like(a, float("nan"))
    grad_b = torch.full_like(b, float("nan"))
    ptrs = grad_a.data_ptr(), grad_b.data_ptr()
    ga, gb = make_inplace.outer_product_backward(grad_out, a, b, grad_a=grad_a, grad_b=grad_b)
    assert ga is grad_a and gb is grad_b and (grad_a.data_ptr(), grad_b.data_ptr()) == ptrs
    assert torch.equal(grad_out, grad_out_before)
    ref_a, ref_b = reference_grads(grad_out, a, b)
    # Sums of m (or n) products: absolute error grows like sqrt(length).
    close(grad_a, ref_a, dtype, scale=m**0.5)
    close(grad_b, ref_b, dtype, scale=n**0.5)

    a0, b0 = torch.randn_like(grad_a), torch.randn_like(grad_b)
    grad_a.copy_(a0)
    grad_b.copy_(b0)
    make_inplace.outer_product_backward(grad_out, a, b, grad_a=grad_a, grad_b=grad_b, accumulate=True)
    close(grad_a, a0.double() + ref_a, dtype, scale=m**0.5)
    close(grad_b, b0.double() + ref_b, dtype, scale=n**0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "lead", [(), (0,), (2, 3), (4, 0)], ids=["no-batch", "zero-batch", "2x3", "4x0"]
)
def test_batch_shapes(device, dtype, lead):
    a, b = make((*lead, 7), dtype, device), make((*lead, 9), dtype, device)
    out = make_inplace.outer_product(a, b)
    assert out.shape == (*lead, 7, 9)
    close(out, reference(a.double(), b.double()), dtype)
    grad_out = make((*lead, 7, 9), dtype, device)
    ga, gb = make_inplace.outer_product_backward(grad_out, a, b)
    ref_a, ref_b = reference_grads(grad_out, a, b)
    close(ga, ref_a, dtype, scale=3)
    close(gb, ref_b, dtype, scale=3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,m", [(0, 4), (4, 0)])
def test_empty_reduction_writes_zeros(device, n, m):
    a, b = make((2, n), torch.float32, device), make((2, m), torch.float32, device)
    grad_a = torch.full_like(a, float("nan"))
    grad_b = torch.full_like(b, float("nan"))
    make_inplace.outer_product_backward(make((2, n, m), torch.float32, device), a, b, grad_a=grad_a, grad_b=grad_b)
    assert torch.equal(grad_a, torch.zeros_like(a)) and torch.equal(grad_b, torch.zeros_like(b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,m", [(65536, 3), (3, 65536), (65536, 64)])
def test_wide_rows_and_columns(device, n, m):
    dtype = torch.bfloat16
    a, b = make((1, n), dtype, device), make((1, m), dtype, device)
    close(make_inplace.outer_product(a, b), reference(a.double(), b.double()), dtype)
    grad_out = make((1, n, m), dtype, device)
    ga, gb = make_inplace.outer_product_backward(grad_out, a, b)
    ref_a, ref_b = reference_grads(grad_out, a, b)
    close(ga, ref_a, dtype, scale=m**0.5)
    close(gb, ref_b, dtype, scale=n**0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_inputs(device, dtype):
    batch, n, m = 6, 40, 48
    a = make((n, batch), dtype, device).t()  # strides (1, batch)
    b = make((batch, 2 * m), dtype, device)[:, ::2]  # element stride 2
    grad_out = make((batch, m, n), dtype, device).transpose(1, 2)
    assert not (a.is_contiguous() or b.is_contiguous() or grad_out.is_contiguous())
    close(make_inplace.outer_product(a, b), reference(a.double(), b.double()), dtype)
    ga, gb = make_inplace.outer_product_backward(grad_out, a, b)
    ref_a, ref_b = reference_grads(grad_out, a, b)
    close(ga, ref_a, dtype, scale=m**0.5)
    close(gb, ref_b, dtype, scale=n**0.5)
    # Leading dims that cannot be merged into one stride, and a broadcast grad_out.
    a4 = make((3, 4, n), dtype, device).transpose(0, 1)
    b4 = make((3, 4, m), dtype, device).transpose(0, 1)
    close(make_inplace.outer_product(a4, b4), reference(a4.double(), b4.double()), dtype)
    ones = torch.ones(1, 1, 1, 1, dtype=dtype, device=device).expand(4, 3, n, m)
    ga, gb = make_inplace.outer_product_backward(ones, a4, b4)
    ref_a, ref_b = reference_grads(ones, a4, b4)
    close(ga, ref_a, dtype, scale=m**0.5)
    close(gb, ref_b, dtype, scale=n**0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_misaligned_buffers(device, dtype):
    batch, n, m = 4, 16, 64
    a, b = make((batch, n), dtype, device), make((batch, m), dtype, device)
    out = torch.full((batch * n * m + 1,), float("nan"), dtype=dtype, device=device)[1:].view(batch, n, m)
    make_inplace.outer_product(a, b, out=out)
    close(out, reference(a.double(), b.double()), dtype)
    grad_out = make((batch, n, m), dtype, device)
    grad_b = torch.full((batch * m + 1,), float("nan"), dtype=dtype, device=device)[1:].view(batch, m)
    make_inplace.outer_product_backward(grad_out, a, b, grad_b=grad_b)
    close(grad_b, reference_grads(grad_out, a, b)[1], dtype, scale=n**0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("needs", ["both", "a", "b"])
def test_autograd_matches_reference(device, dtype, needs):
    a = make((5, 33), dtype, device).requires_grad_(needs in ("both", "a"))
    b = make((5, 65), dtype, device).requires_grad_(needs in ("both", "b"))
    grad_out = make((5, 33, 65), dtype, device)
    out = make_inplace.outer_product(a, b)
    assert out.requires_grad
    out.backward(grad_out)
    ref_a, ref_b = reference_grads(grad_out, a.detach(), b.detach())
    if a.requires_grad:
        close(a.grad, ref_a, dtype, scale=8)
    else:
        assert a.grad is None
    if b.requires_grad:
        close(b.grad, ref_b, dtype, scale=6)
    else:
        assert b.grad is None


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    a = make((2, 3, 4), torch.float64, device).requires_grad_()
    b = make((2, 3, 5), torch.float64, device).requires_grad_()
    assert torch.autograd.gradcheck(make_inplace.outer_product, (a, b))
    strided = make((5, 2, 3), torch.float64, device).permute(1, 2, 0).requires_grad_()
    assert torch.autograd.gradcheck(make_inplace.outer_product, (a, strided))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(device, dtype):
    a, b = make((3, 17), dtype, device), make((3, 40), dtype, device)
    out = torch.empty(3, 17, 40, dtype=dtype, device=device)
    torch.library.opcheck(torch.ops.make_inplace.outer_product.default, (a, b), {"out": out})
    grad_out = make((3, 17, 40), dtype, device)
    op = torch.ops.make_inplace.outer_product_backward.default
    for accumulate in (False, True):
        torch.library.opcheck(
            op, (grad_out, a, b, accumulate), {"grad_a": torch.empty_like(a), "grad_b": torch.empty_like(b)}
        )
    torch.library.opcheck(op, (grad_out, a, b, False), {"grad_a": None, "grad_b": torch.empty_like(b)})
    torch.library.opcheck(op, (grad_out, a, b, False), {"grad_a": torch.empty_like(a), "grad_b": None})


@pytest.mark.parametrize("device", DEVICES)
def test_out_while_requiring_grad_is_an_error(device):
    a, b = make((2, 3), torch.float32, device), make((2, 4), torch.float32, device)
    out = torch.zeros(2, 3, 4, device=device)
    b.requires_grad_()
    with pytest.raises(RuntimeError, match="out= arguments don't support automatic differentiation"):
        make_inplace.outer_product(a, b, out=out)
    assert torch.equal(out, torch.zeros_like(out))
    with torch.no_grad():
        make_inplace.outer_product(a, b, out=out)
    close(out, reference(a.double(), b.detach().double()), torch.float32)
    with pytest.raises(RuntimeError, match="not differentiable"):
        make_inplace.outer_product_backward(torch.randn(2, 3, 4, device=device), a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_out_bumps_version_so_misuse_is_caught(device):
    a, b = make((2, 3), torch.float32, device), make((2, 4), torch.float32, device)
    out = torch.zeros(2, 3, 4, device=device, requires_grad=True).clone()
    loss = (out * out).sum()
    version = out._version
    with torch.no_grad():
        make_inplace.outer_product(a, b, out=out)
    assert out._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def _bad_calls(device):
    f32 = dict(dtype=torch.float32, device=device)
    a, b = torch.randn(2, 3, **f32), torch.randn(2, 4, **f32)
    out = torch.zeros(2, 3, 4, **f32)
    grad_out = torch.randn(2, 3, 4, **f32)
    ga, gb = torch.zeros(2, 3, **f32), torch.zeros(2, 4, **f32)
    fwd = dict(a=a, b=b, out=out)
    bwd = dict(grad_out=grad_out, a=a, b=b, grad_a=ga, grad_b=gb)
    big = torch.zeros(64, **f32)
    return [
        ("fwd", dict(fwd, b=torch.randn(3, 4, **f32)), "b's leading dimensions must equal a's"),
        ("fwd", dict(fwd, b=torch.randn(2, 1, 4, **f32)), "b's leading dimensions must equal a's"),
        ("fwd", dict(fwd, a=torch.tensor(1.0, **f32)), "a must have shape"),
        ("fwd", dict(fwd, out=torch.zeros(2, 3, 5, **f32)), "out must have shape"),
        ("fwd", dict(fwd, out=torch.zeros(2, 4, 3, **f32)), "out must have shape"),
        ("fwd", dict(fwd, out=torch.zeros(2, 3, 4, dtype=torch.float16, device=device)), "out must have the same dtype"),
        ("fwd", dict(fwd, out=torch.zeros(2, 4, 3, **f32).transpose(1, 2)), "out must be contiguous"),
        ("fwd", dict(fwd, b=b.double()), "b must have the same dtype"),
        ("fwd", dict(fwd, a=a.long(), b=b.long(), out=out.long()), "a must have dtype"),
        ("fwd", dict(fwd, out=big[:24].view(2, 3, 4), a=big[20:26].view(2, 3)), "a must not share memory with out"),
        ("fwd", dict(fwd, out=big[:24].view(2, 3, 4), b=big[23:31].view(2, 4)), "b must not share memory with out"),
        ("bwd", dict(bwd, grad_out=torch.randn(2, 3, 5, **f32)), "grad_out must have shape"),
        ("bwd", dict(bwd, grad_out=torch.randn(3, 3, 4, **f32)), "grad_out must have shape"),
        ("bwd", dict(bwd, b=torch.randn(1, 4, **f32)), "b's leading dimensions must equal a's"),
        ("bwd", dict(bwd, grad_a=torch.zeros(2, 4, **f32)), "grad_a must have shape"),
        ("bwd", dict(bwd, grad_b=torch.zeros(2, 3, **f32)), "grad_b must have shape"),
        ("bwd", dict(bwd, grad_b=torch.zeros(2, 4, dtype=torch.float64, device=device)), "grad_b must have the same dtype"),
        ("bwd", dict(bwd, grad_a=torch.zeros(3, 2, **f32).t()), "grad_a must be contiguous"),
        ("bwd", dict(bwd, grad_out=grad_out.half()), "grad_out must have the same dtype"),
        ("bwd", dict(bwd, grad_out=grad_out.int(), a=a.int(), b=b.int(), grad_a=ga.int(), grad_b=gb.int()), "a must have dtype"),
        ("bwd", dict(bwd, grad_a=grad_out.view(-1)[:6].view(2, 3)), "grad_out must not share memory with grad_a"),
        ("bwd", dict(bwd, grad_b=b), "b must not share memory with grad_b"),
        ("bwd", dict(bwd, grad_b=big[:8].view(2, 4), grad_a=big[7:13].view(2, 3)), "grad_b must not share memory with grad_a"),
    ]


def _run(kind, kw):
    if kind == "fwd":
        return make_inplace.outer_product(kw["a"], kw["b"], out=kw["out"])
    return make_inplace.outer_product_backward(
        kw["grad_out"], kw["a"], kw["b"], grad_a=kw["grad_a"], grad_b=kw["grad_b"]
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(len(_bad_calls("cpu"))))
def test_bad_input_names_argument_and_writes_nothing(device, case):
    kind, kw, message = _bad_calls(device)[case]
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    with pytest.raises((RuntimeError, ValueError), match=message):
        _run(kind, kw)
    for k, v in before.items():
        assert torch.equal(kw[k], v), f"{k} was written by a rejected call"


# Wide rows. Rows of at most 1024 contiguous 16-byte packs (16-bit, float32)
# are read whole by each CTA: one CTA an item when items are many (300, 100,
# 70), and on sm_90 a cluster sharing each item when they are few (40, 20, 12:
# row counts that do not divide among the CTAs; at 520 columns most lanes have
# no second pack), column sums meeting through distributed shared memory. Other rows
# (1025 columns, float64, float32 at 8192 and 8200 columns) are swept strip by
# strip, row sums in shared memory or, for few items on sm_90, across a
# cluster. Same results every way, accumulate too, and the same bits again.
@CUDA
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "batch,n,m",
    [(300, 33, 1025), (300, 33, 2048), (70, 101, 1288), (40, 257, 2048), (100, 1, 4096), (12, 100, 520),
     (20, 70, 8192), (20, 33, 8200)],
)
def test_cuda_wide_rows(dtype, batch, n, m):
    a, b = make((batch, n), dtype, "cuda"), make((batch, m), dtype, "cuda")
    grad_out = make((batch, n, m), dtype, "cuda")
    grad_a, grad_b = torch.full_like(a, float("nan")), torch.full_like(b, float("nan"))
    make_inplace.outer_product_backward(grad_out, a, b, grad_a=grad_a, grad_b=grad_b)
    ref_a, ref_b = reference_grads(grad_out, a, b)
    close(grad_a, ref_a, dtype, scale=m**0.5)
    close(grad_b, ref_b, dtype, scale=n**0.5)
    a0, b0 = grad_a.clone(), grad_b.clone()
    make_inplace.outer_product_backward(grad_out, a, b, grad_a=grad_a, grad_b=grad_b, accumulate=True)
    close(grad_a, a0.double() + ref_a, dtype, scale=2 * m**0.5)
    close(grad_b, b0.double() + ref_b, dtype, scale=2 * n**0.5)
    again_a, again_b = torch.empty_like(a), torch.empty_like(b)
    make_inplace.outer_product_backward(grad_out, a, b, grad_a=again_a, grad_b=again_b)
    assert torch.equal(again_a, a0) and torch.equal(again_b, b0), "not deterministic"


# Inputs on `device`, one argument on `other`: a real device pair, and on CPU a meta mix.
# (ids: the GPU run deselects "cpu" ids with -k "not cpu".)
@pytest.mark.parametrize("device,other", [pytest.param("cuda", "cpu", marks=CUDA, id="cuda"),
                                          pytest.param("cpu", "meta", id="cpu-meta")])
def test_wrong_device_buffer(device, other):
    a, b = make((2, 3), torch.float32, device), make((2, 4), torch.float32, device)
    out = torch.zeros(2, 3, 4, device=other)
    with pytest.raises(RuntimeError, match=device_mismatch("outer_product", "out", out, "a", a)):
        make_inplace.outer_product(a, b, out=out)
    if other != "meta":
        assert torch.equal(out, torch.zeros(2, 3, 4, device=other))
    other_b = b.to(other)
    with pytest.raises(RuntimeError, match=device_mismatch("outer_product", "b", other_b, "a", a)):
        make_inplace.outer_product(a, other_b)
    grad_b, grad_out = torch.zeros(2, 4, device=other), torch.randn(2, 3, 4, device=device)
    with pytest.raises(RuntimeError, match=device_mismatch("outer_product_backward", "grad_b", grad_b,
                                                            "grad_out", grad_out)):
        make_inplace.outer_product_backward(grad_out, a, b, grad_b=grad_b)
    if other != "meta":
        assert torch.equal(grad_b, torch.zeros(2, 4, device=other))


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batch,n,m", [(512, 1024, 1024), (64, 4096, 256)])
@pytest.mark.fresh_process
def test_cuda_caller_buffers_allocate_nothing(dtype, batch, n, m):
    fresh_cuda_memory()
    a, b = make((batch, n), dtype, "cuda"), make((batch, m), dtype, "cuda")
    grad_out = make((batch, n, m), dtype, "cuda")
    out = torch.empty(batch, n, m, dtype=dtype, device="cuda")
    grad_a, grad_b = torch.empty_like(a), torch.empty_like(b)
    make_inplace.outer_product(a, b, out=out)  # warm up: library state, not tensors
    torch.cuda.synchronize()

    ours_fwd = cuda_peak_extra(lambda: make_inplace.outer_product(a, b, out=out))
    ours_bwd = cuda_peak_extra(
        lambda: make_inplace.outer_product_backward(grad_out, a, b, grad_a=grad_a, grad_b=grad_b, accumulate=True)
    )
    assert (ours_fwd.reserved, ours_fwd.allocated) == (0, 0)
    assert (ours_bwd.reserved, ours_bwd.allocated) == (0, 0)

    ref_fwd = cuda_peak_extra(lambda: reference(a, b))
    assert ref_fwd.allocated >= out.nbytes and ref_fwd.reserved > 0

    def torch_backward():
        al, bl = a.detach().requires_grad_(), b.detach().requires_grad_()
        return torch.autograd.grad(reference(al, bl), (al, bl), grad_out)

    ref_bwd = cuda_peak_extra(torch_backward)
    assert ref_bwd.allocated > 0 and ref_bwd.reserved > 0
    close(out, reference(a.double(), b.double()), dtype)


@CUDA
def test_cuda_runs_on_current_stream():
    a, b = make((64, 1024), torch.float32, "cuda"), make((64, 1024), torch.float32, "cuda")
    out = torch.full((64, 1024, 1024), float("nan"), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        make_inplace.outer_product(a, b, out=out)
        snapshot = out.clone()  # ordered after the kernel only if it ran on `side`
    torch.cuda.synchronize()
    close(snapshot, reference(a.double(), b.double()), torch.float32)


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("batch,n,m", [(4096, 256, 256), (512, 1024, 1024), (64, 4096, 4096), (2, 65536, 4096)])
def test_cuda_benchmark_shapes(dtype, batch, n, m):
    a, b = make((batch, n), dtype, "cuda"), make((batch, m), dtype, "cuda")
    out = make_inplace.outer_product(a, b)
    # Spot-check rows against the reference (the full float64 reference would not fit).
    rows = torch.randint(0, batch, (2,), device="cuda")
    close(out[rows], reference(a[rows].double(), b[rows].double()), dtype)
    del out
    grad_out = make((batch, n, m), dtype, "cuda")
    ga, gb = make_inplace.outer_product_backward(grad_out, a, b)
    g = grad_out[rows].float()
    close(ga[rows], (g * b[rows].float()[:, None, :]).sum(-1), dtype, scale=m**0.5)
    close(gb[rows], (g * a[rows].float()[:, :, None]).sum(-2), dtype, scale=n**0.5)
