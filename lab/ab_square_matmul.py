"""square_matmul_ against torch.matmul at the benchmark shapes, for A/B runs of
two builds: each call of this script times the library it imports (run it
once per build, alternating, with PYTHONPATH pointing at each build's copy of
the package) and appends one JSON line per case to --out. Timed as the
benchmarks time it (make_inplace._measure.time_ms; input sets that fit in L2
are rotated), microseconds per call.

    PYTHONPATH=/tmp/A python lab/ab_square_matmul.py --tag A --out ab.jsonl
    PYTHONPATH=/tmp/B python lab/ab_square_matmul.py --tag B --out ab.jsonl
    python lab/ab_square_matmul.py --report ab.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

SHAPES = [(16384, 512), (65536, 768), (40000, 1024), (16384, 2048), (16384, 4096), (8192, 1024), (8192, 768)]
DTYPES = ["bfloat16", "float16"]


def measure(tag: str, out: str, transpose: bool, shapes: list[tuple[int, int]], dtypes: list[str]) -> None:
    import torch

    import make_inplace
    from make_inplace._measure import time_ms

    device = torch.device("cuda")
    with open(out, "a") as f:
        for rows, n in shapes:
            for name in dtypes:
                dtype = getattr(torch, name)
                # As bench_square_matmul: sets that fit in L2 are rotated.
                sets = [(torch.randn(rows, n, device=device, dtype=dtype),
                         torch.randn(n, n, device=device, dtype=dtype) / n**0.5)
                        for _ in range(4 if rows * n * dtype.itemsize < (64 << 20) else 1)]
                i = [0]

                def cycled(fn):
                    def call():
                        i[0] = (i[0] + 1) % len(sets)
                        return fn(*sets[i[0]])
                    return call

                def us(fn):
                    return 1e3 * time_ms(cycled(fn), device, reps=40)

                row = {"tag": tag, "shape": [rows, n], "dtype": name, "transpose": transpose,
                       "torch": us(lambda x, w: torch.matmul(x, w.t() if transpose else w)),
                       "default": us(lambda x, w: make_inplace.square_matmul_(x, w, transpose=transpose)),
                       "ws0": us(lambda x, w: make_inplace.square_matmul_(x, w, transpose=transpose,
                                                                          workspace_bytes=0))}
                f.write(json.dumps(row) + "\n")
                print(row, flush=True)


def report(path: str) -> None:
    cases = defaultdict(lambda: defaultdict(list))
    for line in open(path):
        r = json.loads(line)
        key = (tuple(r["shape"]), r["dtype"], r["transpose"])
        for mode in ("default", "ws0"):
            cases[key][(r["tag"], mode)].append(r["torch"] / r[mode])
    tags = sorted({t for c in cases.values() for t, _ in c})
    print("ratio to torch.matmul, median over rounds (min-max)")
    print("shape dtype transpose | " + " | ".join(f"{t} {m}" for m in ("default", "ws0") for t in tags))
    for key, c in cases.items():
        cells = []
        for mode in ("default", "ws0"):
            for t in tags:
                v = c.get((t, mode), [])
                cells.append(f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" if v else "-")
        print(f"{key[0]} {key[1]} {key[2]} | " + " | ".join(cells))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tag")
    p.add_argument("--out")
    p.add_argument("--transpose", action="store_true")
    p.add_argument("--shapes", default=",".join(f"{r}x{n}" for r, n in SHAPES))
    p.add_argument("--dtypes", default=",".join(DTYPES), help="e.g. float32 (TF32 stays off)")
    p.add_argument("--report")
    a = p.parse_args()
    if a.report:
        report(a.report)
    else:
        shapes = [tuple(map(int, s.split("x"))) for s in a.shapes.split(",")]
        measure(a.tag, a.out, a.transpose, shapes, a.dtypes.split(","))


if __name__ == "__main__":
    main()
