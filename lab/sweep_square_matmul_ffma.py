"""Sweep of square_matmul_'s fp32 routes on a GPU (TF32 off): the FFMA kernel in
counted mode (row-block counters, a bound of 2 MiB or more) and in cluster mode
(no memory), the cuBLAS panel route, and the default choice, each against
``torch.matmul(x, w)`` in the same run, with its peak extra memory from a cold
allocator and its error against float64.

The routes are forced with the environment switches the CUDA binding reads
per call: MAKE_INPLACE_FFMA_MIN_TILES (0: the FFMA kernel at any size; huge:
never) and MAKE_INPLACE_FFMA_PANELS_FROM_N (the width from which a contiguous
panel buffer keeps cuBLAS; huge: never).

    python lab/sweep_square_matmul_ffma.py [--shapes 40000x1024,...]
"""

from __future__ import annotations

import argparse
import os

import torch

import make_inplace
from make_inplace._measure import cuda_peak_extra, fresh_cuda_memory, relative_error, time_ms

NEVER = str(1 << 62)
SHAPES = [(16384, 512), (40000, 1024), (16384, 2048), (16384, 4096), (65536, 768),
          (4096, 1024), (8192, 2048), (20000, 776), (4097, 8192)]
ROUTES = {
    "default": ({}, None),
    "ffma counted": (dict(MAKE_INPLACE_FFMA_MIN_TILES="0", MAKE_INPLACE_FFMA_PANELS_FROM_N=NEVER), 64 << 20),
    "ffma clusters": (dict(MAKE_INPLACE_FFMA_MIN_TILES="0"), 0),
    "panels": (dict(MAKE_INPLACE_FFMA_MIN_TILES=NEVER), None),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in SHAPES))
    args = parser.parse_args()
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
        for name, (env, workspace) in ROUTES.items():
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                x = x0.clone()
                make_inplace.square_matmul_(x, w, b, transpose=True, workspace_bytes=workspace)
                err = relative_error(x, expected)
                fresh_cuda_memory()
                peak = cuda_peak_extra(lambda: make_inplace.square_matmul_(x, w, workspace_bytes=workspace))
                t = time_ms(lambda: make_inplace.square_matmul_(x, w, workspace_bytes=workspace), device)
            finally:
                for k, v in saved.items():
                    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
            print(f"  {name:14s} {t:8.3f} ms  {flops / t / 1e9:5.1f} TFLOP/s  {t_torch / t:5.3f}x torch"
                  f"  extra res/alloc {peak.reserved / 2**20:.1f}/{peak.allocated / 2**20:.1f} MiB  err {err:.1e}")


if __name__ == "__main__":
    main()
