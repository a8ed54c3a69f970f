"""Where one square_matmul_ call's time goes on a GPU: host enqueue vs GPU kernels.

For each shape (default workspace bound): the wall time of one call with CUDA
events, the host time to enqueue it (no synchronization), and the GPU time per
kernel name from torch.profiler, so host-bound panels (launch overhead above
the kernels' own time) show up as enqueue time close to the wall time.

    python lab/profile_square_matmul_panels.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import make_inplace

SHAPES = [(40000, 1024, torch.bfloat16), (16384, 2048, torch.bfloat16), (65536, 768, torch.bfloat16),
          (16384, 4096, torch.bfloat16)]


def main() -> None:
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    for rows, n, dtype in SHAPES:
        w = torch.linalg.qr(torch.randn(n, n, device="cuda"))[0].to(dtype)
        x = torch.randn(rows, n, device="cuda").to(dtype)
        for _ in range(3):
            make_inplace.square_matmul_(x, w)
        torch.cuda.synchronize()
        walls, enqueues = [], []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            t0 = time.perf_counter()
            make_inplace.square_matmul_(x, w)
            enqueues.append((time.perf_counter() - t0) * 1e3)
            end.record()
            end.synchronize()
            walls.append(start.elapsed_time(end))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                make_inplace.square_matmul_(x, w)
            torch.cuda.synchronize()
        print(f"\n({rows}, {n}) {dtype}: wall {statistics.median(walls):.3f} ms, host enqueue {statistics.median(enqueues):.3f} ms")
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0]
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:6]:
            print(f"  {e.count // 5:4d} per call  {e.self_device_time_total / 5 / 1e3:8.3f} ms per call  {e.key[:90]}")


if __name__ == "__main__":
    main()
