"""The Hopper wgmma kernel with one and with two tiles per CTA of 256 and of
192 columns, in cluster and in counted mode (forced), and the policy's own
choice, against torch.matmul: CUDA-event medians of back-to-back calls, bf16
x @ w. The plan's cost per round (kWgmmaRoundOverheadKSteps,
docs/square_matmul.md) was fitted to these rows.

    python lab/sweep_square_matmul_wgmma_tiles.py [ROWSxN ...]
"""

from __future__ import annotations

import re
import sys

import torch

import make_inplace
from make_inplace._testing import forced_route

SHAPES = [(4096, 1024), (8192, 1024), (12288, 1024), (40000, 1024), (8192, 768), (16384, 512),
          (4096, 2048), (8192, 2048), (16384, 2048), (8192, 4096)]
WIDTHS = (256, 192)
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


def variant(fn) -> str:
    """The wgmma variant one call ran, as "TILES/WIDTH" (or the kernel's name):
    a forced plan that cannot run falls back to the policy's."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = " ".join(e.name for e in prof.events())
    m = re.search(r"square_matmul_wgmma_kernel<[^,]+, \w+, (\d), (\d+)>", names)
    return f"{m.group(1)}/{m.group(2)}" if m else names.split("(")[0][-30:]


def main() -> None:
    shapes = [tuple(int(v) for v in a.split("x")) for a in sys.argv[1:]] or SHAPES
    print(torch.cuda.get_device_name(), torch.__version__, "(us per call; mode xTILES/WIDTH)")
    for rows, n in shapes:
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) / n**0.5
        default = lambda: make_inplace.square_matmul_(x, w)  # noqa: E731
        row = {"torch": gpu_us(lambda: torch.matmul(x, w)), f"default {variant(default)}": gpu_us(default)}
        for mode, (route, bound) in MODES.items():
            for width in WIDTHS:
                for tiles in (1, 2):
                    with forced_route(route, tiles_per_cta=tiles, col_tile=width):
                        call = lambda: make_inplace.square_matmul_(x, w, workspace_bytes=bound)  # noqa: E731
                        ran = variant(call)
                        key = f"{mode} x{tiles}/{width}" + ("" if ran == f"{tiles}/{width}" else f" (ran {ran})")
                        row[key] = gpu_us(call)
        if n <= 512:
            with forced_route("wgmma_rows"):
                call = lambda: make_inplace.square_matmul_(x, w, workspace_bytes=0)  # noqa: E731
                row[f"rows64 (ran {variant(call)})"] = gpu_us(call)
        print(f"{rows:6d} x {n:5d}  " + "  ".join(f"{k} {v:7.1f}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
