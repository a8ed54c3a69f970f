"""trilinear_interpolation(_backward): plain torch (eager, torch.compile) vs make_inplace.

Forward bytes: feats, points and out each moved once. Backward bytes: grad_out,
points and feats read once, grad_feats and grad_points written once. The torch
autograd row times forward + backward of the reference (what training pays).

    pytest benchmarks/bench_trilinear.py --benchmark-only --benchmark-group-by=group
"""

from __future__ import annotations

import pytest
import torch
from harness import DEVICE, SHORT, Work, compiled, run

import make_inplace

SHAPES = [(4096, 32)] if SHORT else [(65536, 256), (1048576, 32), (262144, 64)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
IMPLS = ["torch", "torch.compile", "make_inplace"]


def weights(points: torch.Tensor) -> torch.Tensor:
    """(N, 8) corner weights, corner k = 4i + 2j + l."""
    u = (points + 1) / 2
    wu = torch.stack([1 - u, u], dim=-1)  # (N, 3, 2)
    return (wu[:, 0, :, None, None] * wu[:, 1, None, :, None] * wu[:, 2, None, None, :]).reshape(-1, 8)


def torch_forward(feats, points):
    return (weights(points)[:, :, None] * feats).sum(1)


def torch_backward(grad_out, points, feats):
    """Closed-form gradients in plain torch (what autograd of torch_forward computes)."""
    u = (points + 1) / 2
    wu = torch.stack([1 - u, u], dim=-1)
    du = torch.tensor([-0.5, 0.5], dtype=points.dtype, device=points.device).expand_as(wu)
    grad_feats = weights(points)[:, :, None] * grad_out[:, None, :]
    per_point = (feats * grad_out[:, None, :]).sum(-1)  # (N, 8)
    grads = []
    for axis in range(3):
        factors = [du[:, a] if a == axis else wu[:, a] for a in range(3)]
        dw = (factors[0][:, :, None, None] * factors[1][:, None, :, None] * factors[2][:, None, None, :]).reshape(-1, 8)
        grads.append((dw * per_point).sum(-1))
    return grad_feats, torch.stack(grads, dim=-1)


def skip_compile(impl, dtype):
    if impl == "torch.compile" and (SHORT or DEVICE.type != "cuda"):
        pytest.skip("torch.compile rows run on CUDA in full mode")
    if impl == "torch.compile" and dtype == torch.float16:
        pytest.skip("torch.compile rows for bfloat16 and float32 only (compiles are slow; fp16 fuses like bf16)")


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def inputs(n, f, dtype, with_grad=False):
    def make():
        feats = torch.randn(n, 8, f, dtype=dtype, device=DEVICE)
        points = (torch.rand(n, 3, device=DEVICE) * 2 - 1).to(dtype)
        extra = torch.empty(n, f, dtype=dtype, device=DEVICE)
        if with_grad:
            extra = torch.randn(n, f, dtype=dtype, device=DEVICE)
            return extra, points, feats, torch.empty_like(feats), torch.empty(n, 3, dtype=dtype, device=DEVICE)
        return feats, points, extra

    return make


def rotation(n, f, dtype):
    # Enough input sets that L2 (50 MB) never holds the next call's inputs.
    return max(1, -(-64 * 2**20 // (n * 9 * f * dtype.itemsize)))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n,f", SHAPES)
def test_forward(benchmark, impl, dtype, n, f):
    skip_compile(impl, dtype)
    size = dtype.itemsize
    work = Work(bytes=(n * 8 * f + n * 3 + n * f) * size)
    if impl == "make_inplace":
        fn = lambda feats, points, out: make_inplace.trilinear_interpolation(feats, points, out=out)  # noqa: E731
    else:
        ref = compiled(torch_forward) if impl == "torch.compile" else torch_forward
        fn = lambda feats, points, out: ref(feats, points)  # noqa: E731
    run(
        benchmark,
        group=f"trilinear fwd {dtype_id(dtype)} N={n} F={f}",
        impl=impl,
        make_inputs=inputs(n, f, dtype),
        fn=fn,
        work=work,
        rotate=rotation(n, f, dtype),
    )


@pytest.mark.parametrize("impl", ["torch autograd (fwd+bwd)"] + IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("n,f", SHAPES)
def test_backward(benchmark, impl, dtype, n, f):
    skip_compile(impl, dtype)
    size = dtype.itemsize
    work = Work(bytes=(n * f + 2 * n * 3 + 2 * n * 8 * f) * size)
    if impl == "make_inplace":

        def fn(grad_out, points, feats, grad_feats, grad_points):
            return make_inplace.trilinear_interpolation_backward(
                grad_out, points, feats, grad_feats=grad_feats, grad_points=grad_points
            )

    elif impl.startswith("torch autograd"):

        def fn(grad_out, points, feats, grad_feats, grad_points):
            f_, p_ = feats.detach().requires_grad_(), points.detach().requires_grad_()
            return torch.autograd.grad(torch_forward(f_, p_), (f_, p_), grad_out)

    else:
        ref = compiled(torch_backward) if impl == "torch.compile" else torch_backward
        fn = lambda grad_out, points, feats, grad_feats, grad_points: ref(grad_out, points, feats)  # noqa: E731
    run(
        benchmark,
        group=f"trilinear bwd {dtype_id(dtype)} N={n} F={f}",
        impl=impl,
        make_inputs=inputs(n, f, dtype, with_grad=True),
        fn=fn,
        work=work,
        rotate=rotation(n, f, dtype),
    )
