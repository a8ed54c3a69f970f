"""The Hopper wgmma kernel with one and with two tiles per CTA of 256 and of
192 columns, in cluster, grid-barrier and counted mode (forced), and the
policy's own choice with and without workspace, against torch.matmul:
bf16 x @ w, us per call of batches of back-to-back calls, the variants'
batches interleaved round by round in a rotating order and the median over
the rounds taken. (Timing each variant's calls together, one variant after
another, favoured the first ones: a card that has run GEMMs for a few seconds
runs slower, and at 16384 x 2048 the same plan read 186 us second and 210
us last.) The plan's cost per round (kWgmmaRoundOverheadKSteps,
docs/square_matmul.md) was fitted to rows timed the old way.

    python lab/sweep_square_matmul_wgmma_tiles.py [ROWSxN ...]
"""

from __future__ import annotations

import re
import statistics
import sys

import torch

import make_inplace
from make_inplace._testing import forced_route

SHAPES = [(4096, 1024), (8192, 1024), (12288, 1024), (40000, 1024), (8192, 768), (16384, 512),
          (4096, 2048), (8192, 2048), (16384, 2048), (8192, 4096)]
WIDTHS = (256, 192)
MODES = {"clusters": ("wgmma_clusters", 0), "grid": ("wgmma_grid", 0), "counted": ("wgmma_counted", 4 << 20)}


ROUNDS = 15


def batch_us(fn, calls: int = 10) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls * 1e3


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
    print(torch.cuda.get_device_name(), torch.__version__, "(us per call, medians of interleaved rounds;"
          " mode xTILES/WIDTH)")
    for rows, n in shapes:
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        # Orthogonal: x keeps its norm under the sweep's thousands of in-place
        # calls, so every variant times the same data (a Gaussian w grew x's
        # largest entry 23x over 400 calls).
        w = torch.linalg.qr(torch.randn(n, n, device="cuda"))[0].to(torch.bfloat16)
        calls = {"torch": (lambda: torch.matmul(x, w), None, {})}
        for name, bound in [("default", None), ("ws=0", 0)]:
            calls[name] = (lambda b=bound: make_inplace.square_matmul_(x, w, workspace_bytes=b), None, {})
        for mode, (route, bound) in MODES.items():
            calls[mode] = (lambda b=bound: make_inplace.square_matmul_(x, w, workspace_bytes=b), route, {})
            for width in WIDTHS:
                for tiles in (1, 2):
                    calls[f"{mode} x{tiles}/{width}"] = (
                        lambda b=bound: make_inplace.square_matmul_(x, w, workspace_bytes=b),
                        route,
                        {"tiles_per_cta": tiles, "col_tile": width},
                    )
        if n <= 512:
            calls["rows64"] = (lambda: make_inplace.square_matmul_(x, w, workspace_bytes=0), "wgmma_rows", {})
        # The variant each call runs, before any timing: the profiler's
        # teardown slowed the calls timed right after it.
        labels = {}
        for key, (fn, route, kwargs) in calls.items():
            with forced_route(route, **kwargs):
                ran = variant(fn) if key != "torch" else ""
            want = f"{kwargs['tiles_per_cta']}/{kwargs['col_tile']}" if kwargs else ran
            labels[key] = key if key == "torch" else f"{key} {ran}" if ran == want else f"{key} (ran {ran})"
        keys = list(calls)
        times = {key: [] for key in keys}
        for key in keys:
            fn, route, kwargs = calls[key]
            with forced_route(route, **kwargs):
                batch_us(fn, calls=3)
        for r in range(ROUNDS):
            for key in keys[r % len(keys):] + keys[: r % len(keys)]:
                fn, route, kwargs = calls[key]
                with forced_route(route, **kwargs):
                    times[key].append(batch_us(fn))
        median = {key: statistics.median(v) for key, v in times.items()}
        print(f"{rows:6d} x {n:5d}  " + "  ".join(f"{labels[k]} {v:7.1f}" for k, v in median.items()), flush=True)


if __name__ == "__main__":
    main()
