"""Summarizes a pytest-benchmark JSON: per group, each impl's GPU median time,
throughput, peak extra memory, and its speed relative to the group's torch
rows (the best of torch eager and torch.compile)."""

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    data = json.load(open(path))
    groups = defaultdict(list)
    for b in data["benchmarks"]:
        groups[b["group"]].append(b)
    for group, items in groups.items():
        torch_ms = [b["extra_info"]["median_ms"] for b in items if b["extra_info"]["impl"].startswith("torch")]
        best = min(torch_ms) if torch_ms else None
        print(group)
        for b in sorted(items, key=lambda b: b["extra_info"]["impl"]):
            e = b["extra_info"]
            rate = f"{e['tflops']:.1f} TFLOP/s" if "tflops" in e else ""
            if "gb_per_s" in e and "tflops" not in e:
                rate = f"{e['gb_per_s']:.0f} GB/s"
            ratio = f"{best / e['median_ms']:.2f}x" if best else ""
            mem = f"{e.get('peak_extra_reserved_mib', float('nan')):.1f}/{e.get('peak_extra_allocated_mib', float('nan')):.1f} MiB"
            print(f"  {e['impl']:<24} {e['median_ms']:9.4f} ms  {rate:>16}  vs best torch {ratio:>6}  extra res/alloc {mem}")


if __name__ == "__main__":
    main(sys.argv[1])
