"""outer_product(_backward): torch.bmm into out=, plain torch (eager, torch.compile) vs make_inplace.

Forward bytes: a and b read, out written once. Backward bytes: grad_out, a and
b read once, grad_a and grad_b written once.

    pytest benchmarks/bench_outer_product.py --benchmark-only --benchmark-group-by=group
"""

from __future__ import annotations

import pytest
import torch
from harness import DEVICE, SHORT, Work, compiled, run

import make_inplace

SHAPES = [(8, 64, 64)] if SHORT else [(4096, 256, 256), (512, 1024, 1024), (64, 4096, 4096)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_forward(a, b):
    return a[..., :, None] * b[..., None, :]


def torch_backward(grad_out, a, b):
    return (grad_out * b[..., None, :]).sum(-1), (grad_out * a[..., :, None]).sum(-2)


def skip_compile(impl, dtype):
    if impl == "torch.compile" and (SHORT or DEVICE.type != "cuda"):
        pytest.skip("torch.compile rows run on CUDA in full mode")
    if impl == "torch.compile" and dtype == torch.float16:
        pytest.skip("torch.compile rows for bfloat16 and float32 only (compiles are slow; fp16 fuses like bf16)")


def rotation(batch, n, m, dtype):
    return max(1, -(-64 * 2**20 // (batch * n * m * dtype.itemsize)))


@pytest.mark.parametrize("impl", ["torch.bmm out=", "torch", "torch.compile", "make_inplace"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("batch,n,m", SHAPES)
def test_forward(benchmark, impl, dtype, batch, n, m):
    skip_compile(impl, dtype)

    def make():
        a = torch.randn(batch, n, dtype=dtype, device=DEVICE)
        b = torch.randn(batch, m, dtype=dtype, device=DEVICE)
        return a, b, torch.empty(batch, n, m, dtype=dtype, device=DEVICE)

    if impl == "make_inplace":
        fn = lambda a, b, out: make_inplace.outer_product(a, b, out=out)  # noqa: E731
    elif impl == "torch.bmm out=":
        fn = lambda a, b, out: torch.bmm(a[..., :, None], b[..., None, :], out=out)  # noqa: E731
    else:
        ref = compiled(torch_forward) if impl == "torch.compile" else torch_forward
        fn = lambda a, b, out: ref(a, b)  # noqa: E731
    run(
        benchmark,
        group=f"outer_product fwd {dtype_id(dtype)} B={batch} n={n} m={m}",
        impl=impl,
        make_inputs=make,
        fn=fn,
        work=Work(bytes=(batch * n * m + batch * (n + m)) * dtype.itemsize),
        rotate=rotation(batch, n, m, dtype),
    )


@pytest.mark.parametrize("impl", ["torch.bmm out=", "torch", "torch.compile", "make_inplace"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("batch,n,m", SHAPES)
def test_backward(benchmark, impl, dtype, batch, n, m):
    skip_compile(impl, dtype)

    def make():
        grad_out = torch.randn(batch, n, m, dtype=dtype, device=DEVICE)
        a = torch.randn(batch, n, dtype=dtype, device=DEVICE)
        b = torch.randn(batch, m, dtype=dtype, device=DEVICE)
        return grad_out, a, b, torch.empty_like(a), torch.empty_like(b)

    if impl == "make_inplace":

        def fn(grad_out, a, b, grad_a, grad_b):
            return make_inplace.outer_product_backward(grad_out, a, b, grad_a=grad_a, grad_b=grad_b)

    elif impl == "torch.bmm out=":

        def fn(grad_out, a, b, grad_a, grad_b):
            torch.bmm(grad_out, b[..., None], out=grad_a[..., None])
            torch.bmm(a[:, None, :], grad_out, out=grad_b[:, None, :])

    else:
        ref = compiled(torch_backward) if impl == "torch.compile" else torch_backward
        fn = lambda grad_out, a, b, grad_a, grad_b: ref(grad_out, a, b)  # noqa: E731
    run(
        benchmark,
        group=f"outer_product bwd {dtype_id(dtype)} B={batch} n={n} m={m}",
        impl=impl,
        make_inputs=make,
        fn=fn,
        work=Work(bytes=(batch * n * m + 2 * batch * (n + m)) * dtype.itemsize),
        rotate=rotation(batch, n, m, dtype),
    )
