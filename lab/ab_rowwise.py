"""softmax_, layer_norm_ and rms_norm_ at chosen shapes, for A/B runs of builds:
each call of this script times the library it imports (run it once per build,
alternating, with PYTHONPATH pointing at each build's copy of the package) and
appends one JSON line per case to --out. Timed as the benchmarks time it
(make_inplace._measure.time_ms); a case's time is the smallest of three
30-call medians, in microseconds. Each case first checks one call against
torch in float32, so a build that is fast but wrong shows.

    PYTHONPATH=/tmp/A python lab/ab_rowwise.py --tag A --out ab.jsonl
    PYTHONPATH=/tmp/B python lab/ab_rowwise.py --tag B --out ab.jsonl
    python lab/ab_rowwise.py --report ab.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

CASES = ("layer_norm:262144x1024:bfloat16,float16,float32;softmax:262144x1024:bfloat16,float16,float32;"
         "layer_norm:262144x128:bfloat16,float16;layer_norm:65536x512:bfloat16;"
         "layer_norm:4194304x32:bfloat16;softmax:65536x512:bfloat16,float32")
TOLERANCE = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-5}


def parse_cases(spec: str) -> list[tuple[str, tuple[int, int], str]]:
    """'op:RxN:dtype,dtype;...' -> [(op, (R, N), dtype), ...]."""
    out = []
    for part in spec.split(";"):
        op, shape, dtypes = part.split(":")
        rows, n = map(int, shape.split("x"))
        out += [(op, (rows, n), d) for d in dtypes.split(",")]
    return out


def measure(tag: str, out: str, cases: list[tuple[str, tuple[int, int], str]], device_name: str) -> None:
    import torch
    import torch.nn.functional as F

    import make_inplace
    from make_inplace._measure import time_ms

    device = torch.device(device_name)
    with open(out, "a") as f:
        for op, (rows, n), name in cases:
            dtype = getattr(torch, name)
            w = torch.rand(n, device=device, dtype=dtype) + 0.5
            b = torch.randn(n, device=device, dtype=dtype)
            ours, ref = {
                "softmax": (make_inplace.softmax_, lambda x: torch.softmax(x.float(), -1)),
                "layer_norm": (lambda x: make_inplace.layer_norm_(x, (n,), w, b),
                               lambda x: F.layer_norm(x.float(), (n,), w.float(), b.float())),
                "rms_norm": (lambda x: make_inplace.rms_norm_(x, (n,), w),
                             lambda x: F.rms_norm(x.float(), (n,), w.float(), eps=torch.finfo(dtype).eps)),
            }[op]
            x = torch.randn(rows, n, device=device, dtype=dtype) * 2 + 3
            expect = ref(x)
            ours(x)
            err = ((x.float() - expect).abs().max() / expect.abs().max().clamp_min(1)).item()
            del expect
            x = torch.randn(rows, n, device=device, dtype=dtype)
            us = min(1e3 * time_ms(lambda: ours(x), device, reps=30) for _ in range(3))
            row = {"tag": tag, "op": op, "shape": [rows, n], "dtype": name, "us": us,
                   "gbps": 2 * x.numel() * x.element_size() / us / 1e3, "err": err,
                   "ok": err <= TOLERANCE[name]}
            f.write(json.dumps(row) + "\n")
            print(row, flush=True)
            del x


def report(path: str) -> None:
    cases = defaultdict(lambda: defaultdict(list))
    bad = set()
    for line in open(path):
        r = json.loads(line)
        key = (r["op"], tuple(r["shape"]), r["dtype"])
        cases[key][r["tag"]].append(r["us"])
        if not r["ok"]:
            bad.add((r["tag"],) + key)
    tags = list(dict.fromkeys(t for c in cases.values() for t in c))
    print("us per call (min-max over rounds)")
    print("op shape dtype | " + " | ".join(tags))
    for key, c in cases.items():
        cells = [f"{min(c[t]):.1f}-{max(c[t]):.1f}" if t in c else "-" for t in tags]
        print(f"{key[0]} {key[1]} {key[2]} | " + " | ".join(cells))
    for b in sorted(bad):
        print("outside tolerance:", b)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tag")
    p.add_argument("--out")
    p.add_argument("--cases", default=CASES, help="op:RxN:dtype,dtype;... (ops: softmax, layer_norm, rms_norm)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--report")
    a = p.parse_args()
    if a.report:
        report(a.report)
    else:
        measure(a.tag, a.out, parse_cases(a.cases), a.device)


if __name__ == "__main__":
    main()
