"""One call each of softmax_ / layer_norm_ / rms_norm_, torch's op and its
torch.compile'd version, for ncu. Everything is run once first (Inductor's
autotuning included); each profiled call directly follows an unprofiled call
of the same function, as in the benchmarks' back-to-back timing, and only the
calls between cudaProfilerStart and Stop are profiled, hence
--profile-from-start off (add --cache-control none --clock-control none to
see the L2 state and clocks that pytest-benchmark sees):

    ncu --profile-from-start off --section SpeedOfLight \
        python lab/profile_rowwise.py softmax:bf16:16384x4096 layer_norm:fp16:262144x128 rms_norm:bf16:4194304x32
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import make_inplace

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def calls(op: str, x: torch.Tensor) -> list:
    n = x.shape[-1]
    w = torch.randn(n, device="cuda", dtype=x.dtype)
    b = torch.randn(n, device="cuda", dtype=x.dtype)
    if op == "softmax":
        ref = lambda: torch.softmax(x, -1)  # noqa: E731
        ours = lambda: make_inplace.softmax_(x)  # noqa: E731
    elif op == "rms_norm":
        ref = lambda: F.rms_norm(x, (n,), w)  # noqa: E731
        ours = lambda: make_inplace.rms_norm_(x, (n,), w)  # noqa: E731
    else:
        ref = lambda: F.layer_norm(x, (n,), w, b)  # noqa: E731
        ours = lambda: make_inplace.layer_norm_(x, (n,), w, b)  # noqa: E731
    torch._dynamo.reset()
    return [ours, ref, torch.compile(ref, dynamic=False)]


cases = []
for case in sys.argv[1:]:
    op, dname, shape = case.split(":")
    rows, n = (int(v) for v in shape.split("x"))
    x = torch.randn(rows, n, device="cuda", dtype=DTYPES[dname])
    fns = calls(op, x)
    for fn in fns:
        fn()
    cases.append(fns)
for fns in cases:
    for fn in fns:
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
