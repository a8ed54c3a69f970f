"""``python -m make_inplace``: runs every op on the best device, checks it
against torch and prints ours-vs-torch time and peak extra memory.

Options:
  --device cpu|cuda     override the device (default: CUDA if present)
  --ops a,b             only these comparison modules (e.g. square_matmul,softmax)
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
from make_inplace._compare import collect_rows, format_table
from make_inplace._measure import best_device

MEMORY_MEASURE = {
    "cuda": "peak extra max_memory_reserved of one call from a cold allocator",
    "cpu": "peak of the running sum of the CPU allocations and frees torch.profiler records during one call",
}


def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo on Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()}, {torch.get_num_threads()} threads"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m make_inplace", description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    parser.add_argument("--ops", default=None, help="comma-separated comparison modules")
    parser.add_argument("--json", default=None, help="write the rows to this JSON file")
    parser.add_argument("--memory-budget", default=None, metavar="DIR", help="run the memory-budget sweep into DIR")
    args = parser.parse_args(argv)

    device = torch.device(args.device) if args.device else best_device()
    name = device_description(device)
    print(f"make_inplace {make_inplace.__version__} | torch {torch.__version__} | {device.type}: {name} "
          f"| library backends: {','.join(make_inplace.build_backends())}")
    rows = collect_rows(device, args.ops.split(",") if args.ops else None)
    print(format_table(rows))
    print(f"ours/torch ms: median time per call; speed = torch ms / ours ms; MiB: {MEMORY_MEASURE[device.type]}; "
          "rel err: vs float64 (hf rows: vs transformers eager).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "memory": MEMORY_MEASURE[device.type],
                       "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=1)
    if args.memory_budget:
        from make_inplace.budget import run_memory_budget

        run_memory_budget(device, out_dir=args.memory_budget)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
