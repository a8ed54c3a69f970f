"""softmax_ against torch.softmax (eager, and torch.compile on CUDA) at the same shapes.

Shapes: (rows, cols) in {(262144, 1024), (16384, 4096), (4096, 16384),
(1024, 65536), (262144, 128), (4194304, 32)} plus (256, 262144) for the streaming
path, in bfloat16, float16 and float32. Throughput counts one read and one write
of x (the least any softmax must move), against the card's copy bandwidth.
"""

import pytest
import torch

import make_inplace
from harness import DEVICE, SHORT, Work, compiled, run

if SHORT:
    SHAPES = [(256, 1024), (64, 4097), (4096, 32)]
    DTYPES = [torch.float32]
else:
    SHAPES = [(262144, 1024), (16384, 4096), (4096, 16384), (1024, 65536), (262144, 128), (4194304, 32), (256, 262144)]
    DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _softmax_last(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


@pytest.mark.parametrize("impl", ["torch", "torch.compile", "make_inplace"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_softmax(benchmark, rows, cols, dtype, impl):
    if impl == "torch.compile" and SHORT:
        pytest.skip("torch.compile rows run in the full (GPU) mode")
    torch.manual_seed(0)

    def make_inputs():
        return (torch.randn(rows, cols, device=DEVICE, dtype=dtype),)

    if impl == "make_inplace":
        fn = make_inplace.softmax_  # repeated application stays a finite distribution
    elif impl == "torch.compile":
        fn = compiled(_softmax_last)
    else:
        fn = _softmax_last
    size = rows * cols * torch.empty((), dtype=dtype).element_size()
    run(
        benchmark,
        group=f"softmax {str(dtype)[6:]} ({rows}, {cols})",
        impl=impl,
        make_inputs=make_inputs,
        fn=fn,
        work=Work(bytes=2 * size),
        rotate=4 if 2 * size < 64 << 20 else 1,
    )
