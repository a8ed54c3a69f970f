"""The Hopper wgmma kernel with one and with two 256-column tiles per CTA, in
cluster and in counted mode (forced), against torch.matmul: CUDA-event medians
of back-to-back calls, bf16 x @ w. The cluster plan's two-tile rule
(kWgmmaTwoTileRoundCost, docs/routing.md) comes from these rows.

    python lab/sweep_square_matmul_wgmma_tiles.py
"""

from __future__ import annotations

import torch

import make_inplace
from make_inplace._testing import forced_route

SHAPES = [(4096, 1024), (8192, 1024), (12288, 1024), (40000, 1024), (8192, 768), (16384, 512),
          (4096, 2048), (8192, 2048), (16384, 2048), (8192, 4096)]
MODES = {"clusters": ("wgmma_clusters", 0), "counted": ("wgmma_counted", 4 << 20)}


def gpu_us(fn, calls: int = 20, rounds: int = 7) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, "(us per call)")
    for rows, n in SHAPES:
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) / n**0.5
        row = {"torch": gpu_us(lambda: torch.matmul(x, w))}
        for mode, (route, bound) in MODES.items():
            for tiles in (1, 2):
                with forced_route(route, tiles_per_cta=tiles):
                    row[f"{mode} x{tiles}"] = gpu_us(lambda: make_inplace.square_matmul_(x, w, workspace_bytes=bound))
        print(f"{rows:6d} x {n:5d}  " + "  ".join(f"{k} {v:7.1f}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
