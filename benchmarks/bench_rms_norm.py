"""rms_norm_ against torch.nn.functional.rms_norm (eager, and torch.compile on CUDA).

The row-wise shapes of bench_layer_norm.py, with a weight (as nn.RMSNorm).
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


def _rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w)


@pytest.mark.parametrize("impl", ["torch", "torch.compile", "make_inplace"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_rms_norm(benchmark, rows, cols, dtype, impl):
    if impl == "torch.compile" and SHORT:
        pytest.skip("torch.compile rows run in the full (GPU) mode")
    torch.manual_seed(0)
    # Weights near 1: repeated application in place stays finite and nonzero.
    w = 1 + 0.1 * torch.randn(cols, device=DEVICE, dtype=dtype)

    def make_inputs():
        return (torch.randn(rows, cols, device=DEVICE, dtype=dtype), w)

    if impl == "make_inplace":

        def fn(x, w):
            return make_inplace.rms_norm_(x, cols, w)

    elif impl == "torch.compile":
        fn = compiled(_rms_norm)
    else:
        fn = _rms_norm
    size = rows * cols * torch.empty((), dtype=dtype).element_size()
    run(
        benchmark,
        group=f"rms_norm {str(dtype)[6:]} ({rows}, {cols})",
        impl=impl,
        make_inputs=make_inputs,
        fn=fn,
        work=Work(bytes=2 * size),
        rotate=4 if 2 * size < 64 << 20 else 1,
    )
