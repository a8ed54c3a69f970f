"""``python -m make_inplace``: runs every op on the best device, checks it
against torch and prints ours-vs-torch time and peak extra memory.

Options:
  --device cpu|cuda     override the device (default: CUDA if present)
  --ops a,b             only these report modules (e.g. square_matmul,softmax)
  --json PATH           also write the rows as JSON
  --memory-budget DIR   also run the encoder-layer memory-budget sweep into DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform

import torch

import make_inplace
from make_inplace.report import collect_rows, format_table
from make_inplace.report.measure import best_device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m make_inplace", description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--ops", default=None, help="comma-separated report modules")
    parser.add_argument("--json", default=None, help="write the rows to this JSON file")
    parser.add_argument("--memory-budget", default=None, metavar="DIR", help="run the memory-budget sweep into DIR")
    args = parser.parse_args(argv)

    device = torch.device(args.device) if args.device else best_device()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"make_inplace {make_inplace.__version__} | torch {torch.__version__} | {device.type}: {name} "
          f"| library backends: {','.join(make_inplace.build_backends())}")
    rows = collect_rows(device, args.ops.split(",") if args.ops else None)
    print(format_table(rows))
    print("ours/torch ms: median time per call; speed = torch ms / ours ms; MiB: peak extra "
          "max_memory_reserved of one call from a cold allocator (CUDA only); rel err: vs float64.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=1)
    if args.memory_budget:
        from make_inplace import budget

        budget.main(["--out", args.memory_budget, "--device", device.type])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
