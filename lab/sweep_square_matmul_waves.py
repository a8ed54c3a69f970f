"""Sweep of the zero-workspace square matmul kernel (workspace_bytes=0) on a GPU.

For each (rows, n, dtype): checks ``make_inplace.square_matmul_(x, w,
workspace_bytes=0)`` against a float64 reference computed beforehand (the op
overwrites x, so the reference cannot be recomputed after), checks that it
allocated nothing, and times it against ``torch.matmul(x, w)`` with CUDA
events (warm-up, median of several runs, inputs rotated when they fit in L2).
For the check W is Gaussian scaled by 1/sqrt(n); for the timing it is a
random orthogonal matrix, so that applying it in place over and over keeps x's
norm (neither overflow nor timing zeros, even at n = 1). Prints a table and writes JSON to --out.

    python lab/sweep_square_matmul_waves.py --out waves.json

Runs in about a minute on an H100 (``--quick`` skips the timing of the
awkward shapes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

import make_inplace

MAIN_SHAPES = [(16384, 512), (40000, 1024), (16384, 2048), (16384, 4096), (65536, 768)]
MAIN_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (rows, n, dtype, transpose, bias): awkward widths and row counts, both
# weight layouts, bias, and float64.
AWKWARD = [
    (1000, 1, torch.bfloat16, False, True),
    (1000, 1, torch.float32, True, False),
    (517, 33, torch.bfloat16, True, True),
    (517, 33, torch.float16, False, False),
    (517, 33, torch.float32, False, True),
    (517, 33, torch.float64, True, True),
    (3001, 1000, torch.bfloat16, False, True),
    (3001, 1000, torch.float16, True, False),
    (3001, 1000, torch.float32, True, True),
    (300, 1000, torch.float64, False, True),
    (1, 4096, torch.bfloat16, False, False),
    (1, 1024, torch.float32, True, True),
    (4099, 8192, torch.bfloat16, True, True),
    (4099, 8192, torch.float16, False, False),
    (1024, 8192, torch.float32, False, True),
    (65536, 1024, torch.bfloat16, True, False),
    (65536, 64, torch.float16, False, True),
    (20000, 1030, torch.bfloat16, False, False),
    (16384, 4096, torch.bfloat16, True, False),
    (16384, 1024, torch.float32, True, False),
]
# Norm-wise relative error allowed against the float64 reference.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5, torch.float64: 1e-10}
L2_BYTES = 50 << 20


def make_inputs(rows, n, dtype, transpose, bias, gen, orthogonal=False):
    x = torch.randn(rows, n, generator=gen, device="cuda", dtype=torch.float32).to(dtype)
    w = torch.randn(n, n, generator=gen, device="cuda", dtype=torch.float32) / math.sqrt(n)
    w = (torch.linalg.qr(w)[0] if orthogonal else w).to(dtype)
    b = torch.randn(n, generator=gen, device="cuda", dtype=torch.float32).to(dtype) if bias else None
    return x, w, b


def check(rows, n, dtype, transpose, bias, gen):
    """One call of the waves kernel against float64; returns (rel_err, extra_bytes, ok)."""
    x, w, b = make_inputs(rows, n, dtype, transpose, bias, gen)
    ref = x.double() @ (w.double().t() if transpose else w.double())
    if b is not None:
        ref += b.double()
    ptr = x.data_ptr()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    allocated0 = torch.cuda.memory_allocated()
    make_inplace.square_matmul_(x, w, b, transpose=transpose, workspace_bytes=0)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - allocated0
    got = x.double()
    finite = bool(torch.isfinite(got).all())
    rel = ((got - ref).norm() / ref.norm().clamp_min(1e-300)).item() if finite else float("inf")
    ok = finite and rel <= TOLERANCE[dtype] and extra == 0 and x.data_ptr() == ptr
    return rel, extra, ok


def time_ms(fn, reps):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(i)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def bench(rows, n, dtype, transpose, gen, budget_s):
    x, w, _ = make_inputs(rows, n, dtype, transpose, False, gen, orthogonal=True)
    # Rotate through copies when x fits in L2, so neither side times a hot cache.
    copies = max(1, min(8, math.ceil(2 * L2_BYTES / x.nbytes)))
    xs = [x] + [x.clone() for _ in range(copies - 1)]
    mat = w.t() if transpose else w
    outs = [torch.empty_like(x) for _ in range(min(copies, 2))]

    def ours(i):
        make_inplace.square_matmul_(xs[i % copies], w, transpose=transpose, workspace_bytes=0)

    def theirs(i):
        torch.matmul(xs[i % copies], mat, out=outs[i % len(outs)])

    ours(0)
    theirs(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ours(1)
    torch.cuda.synchronize()
    once = time.perf_counter() - t0
    reps = int(max(5, min(50, budget_s / max(once, 1e-6) / 2)))
    for _ in range(3):
        ours(0)
        theirs(0)
    ms_ours = time_ms(ours, reps)
    ms_torch = time_ms(theirs, reps)
    if not all(bool(torch.isfinite(t).all()) for t in xs):
        raise RuntimeError(f"non-finite values after repeated application at {rows}x{n} {dtype}")
    flop = 2.0 * rows * n * n
    return ms_ours, ms_torch, flop / ms_ours / 1e9, flop / ms_torch / 1e9, reps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--quick", action="store_true", help="check the awkward shapes but do not time them")
    parser.add_argument("--budget-s", type=float, default=1.0, help="rough timing budget per case and side")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sweep_square_matmul_waves: needs CUDA", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 on both sides
    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = [(r, n, d, False, False, "main") for (r, n) in MAIN_SHAPES for d in MAIN_DTYPES]
    cases += [(r, n, d, t, b, "awkward") for (r, n, d, t, b) in AWKWARD]
    results = []
    failures = 0
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'rows':>6} {'n':>5} {'dtype':>9} {'T':>1} {'b':>1} {'rel_err':>9} {'ok':>4} "
          f"{'ours ms':>9} {'torch ms':>9} {'ours TF/s':>9} {'torch TF/s':>10} {'ratio':>6}")
    for rows, n, dtype, transpose, bias, group in cases:
        rec = dict(rows=rows, n=n, dtype=str(dtype).replace("torch.", ""), transpose=transpose, bias=bias,
                   group=group)
        try:
            rel, extra, ok = check(rows, n, dtype, transpose, bias, gen)
            rec.update(rel_err=rel, extra_allocated_bytes=extra, ok=ok)
            if group == "main" or not args.quick:
                ms_o, ms_t, tf_o, tf_t, reps = bench(rows, n, dtype, transpose, gen, args.budget_s)
                rec.update(ours_ms=ms_o, torch_ms=ms_t, ours_tflops=tf_o, torch_tflops=tf_t, ratio=ms_t / ms_o,
                           reps=reps)
        except Exception as exc:  # report and keep sweeping
            rec.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        failures += not rec["ok"]
        results.append(rec)
        timing = (f"{rec['ours_ms']:9.3f} {rec['torch_ms']:9.3f} {rec['ours_tflops']:9.1f} "
                  f"{rec['torch_tflops']:10.1f} {rec['ratio']:6.2f}") if "ratio" in rec else ""
        err = f"{rec['rel_err']:9.2e}" if "rel_err" in rec else f"{'-':>9}"
        print(f"{rows:6d} {n:5d} {rec['dtype']:>9} {int(transpose):1d} {int(bias):1d} {err} "
              f"{'ok' if rec['ok'] else 'FAIL':>4} {timing} {rec.get('error', '')}", flush=True)
        torch.cuda.empty_cache()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                tolerance={str(k).replace("torch.", ""): v for k, v in TOLERANCE.items()})
    return write_results(args.out, meta, results, failures)


def write_results(path: str, meta: dict, results: list, failures: int) -> int:
    """Writes a sweep's JSON and returns its exit status (1 when anything failed)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    print(f"{failures} failures; wrote {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
