"""layer_norm_ against torch.nn.functional.layer_norm (eager, and torch.compile on CUDA).

Shapes: (rows, cols) in {(262144, 1024), (16384, 4096), (4096, 16384),
(1024, 65536), (262144, 128), (4194304, 32)} plus (256, 262144) for the streaming
path, bfloat16, float16 and float32, with weight and bias (as nn.LayerNorm).
Throughput counts one read and one write of x, against the card's copy bandwidth.
"""

import pytest
import torch
import torch.nn.functional as F

import make_inplace
from harness import DEVICE, SHORT, Work, compiled, run

if SHORT:
    SHAPES = [(256, 1024), (64, 4097), (4096, 32)]
    DTYPES = [torch.float32]
else:
    SHAPES = [(262144, 1024), (16384, 4096), (4096, 16384), (1024, 65536), (262144, 128), (4194304, 32), (256, 262144)]
    DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


@pytest.mark.parametrize("impl", ["torch", "torch.compile", "make_inplace"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_layer_norm(benchmark, rows, cols, dtype, impl):
    if impl == "torch.compile" and SHORT:
        pytest.skip("torch.compile rows run in the full (GPU) mode")
    torch.manual_seed(0)
    w = torch.randn(cols, device=DEVICE, dtype=dtype)
    b = torch.randn(cols, device=DEVICE, dtype=dtype)

    def make_inputs():
        return (torch.randn(rows, cols, device=DEVICE, dtype=dtype), w, b)

    if impl == "make_inplace":

        def fn(x, w, b):  # repeated application stays finite: normalize, then the same affine map
            return make_inplace.layer_norm_(x, cols, w, b)

    elif impl == "torch.compile":
        fn = compiled(_layer_norm)
    else:
        fn = _layer_norm
    size = rows * cols * torch.empty((), dtype=dtype).element_size()
    run(
        benchmark,
        group=f"layer_norm {str(dtype)[6:]} ({rows}, {cols})",
        impl=impl,
        make_inputs=make_inputs,
        fn=fn,
        work=Work(bytes=2 * size),
        rotate=4 if 2 * size < 64 << 20 else 1,
    )
