"""square_matmul_'s CPU routes against torch.matmul over n (lab: one
machine's sweep, for the CPU routing thresholds).

    python lab/cpu_square_matmul_sweep.py [--threads N] [--rows R]

Times the row kernel (workspace_bytes=0, no workspace), the default bound
(ATen GEMM panels where the bound holds 128 rows) and torch.matmul, medians of
alternated rounds in one process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import make_inplace as mi


def median_ms(fns, reps=10, rounds=5):
    times = [[] for _ in fns]
    for f in fns:
        f()
    for _ in range(rounds):
        for i, f in enumerate(fns):
            for _ in range(reps):
                t0 = time.perf_counter()
                f()
                times[i].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--widths", default="64,128,256,512,768,1024,2048")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}, rows {args.rows}")
    print(f"{'dtype':<9} {'n':>5} {'rows ms':>9} {'default ms':>10} {'torch ms':>9} {'rows/torch':>10} {'default/torch':>13} {'rows GFLOP/s':>12}")
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        for n in map(int, args.widths.split(",")):
            x = torch.randn(args.rows, n, dtype=dtype)
            w = (torch.randn(n, n, dtype=dtype) / n**0.5).to(dtype)
            rows_ms, default_ms, torch_ms = median_ms(
                [lambda: mi.square_matmul_(x, w, workspace_bytes=0), lambda: mi.square_matmul_(x, w), lambda: torch.matmul(x, w)]
            )
            gflops = 2 * args.rows * n * n / (rows_ms * 1e-3) / 1e9
            print(f"{name:<9} {n:>5} {rows_ms:9.3f} {default_ms:10.3f} {torch_ms:9.3f} {torch_ms / rows_ms:9.2f}x {torch_ms / default_ms:12.2f}x {gflops:12.1f}", flush=True)
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
