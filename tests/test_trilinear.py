"""trilinear_interpolation and its backward against a float64 plain-torch reference."""

from __future__ import annotations

import pytest
import torch

import make_inplace
from make_inplace._testing import trilinear_reference
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




def make(n, f, dtype, device, spread=1.0):
    feats = torch.randn(n, 8, f, dtype=dtype, device=device)
    points = ((torch.rand(n, 3, dtype=torch.float64) * 2 - 1) * spread).to(dtype=dtype, device=device)
    return feats, points


def reference_grads(feats, points, grad_out):
    f64 = feats.detach().to(torch.float64, copy=True).requires_grad_()
    p64 = points.detach().to(torch.float64, copy=True).requires_grad_()
    trilinear_reference(f64, p64).backward(grad_out.double())
    return f64.grad, p64.grad


def close(actual, expected, dtype):
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), **TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 37, 4096])
@pytest.mark.parametrize("f", [1, 3, 32, 257])
def test_forward_into_out(device, dtype, n, f):
    feats, points = make(n, f, dtype, device)
    out = torch.full((n, f), float("nan"), dtype=dtype, device=device)
    ptr = out.data_ptr()
    result = make_inplace.trilinear_interpolation(feats, points, out=out)
    assert result is out and out.data_ptr() == ptr
    expected = trilinear_reference(feats.double(), points.double())
    close(out, expected, dtype)
    allocated = make_inplace.trilinear_interpolation(feats, points)
    assert allocated.shape == (n, f) and allocated.dtype == dtype
    close(allocated, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 37, 4096])
@pytest.mark.parametrize("f", [1, 3, 32, 257])
def test_backward_into_buffers(device, dtype, n, f):
    feats, points = make(n, f, dtype, device)
    grad_out = torch.randn(n, f, dtype=dtype, device=device)
    grad_out_before = grad_out.clone()
    grad_feats = torch.full((n, 8, f), float("nan"), dtype=dtype, device=device)
    grad_points = torch.full((n, 3), float("nan"), dtype=dtype, device=device)
    ptrs = grad_feats.data_ptr(), grad_points.data_ptr()
    gf, gp = make_inplace.trilinear_interpolation_backward(
        grad_out, points, feats, grad_feats=grad_feats, grad_points=grad_points
    )
    assert gf is grad_feats and gp is grad_points
    assert (grad_feats.data_ptr(), grad_points.data_ptr()) == ptrs
    assert torch.equal(grad_out, grad_out_before)
    ref_feats, ref_points = reference_grads(feats, points, grad_out)
    close(grad_feats, ref_feats, dtype)
    close(grad_points, ref_points, dtype)

    # accumulate=True adds to what the buffers hold.
    gf0, gp0 = torch.randn_like(grad_feats), torch.randn_like(grad_points)
    grad_feats.copy_(gf0)
    grad_points.copy_(gp0)
    make_inplace.trilinear_interpolation_backward(
        grad_out, points, feats, grad_feats=grad_feats, grad_points=grad_points, accumulate=True
    )
    close(grad_feats, gf0.double() + ref_feats.to(grad_feats.device), dtype)
    close(grad_points, gp0.double() + ref_points.to(grad_points.device), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_allocates_and_skips_points_without_feats(device, dtype):
    feats, points = make(37, 32, dtype, device)
    grad_out = torch.randn(37, 32, dtype=dtype, device=device)
    ref_feats, ref_points = reference_grads(feats, points, grad_out)
    gf, gp = make_inplace.trilinear_interpolation_backward(grad_out, points)
    assert gp is None
    close(gf, ref_feats, dtype)
    gf, gp = make_inplace.trilinear_interpolation_backward(grad_out, points, feats)
    close(gf, ref_feats, dtype)
    close(gp, ref_points, dtype)
    # Fresh buffers with accumulate start from zero.
    gf, gp = make_inplace.trilinear_interpolation_backward(grad_out, points, feats, accumulate=True)
    close(gf, ref_feats, dtype)
    close(gp, ref_points, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extrapolates_outside_unit_cube(device, dtype):
    feats, points = make(257, 5, dtype, device, spread=3.0)
    assert points.abs().max() > 1
    grad_out = torch.randn(257, 5, dtype=dtype, device=device)
    close(make_inplace.trilinear_interpolation(feats, points), trilinear_reference(feats.double(), points.double()), dtype)
    ref_feats, ref_points = reference_grads(feats, points, grad_out)
    gf, gp = make_inplace.trilinear_interpolation_backward(grad_out, points, feats)
    close(gf, ref_feats, dtype)
    close(gp, ref_points, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_inputs(device, dtype):
    n, f = 300, 64
    # feats with corners last, permuted to (N, 8, F); points as the transpose of (3, N);
    # grad_out as every other column of a wider tensor.
    feats = torch.randn(n, f, 8, dtype=dtype, device=device).permute(0, 2, 1)
    points = (torch.rand(3, n, device=device) * 2 - 1).to(dtype).t()
    grad_out = torch.randn(n, 2 * f, dtype=dtype, device=device)[:, ::2]
    assert not (feats.is_contiguous() or points.is_contiguous() or grad_out.is_contiguous())
    close(make_inplace.trilinear_interpolation(feats, points), trilinear_reference(feats.double(), points.double()), dtype)
    ref_feats, ref_points = reference_grads(feats, points, grad_out)
    gf, gp = make_inplace.trilinear_interpolation_backward(grad_out, points, feats)
    close(gf, ref_feats, dtype)
    close(gp, ref_points, dtype)
    # A broadcast (stride-0) grad_out, as autograd hands out for a sum().
    ones = torch.ones(1, 1, dtype=dtype, device=device).expand(n, f)
    gf, gp = make_inplace.trilinear_interpolation_backward(ones, points, feats)
    ref_feats, ref_points = reference_grads(feats, points, ones)
    close(gf, ref_feats, dtype)
    close(gp, ref_points, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_misaligned_buffers(device, dtype):
    # Buffers that start one element into an allocation cannot take 16-byte packs.
    n, f = 64, 32
    feats, points = make(n, f, dtype, device)
    grad_out = torch.randn(n, f, dtype=dtype, device=device)
    out = torch.full((n * f + 1,), float("nan"), dtype=dtype, device=device)[1:].view(n, f)
    make_inplace.trilinear_interpolation(feats, points, out=out)
    close(out, trilinear_reference(feats.double(), points.double()), dtype)
    grad_feats = torch.full((n * 8 * f + 1,), float("nan"), dtype=dtype, device=device)[1:].view(n, 8, f)
    make_inplace.trilinear_interpolation_backward(grad_out, points, feats, grad_feats=grad_feats)
    close(grad_feats, reference_grads(feats, points, grad_out)[0], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("needs", ["both", "feats", "points"])
def test_autograd_matches_reference(device, dtype, needs):
    feats, points = make(37, 33, dtype, device)
    feats.requires_grad_(needs in ("both", "feats"))
    points.requires_grad_(needs in ("both", "points"))
    grad_out = torch.randn(37, 33, dtype=dtype, device=device)
    out = make_inplace.trilinear_interpolation(feats, points)
    assert out.requires_grad
    out.backward(grad_out)
    ref_feats, ref_points = reference_grads(feats.detach(), points.detach(), grad_out)
    if feats.requires_grad:
        close(feats.grad, ref_feats, dtype)
    else:
        assert feats.grad is None
    if points.requires_grad:
        close(points.grad, ref_points, dtype)
    else:
        assert points.grad is None


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    feats, points = make(6, 5, torch.float64, device)
    feats.requires_grad_()
    points.requires_grad_()
    assert torch.autograd.gradcheck(make_inplace.trilinear_interpolation, (feats, points))
    # Non-contiguous feats (the kernels read strides) through autograd too.
    strided = torch.randn(6, 5, 8, dtype=torch.float64, device=device).permute(0, 2, 1).requires_grad_()
    assert torch.autograd.gradcheck(make_inplace.trilinear_interpolation, (strided, points))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(device, dtype):
    feats, points = make(37, 32, dtype, device)
    out = torch.empty(37, 32, dtype=dtype, device=device)
    torch.library.opcheck(torch.ops.make_inplace.trilinear_interpolation.default, (feats, points), {"out": out})
    grad_out = torch.randn(37, 32, dtype=dtype, device=device)
    grad_feats = torch.empty(37, 8, 32, dtype=dtype, device=device)
    grad_points = torch.empty(37, 3, dtype=dtype, device=device)
    op = torch.ops.make_inplace.trilinear_interpolation_backward.default
    for accumulate in (False, True):
        torch.library.opcheck(
            op, (grad_out, points, feats, accumulate), {"grad_feats": grad_feats, "grad_points": grad_points}
        )
    torch.library.opcheck(op, (grad_out, points, None, False), {"grad_feats": grad_feats, "grad_points": None})


@pytest.mark.parametrize("device", DEVICES)
def test_out_while_requiring_grad_is_an_error(device):
    feats, points = make(4, 3, torch.float32, device)
    out = torch.zeros(4, 3, device=device)
    feats.requires_grad_()
    with pytest.raises(RuntimeError, match="out= arguments don't support automatic differentiation"):
        make_inplace.trilinear_interpolation(feats, points, out=out)
    assert torch.equal(out, torch.zeros_like(out))
    with torch.no_grad():
        make_inplace.trilinear_interpolation(feats, points, out=out)
    close(out, trilinear_reference(feats.detach().double(), points.double()), torch.float32)
    with pytest.raises(RuntimeError, match="not differentiable"):
        make_inplace.trilinear_interpolation_backward(torch.randn(4, 3, device=device), points, feats)


@pytest.mark.parametrize("device", DEVICES)
def test_out_bumps_version_so_misuse_is_caught(device):
    feats, points = make(4, 3, torch.float32, device)
    out = torch.zeros(4, 3, device=device, requires_grad=True).clone()
    loss = (out * out).sum()  # saves out for backward
    version = out._version
    with torch.no_grad():
        make_inplace.trilinear_interpolation(feats, points, out=out)
    assert out._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def _bad_calls(device):
    """(label, kwargs for a forward or backward call, message the error must contain)."""
    f32 = dict(dtype=torch.float32, device=device)
    n, f = 5, 4
    feats, points = torch.randn(n, 8, f, **f32), torch.rand(n, 3, **f32)
    out = torch.zeros(n, f, **f32)
    grad_out = torch.randn(n, f, **f32)
    gfeats, gpoints = torch.zeros(n, 8, f, **f32), torch.zeros(n, 3, **f32)
    fwd = dict(feats=feats, points=points, out=out)
    bwd = dict(grad_out=grad_out, points=points, feats=feats, grad_feats=gfeats, grad_points=gpoints)
    big = torch.zeros(n * 8 * f + n * f, **f32)
    cases = [
        ("fwd", dict(fwd, feats=torch.randn(n, 7, f, **f32)), "feats must hold the 8 corners"),
        ("fwd", dict(fwd, feats=torch.randn(n, 8 * f, **f32)), "feats must have shape"),
        ("fwd", dict(fwd, points=torch.rand(n, 2, **f32)), "points must have shape"),
        ("fwd", dict(fwd, points=torch.rand(n, 3, 1, **f32)), "points must have shape"),
        ("fwd", dict(fwd, points=torch.rand(n + 1, 3, **f32)), "points must have N"),
        ("fwd", dict(fwd, out=torch.zeros(n, f + 1, **f32)), "out must have shape"),
        ("fwd", dict(fwd, out=torch.zeros(n + 1, f, **f32)), "out must have shape"),
        ("fwd", dict(fwd, out=torch.zeros(n, f, dtype=torch.float64, device=device)), "out must have the same dtype"),
        ("fwd", dict(fwd, out=torch.zeros(f, n, **f32).t()), "out must be contiguous"),
        ("fwd", dict(fwd, points=points.double()), "points must have the same dtype"),
        ("fwd", dict(fwd, feats=feats.int(), points=points.int(), out=out.int()), "feats must have dtype"),
        ("fwd", dict(fwd, out=big[: n * f].view(n, f), feats=big[n * f - 1 : n * f - 1 + n * 8 * f].view(n, 8, f)), "feats must not share memory with out"),
        ("fwd", dict(fwd, points=out.view(-1)[: n * 3].view(n, 3)), "points must not share memory with out"),
        ("bwd", dict(bwd, grad_out=torch.randn(n, f + 1, **f32)), "feats must have shape"),
        ("bwd", dict(bwd, grad_out=torch.randn(n + 1, f, **f32)), "points must have N"),
        ("bwd", dict(bwd, feats=torch.randn(n, 6, f, **f32)), "feats must hold the 8 corners"),
        ("bwd", dict(bwd, points=torch.rand(n, 4, **f32)), "points must have shape"),
        ("bwd", dict(bwd, grad_feats=torch.zeros(n, 8, f + 1, **f32)), "grad_feats must have shape"),
        ("bwd", dict(bwd, grad_points=torch.zeros(n, 2, **f32)), "grad_points must have shape"),
        ("bwd", dict(bwd, grad_points=torch.zeros(n, 3, dtype=torch.float64, device=device)), "grad_points must have the same dtype"),
        ("bwd", dict(bwd, grad_feats=torch.zeros(n, f, 8, **f32).transpose(1, 2)), "grad_feats must be contiguous"),
        ("bwd", dict(bwd, grad_points=torch.zeros(3, n, **f32).t()), "grad_points must be contiguous"),
        ("bwd", dict(bwd, feats=None), "grad_points needs feats"),
        ("bwd", dict(bwd, grad_out=grad_out.half()), "points must have the same dtype"),
        ("bwd", dict(bwd, grad_out=grad_out.int(), points=points.int(), feats=feats.int(), grad_feats=gfeats.int(), grad_points=gpoints.int()), "grad_out must have dtype"),
        ("bwd", dict(bwd, grad_feats=big[: n * 8 * f].view(n, 8, f), grad_out=big[n * 8 * f - 1 : n * 8 * f - 1 + n * f].view(n, f)), "grad_out must not share memory with grad_feats"),
        ("bwd", dict(bwd, grad_points=gfeats.view(-1)[: n * 3].view(n, 3)), "grad_points must not share memory with grad_feats"),
        ("bwd", dict(bwd, grad_points=feats.view(-1)[: n * 3].view(n, 3)), "feats must not share memory with grad_points"),
    ]
    return cases


def _run(kind, kw):
    if kind == "fwd":
        return make_inplace.trilinear_interpolation(kw["feats"], kw["points"], out=kw["out"])
    return make_inplace.trilinear_interpolation_backward(
        kw["grad_out"], kw["points"], kw["feats"], grad_feats=kw["grad_feats"], grad_points=kw["grad_points"]
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



# Inputs on `device`, one argument on `other`: a real device pair, and on CPU a meta mix.
# (ids: the GPU run deselects "cpu" ids with -k "not cpu".)
@pytest.mark.parametrize("device,other", [pytest.param("cuda", "cpu", marks=CUDA, id="cuda"),
                                          pytest.param("cpu", "meta", id="cpu-meta")])
def test_wrong_device_buffer(device, other):
    feats, points = make(5, 4, torch.float32, device)
    out = torch.zeros(5, 4, device=other)
    with pytest.raises(RuntimeError, match=device_mismatch("trilinear_interpolation", "out", out, "feats", feats)):
        make_inplace.trilinear_interpolation(feats, points, out=out)
    if other != "meta":
        assert torch.equal(out, torch.zeros(5, 4, device=other))
    out, other_points = torch.zeros_like(feats[:, 0]), points.to(other)
    with pytest.raises(RuntimeError, match=device_mismatch("trilinear_interpolation", "points", other_points,
                                                            "feats", feats)):
        make_inplace.trilinear_interpolation(feats, other_points, out=out)
    assert torch.equal(out, torch.zeros_like(out))
    grad_points, grad_out = torch.zeros(5, 3, device=other), torch.randn(5, 4, device=device)
    with pytest.raises(RuntimeError, match=device_mismatch("trilinear_interpolation_backward", "grad_points",
                                                            grad_points, "grad_out", grad_out)):
        make_inplace.trilinear_interpolation_backward(grad_out, points, feats, grad_points=grad_points)
    if other != "meta":
        assert torch.equal(grad_points, torch.zeros(5, 3, device=other))


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.fresh_process
def test_cuda_caller_buffers_allocate_nothing(dtype):
    n, f = 262144, 64
    fresh_cuda_memory()
    feats, points = make(n, f, dtype, "cuda")
    grad_out = torch.randn(n, f, dtype=dtype, device="cuda")
    out = torch.empty(n, f, dtype=dtype, device="cuda")
    grad_feats = torch.empty(n, 8, f, dtype=dtype, device="cuda")
    grad_points = torch.empty(n, 3, dtype=dtype, device="cuda")
    make_inplace.trilinear_interpolation(feats, points, out=out)  # warm up: library state, not tensors
    torch.cuda.synchronize()

    ours_fwd = cuda_peak_extra(lambda: make_inplace.trilinear_interpolation(feats, points, out=out))
    ours_bwd = cuda_peak_extra(
        lambda: make_inplace.trilinear_interpolation_backward(
            grad_out, points, feats, grad_feats=grad_feats, grad_points=grad_points, accumulate=True
        )
    )
    assert (ours_fwd.reserved, ours_fwd.allocated) == (0, 0)
    assert (ours_bwd.reserved, ours_bwd.allocated) == (0, 0)

    # The plain-torch reference allocates at least its result (and autograd its gradients).
    ref_fwd = cuda_peak_extra(lambda: trilinear_reference(feats, points))
    assert ref_fwd.allocated >= out.nbytes and ref_fwd.reserved > 0

    def torch_backward():
        fl, pl = feats.detach().requires_grad_(), points.detach().requires_grad_()
        return torch.autograd.grad(trilinear_reference(fl, pl), (fl, pl), grad_out)

    ref_bwd = cuda_peak_extra(torch_backward)
    assert ref_bwd.allocated >= grad_feats.nbytes and ref_bwd.reserved > 0
    close(out, trilinear_reference(feats.double(), points.double()), dtype)


@CUDA
def test_cuda_runs_on_current_stream():
    feats, points = make(65536, 256, torch.float32, "cuda")
    out = torch.full((65536, 256), float("nan"), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        make_inplace.trilinear_interpolation(feats, points, out=out)
        snapshot = out.clone()  # ordered after the kernel only if it ran on `side`
    torch.cuda.synchronize()
    close(snapshot, trilinear_reference(feats.double(), points.double()), torch.float32)


@CUDA
@pytest.mark.parametrize("n,f", [(65536, 256), (1048576, 32), (262144, 64), (3, 65536)])
def test_cuda_benchmark_shapes(n, f):
    feats, points = make(n, f, torch.bfloat16, "cuda")
    grad_out = torch.randn(n, f, dtype=torch.bfloat16, device="cuda")
    close(make_inplace.trilinear_interpolation(feats, points), trilinear_reference(feats.double(), points.double()), torch.bfloat16)
    gf, gp = make_inplace.trilinear_interpolation_backward(grad_out, points, feats)
    ref_feats, ref_points = reference_grads(feats, points, grad_out)
    close(gf, ref_feats, torch.bfloat16)
    close(gp, ref_points, torch.bfloat16)
