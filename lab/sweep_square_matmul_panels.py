"""Sweep of square_matmul_'s panel route (cuBLAS into bounded workspace blocks) on a GPU.

For each (rows, n, dtype) and each route setting, checks the default mode
(workspace bound 1/16 of x, at most 64 MiB) against a float64 reference
(bias and the transposed weight on), measures its peak extra reserved and
allocated memory from a cold allocator, and times it against
``torch.matmul(x, w)`` and the zero-workspace waves kernel
(``workspace_bytes=0``) with CUDA events. The settings are forced with
make_inplace._testing.forced_route (docs/routing.md):

- "default": the routing policy's choice (docs/routing.md): the panels where
  they pay, one batched cuBLAS call per panel over its workspace blocks
- "per-block": ``forced_route(panels_batched=False)``, the policy's choice with
  one GEMM per workspace block wherever the panels run
- "any size": ``forced_route("panels")``, the panels at any size the bound
  allows (a bound of 2 MiB and room for a row), also where the policy would run
  the wgmma or FFMA kernel; under a 2 MiB bound the policy decides

    python lab/sweep_square_matmul_panels.py --out panels.json
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

import make_inplace
from make_inplace._measure import cuda_peak_extra, fresh_cuda_memory
from make_inplace._testing import forced_route
from sweep_square_matmul_waves import time_ms, write_results  # time_ms: median of `reps` event-timed calls fn(i)

SHAPES = [(16384, 512), (40000, 1024), (16384, 2048), (16384, 4096), (65536, 768),
          (16384, 1024), (4097, 8192), (20000, 777), (65536, 1030)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SETTINGS = {  # label: forced_route's arguments
    "default": {},
    "per-block": dict(panels_batched=False),
    "any size": dict(route="panels"),
}
TOLERANCE = {torch.bfloat16: 1.2e-2, torch.float16: 2e-3, torch.float32: 2e-5}
L2_BYTES = 50 << 20


def check(rows, n, dtype, gen):
    """Default mode with bias and transpose against float64: (rel_err, PeakExtra)."""
    fresh_cuda_memory()
    x = torch.randn(rows, n, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    w = (torch.randn(n, n, generator=gen, device="cuda", dtype=torch.float32) / math.sqrt(n)).to(dtype)
    b = torch.randn(n, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    ref = x.double() @ w.double().t() + b.double()
    torch.addmm(b, x[:2], w)  # cuBLAS handle and workspace exist before the measurement
    fresh_cuda_memory()
    peak = cuda_peak_extra(lambda: make_inplace.square_matmul_(x, w, b, transpose=True))
    got = x.double()
    rel = ((got - ref).norm() / ref.norm()).item() if bool(torch.isfinite(got).all()) else float("inf")
    return rel, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sweep_square_matmul_panels: needs CUDA", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    results, failures = [], 0
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    for rows, n in SHAPES:
        for dtype in DTYPES:
            name = str(dtype).replace("torch.", "")
            bound = min(rows * n * torch.finfo(dtype).bits // 8 // 16, 64 << 20)
            # Timing inputs: an orthogonal W keeps x's norm under repeated in-place application.
            w = torch.linalg.qr(torch.randn(n, n, generator=gen, device="cuda"))[0].to(dtype)
            x = torch.randn(rows, n, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
            copies = max(1, min(8, math.ceil(2 * L2_BYTES / x.nbytes)))
            xs = [x] + [x.clone() for _ in range(copies - 1)]
            out = torch.empty_like(x)
            torch_ms = time_ms(lambda i: torch.matmul(xs[i % copies], w, out=out), args.reps)
            waves_ms = time_ms(lambda i: make_inplace.square_matmul_(xs[i % copies], w, workspace_bytes=0), args.reps)
            line = f"{rows:6d} {n:5d} {name:>9} bound {bound / 2**20:5.2f} MiB  torch {torch_ms:7.3f}  waves {torch_ms / waves_ms:5.2f}x"
            rec = dict(rows=rows, n=n, dtype=name, bound_bytes=bound, torch_ms=torch_ms, waves_ms=waves_ms, settings={})
            for label, setting in SETTINGS.items():
                try:
                    with forced_route(**setting):
                        ms = time_ms(lambda i: make_inplace.square_matmul_(xs[i % copies], w), args.reps)
                        rel, peak = check(rows, n, dtype, gen)
                    ok = rel <= TOLERANCE[dtype] and peak.reserved <= bound and peak.allocated <= bound
                    rec["settings"][label] = dict(ms=ms, ratio=torch_ms / ms, rel_err=rel, reserved=peak.reserved,
                                                  allocated=peak.allocated, ok=ok)
                    line += f" | {label} {torch_ms / ms:5.2f}x{'' if ok else ' FAIL'}"
                except Exception as exc:  # report and keep sweeping
                    ok = False
                    rec["settings"][label] = dict(ok=False, error=f"{type(exc).__name__}: {exc}")
                    line += f" | {label} ERROR {exc}"
                failures += not ok
            if not all(bool(torch.isfinite(t).all()) for t in xs):
                line += " NON-FINITE"
                failures += 1
            print(line, flush=True)
            results.append(rec)
            del x, xs, out, w
            fresh_cuda_memory()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                commit=os.environ.get("COMMIT", "unknown"))
    return write_results(args.out, meta, results, failures)


if __name__ == "__main__":
    sys.exit(main())
