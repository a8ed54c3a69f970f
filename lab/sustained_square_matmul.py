"""square_matmul_ against torch under sustained load: the card kept busy with
GEMMs, batches of back-to-back calls of ours and torch's interleaved round by
round, medians, with the SM clock and power read between rounds (pynvml
through torch.cuda). The benchmarks time isolated calls on a cool card
(benchmarks/harness.py); inside a model's forward the card runs warm.

    python lab/sustained_square_matmul.py [--seconds S] [ROWSxN ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import make_inplace
from make_inplace._measure import time_ms
from sweep_square_matmul_wgmma_tiles import batch_us  # lab/ is the script's path

SHAPES = [(16384, 512), (65536, 768), (40000, 1024), (16384, 2048), (16384, 4096), (8192, 1024), (8192, 768)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0, help="warm-up of busy GEMMs before each shape")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("shapes", nargs="*")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes] or SHAPES
    print(torch.cuda.get_device_name(), torch.__version__, "| us per call, medians over interleaved rounds")
    for dtype in (torch.bfloat16, torch.float16):
        for rows, n in shapes:
            xs = [torch.randn(rows, n, device="cuda", dtype=dtype) for _ in range(2)]
            # Orthogonal: x keeps its norm under in-place application.
            w = torch.linalg.qr(torch.randn(n, n, device="cuda"))[0].to(dtype)
            b = torch.randn(n, device="cuda", dtype=dtype) * 0.01
            calls = 10 if rows * n * n < 2**34 else 3
            state = {"i": 0}

            def x():
                state["i"] ^= 1
                return xs[state["i"]]

            variants = {
                "torch.matmul": lambda: torch.matmul(x(), w),
                "ours": lambda: make_inplace.square_matmul_(x(), w),
                "ours ws=0": lambda: make_inplace.square_matmul_(x(), w, workspace_bytes=0),
                "F.linear(bias)": lambda: F.linear(x(), w, b),
                "ours (w^T, bias)": lambda: make_inplace.square_matmul_(x(), w, b, transpose=True),
            }
            deadline = time.perf_counter() + args.seconds
            while time.perf_counter() < deadline:
                for fn in variants.values():
                    batch_us(fn, calls)
            times = {k: [] for k in variants}
            clocks, watts = [], []
            keys = list(variants)
            for r in range(args.rounds):
                for key in keys[r % len(keys):] + keys[: r % len(keys)]:
                    times[key].append(batch_us(variants[key], calls))
                clocks.append(torch.cuda.clock_rate())
                watts.append(torch.cuda.power_draw() / 1000)
            med = {k: statistics.median(v) for k, v in times.items()}
            cold = {}
            for key in ("torch.matmul", "ours", "F.linear(bias)", "ours (w^T, bias)"):
                torch.cuda.synchronize()
                time.sleep(0.5)  # a pause, then isolated calls as the benchmarks time them
                cold[key] = time_ms(variants[key], torch.device("cuda"), warmup=1, reps=5) * 1e3
            print(
                f"{str(dtype)[6:]:8s} {rows:6d} x {n:5d}  "
                + "  ".join(f"{k} {v:7.1f}" for k, v in med.items())
                + f"  | ours/torch {med['torch.matmul'] / med['ours']:.3f}, ws=0 {med['torch.matmul'] / med['ours ws=0']:.3f},"
                f" bias {med['F.linear(bias)'] / med['ours (w^T, bias)']:.3f}"
                f"  | SM clock {min(clocks)}-{max(clocks)} MHz, {min(watts):.0f}-{max(watts):.0f} W"
                f"  | isolated calls after a pause: ours/torch {cold['torch.matmul'] / cold['ours']:.3f},"
                f" bias {cold['F.linear(bias)'] / cold['ours (w^T, bias)']:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
