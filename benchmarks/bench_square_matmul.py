"""square_matmul_ (default workspace and workspace_bytes=0) against torch.matmul."""

import pytest
import torch

import make_inplace
from harness import DEVICE, SHORT, Work, run

if SHORT:
    SHAPES = [(256, 64), (100, 33)]
    DTYPES = [torch.float32, torch.bfloat16]
else:
    SHAPES = [(16384, 512), (40000, 1024), (16384, 2048), (16384, 4096), (65536, 768)]
    DTYPES = [torch.bfloat16, torch.float16, torch.float32]

IMPLS = ["torch.matmul", "make_inplace", "make_inplace ws=0"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,n", SHAPES)
def test_square_matmul(benchmark, rows, n, dtype, impl):
    def make_inputs():
        x = torch.randn(rows, n, device=DEVICE, dtype=dtype)
        w = (torch.randn(n, n, device=DEVICE, dtype=dtype) / n**0.5).to(dtype)
        return x, w

    if impl == "torch.matmul":
        fn = torch.matmul
    else:
        workspace = 0 if impl.endswith("ws=0") else None
        fn = lambda x, w: make_inplace.square_matmul_(x, w, workspace_bytes=workspace)  # noqa: E731
    elem = torch.finfo(dtype).bits // 8
    work = Work(flops=2.0 * rows * n * n, bytes=elem * (2.0 * rows * n + n * n))
    rotate = 4 if rows * n * elem < (64 << 20) else 1
    benchmark.extra_info["shape"] = [rows, n]
    run(benchmark, group=f"square_matmul {str(dtype)[6:]} ({rows}, {n})", impl=impl,
        make_inputs=make_inputs, fn=fn, work=work, rotate=rotate)
