"""Sweep of square_matmul_'s fp32 routes on a GPU (TF32 off): the FFMA kernel in
counted mode (row-block counters, a bound of 2 MiB or more) and at the grid
barrier (no memory), the cuBLAS panel route, the waves kernel, and the default
choice, each against
``torch.matmul(x, w)`` in the same run, with its peak extra memory from a cold
allocator and its error against float64.

The routes are forced with make_inplace._testing.forced_route (docs/routing.md):
"ffma_counted" and "ffma_grid" run the FFMA kernel at any size and width
(the policy's tile threshold and its panel preference from n = 4096 are
skipped), with one or two tiles per CTA ("t1", "t2"); "panels" runs cuBLAS on
row panels whatever they pay. A forced route that cannot run a shape (panels
under a 2 MiB bound, as the default bound of a small x) leaves it to the
policy: the line then says which kernel ran.

    python lab/sweep_square_matmul_ffma.py [--shapes 40000x1024,...]
"""

from __future__ import annotations

import argparse
import re

import torch

import make_inplace
from make_inplace._measure import cuda_peak_extra, fresh_cuda_memory, relative_error, time_ms
from make_inplace._testing import forced_route

SHAPES = [(16384, 512), (40000, 1024), (16384, 2048), (16384, 4096), (65536, 768),
          (4096, 1024), (8192, 2048), (20000, 776), (4097, 8192), (128, 128), (1000, 512), (256, 4096)]
ROUTES = {  # label: (forced route, workspace_bytes, tiles per CTA)
    "default": (None, None, None),
    "default ws=0": (None, 0, None),
    "counted t1": ("ffma_counted", 64 << 20, 1),
    "counted t2": ("ffma_counted", 64 << 20, 2),
    "grid t1": ("ffma_grid", 0, 1),
    "grid t2": ("ffma_grid", 0, 2),
    "panels": ("panels", None, None),
    "waves": ("waves", 0, None),
}


def kernel_of(call) -> str:
    """The first kernel a call launches, shortened (which route ran)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = [n for n in names if "square_matmul" in n or "gemm" in n.lower() or "copy" in n.lower()]
    name = (kernels or names or ["?"])[0]
    m = re.search(r"(square_matmul_\w+|\w*gemm\w*|\w*copy\w*)(<[^>(]*>)?", name)
    return (m.group(0) if m else name)[:40]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in SHAPES))
    parser.add_argument("--routes", default=",".join(ROUTES), help="labels from ROUTES, comma-separated")
    args = parser.parse_args()
    routes = {name: ROUTES[name] for name in args.routes.split(",")}
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    print(torch.cuda.get_device_name(), torch.__version__)
    for shape in args.shapes.split(","):
        rows, n = map(int, shape.split("x"))
        x0 = torch.randn(rows, n, device=device)
        w = torch.randn(n, n, device=device) / n**0.5
        b = torch.randn(n, device=device)
        flops = 2.0 * rows * n * n
        t_torch = time_ms(lambda: torch.matmul(x0, w), device)
        print(f"({rows}, {n}) torch.matmul {t_torch:.3f} ms {flops / t_torch / 1e9:.1f} TFLOP/s")
        expected = (x0.double() @ w.double().t() + b.double())
        for name, (route, workspace, tiles) in routes.items():
            with forced_route(route, tiles_per_cta=tiles):
                x = x0.clone()
                make_inplace.square_matmul_(x, w, b, transpose=True, workspace_bytes=workspace)
                err = relative_error(x, expected)
                fresh_cuda_memory()
                peak = cuda_peak_extra(lambda: make_inplace.square_matmul_(x, w, workspace_bytes=workspace))
                t = time_ms(lambda: make_inplace.square_matmul_(x, w, workspace_bytes=workspace), device)
                ran = kernel_of(lambda: make_inplace.square_matmul_(x, w, workspace_bytes=workspace))
            print(f"  {name:14s} {ran:40s} {t:8.3f} ms  {flops / t / 1e9:5.1f} TFLOP/s  {t_torch / t:5.3f}x torch"
                  f"  extra res/alloc {peak.reserved / 2**20:.1f}/{peak.allocated / 2**20:.1f} MiB  err {err:.1e}")


if __name__ == "__main__":
    main()
