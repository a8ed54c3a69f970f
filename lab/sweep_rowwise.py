"""Sweep of softmax_ and layer_norm_ (and rms_norm_, --ops) against torch at the row-wise benchmark's shapes, on a GPU.

Two timings per case, both from CUDA events, median of several runs:
  * ``sync``: one call per event pair, synchronized after each (as the
    pytest-benchmark harness does), so host time before the launch counts;
  * ``queue``: ``--burst`` calls back to back between one event pair, the
    host running ahead, which is the GPU time of one call inside a model.
GB/s counts one read and one write of x. Each case also checks the result
against torch in float32 (the first call, from fresh random inputs), so a
configuration that is fast but wrong shows.

Kernel choices forced through make_inplace._testing.forced_route
(docs/routing.md) can be compared by running this script once per setting,
``--tag`` naming it: ``--no-staged-rows`` keeps softmax_ and layer_norm_ off
their staged-rows (shared-memory ring) kernels.

    python lab/sweep_rowwise.py --out sweep.json --tag default
    python lab/sweep_rowwise.py --out sweep.json --tag no-staged-rows --no-staged-rows --no-torch
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import make_inplace
from make_inplace._testing import forced_route

SHAPES = [(262144, 1024), (16384, 4096), (4096, 16384), (1024, 65536), (262144, 128), (4194304, 32)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def pair(op: str, n: int, dtype: torch.dtype):
    """(make_inplace's op, torch's op) on x, with the same weight and bias."""
    if op == "softmax":
        return make_inplace.softmax_, lambda x: torch.softmax(x, -1)
    if op == "rms_norm":  # no weight: applied over and over, one would shrink x's small-weight columns to 0
        return (lambda x: make_inplace.rms_norm_(x, (n,)),
                lambda x: torch.nn.functional.rms_norm(x, (n,), eps=torch.finfo(dtype).eps))
    w = torch.rand(n, device="cuda", dtype=dtype) + 0.5
    b = torch.randn(n, device="cuda", dtype=dtype)
    return (lambda x: make_inplace.layer_norm_(x, (n,), w, b),
            lambda x: torch.nn.functional.layer_norm(x, (n,), w, b))


def timed(fn, x, reps: int, burst: int) -> tuple[float, float]:
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    sync, queue = [], []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(x)
        e.record()
        e.synchronize()
        sync.append(s.elapsed_time(e))
    for _ in range(max(1, reps // 4)):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(burst):
            fn(x)
        e.record()
        e.synchronize()
        queue.append(s.elapsed_time(e) / burst)
    return statistics.median(sync), statistics.median(queue)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="softmax,layer_norm")
    parser.add_argument("--dtypes", default="bf16,fp16,fp32")
    parser.add_argument("--shapes", default="", help="e.g. 16384x4096,262144x128 (default: the row-wise benchmark's)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--staged-rows", action=argparse.BooleanOptionalAction, default=True,
                        help="--no-staged-rows: softmax_/layer_norm_ without their staged-rows kernels "
                             "(forced_route(staged_rows=False))")
    parser.add_argument("--tag", default="default")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    with forced_route(staged_rows=args.staged_rows):
        rows_out = sweep(args, shapes)
    if args.out:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "staged_rows": args.staged_rows}
        with open(args.out, "a") as f:
            f.write(json.dumps({"meta": meta, "rows": rows_out}) + "\n")


def sweep(args: argparse.Namespace, shapes) -> list[dict]:
    """Measures every (op, dtype, shape) case; prints a line and returns a row for each."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows_out = []
    print(f"{'tag':10} {'op':10} {'dtype':5} {'shape':>16} {'ours q GB/s':>11} {'sync':>6} "
          f"{'torch q':>8} {'sync':>6} {'q ratio':>7} {'s ratio':>7} {'err':>8}")
    for op in args.ops.split(","):
        for dname in args.dtypes.split(","):
            dtype = DTYPES[dname]
            for rows, n in shapes:
                x = torch.randn(rows, n, device="cuda", dtype=dtype, generator=gen)
                fn, ref_fn = pair(op, n, dtype)
                expected = ref_fn(x.float().to(dtype)).float()
                err = ((fn(x).float() - expected).norm() / expected.norm()).item()
                del expected
                nbytes = 2 * x.numel() * x.element_size()
                t_sync, t_queue = timed(fn, x, args.reps, args.burst)
                r_sync = r_queue = float("nan")
                if args.torch:
                    r_sync, r_queue = timed(ref_fn, x, args.reps, args.burst)
                row = {
                    "tag": args.tag, "op": op, "dtype": dname, "rows": rows, "cols": n,
                    "ours_sync_ms": t_sync, "ours_queue_ms": t_queue,
                    "torch_sync_ms": r_sync, "torch_queue_ms": r_queue,
                    "ours_queue_gbps": nbytes / t_queue / 1e6, "ours_sync_gbps": nbytes / t_sync / 1e6,
                    "torch_queue_gbps": nbytes / r_queue / 1e6, "torch_sync_gbps": nbytes / r_sync / 1e6,
                    "rel_err": err, "ok": err <= TOLERANCE[dtype],
                }
                rows_out.append(row)
                print(f"{args.tag:10} {op:10} {dname:5} {str((rows, n)):>16} {row['ours_queue_gbps']:11.0f} "
                      f"{row['ours_sync_gbps']:6.0f} {row['torch_queue_gbps']:8.0f} {row['torch_sync_gbps']:6.0f} "
                      f"{r_queue / t_queue:7.2f} {r_sync / t_sync:7.2f} {err:8.1e}{'' if row['ok'] else ' WRONG'}",
                      flush=True)
                del x
    return rows_out


if __name__ == "__main__":
    main()
