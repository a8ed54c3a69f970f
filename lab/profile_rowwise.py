"""One call each of softmax_ / layer_norm_ / rms_norm_ and torch's op, for ncu.

    ncu -k 'regex:[Ss]oft[Mm]ax|layer_norm|LayerNorm|rms_norm|RMSNorm' --section SpeedOfLight \
        python lab/profile_rowwise.py softmax:bf16:16384x4096 layer_norm:fp16:262144x128 rms_norm:bf16:4194304x32
"""

from __future__ import annotations

import sys

import torch

import make_inplace

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

for case in sys.argv[1:]:
    op, dname, shape = case.split(":")
    rows, n = (int(v) for v in shape.split("x"))
    dtype = DTYPES[dname]
    x = torch.randn(rows, n, device="cuda", dtype=dtype)
    if op == "softmax":
        make_inplace.softmax_(x)
        torch.softmax(x, -1)
    elif op == "rms_norm":
        w = torch.ones(n, device="cuda", dtype=dtype)
        make_inplace.rms_norm_(x, (n,), w)
        torch.nn.functional.rms_norm(x, (n,), w)
    else:
        w = torch.ones(n, device="cuda", dtype=dtype)
        b = torch.zeros(n, device="cuda", dtype=dtype)
        make_inplace.layer_norm_(x, (n,), w, b)
        torch.nn.functional.layer_norm(x, (n,), w, b)
    torch.cuda.synchronize()
