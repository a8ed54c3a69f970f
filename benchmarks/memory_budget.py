"""Memory-budget benchmark CLI: peak extra memory of an encoder layer vs sequence length.

A thin command line over ``make_inplace.budget.run_memory_budget`` (read its
docstring for the rows and how memory is measured). Defaults: on CUDA an
encoder layer of BERT-large's width (d_model 1024, 16 heads, ff 4096, batch 8, fp16 and bf16,
L = 1024 .. 131072, budgets 4 and 16 GiB); on CPU a small one that runs in
seconds (times only).

    python benchmarks/memory_budget.py --out out/memory_budget
    python benchmarks/memory_budget.py --seq-lens 1024,2048,4096 --dtypes float16 --budgets 4,16 --out out/mb
    python benchmarks/memory_budget.py --from-json out/memory_budget/memory_budget.json --out out/plot
      (tables, CSV and plot again from a saved run, e.g. where matplotlib is installed)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from make_inplace._measure import best_device  # noqa: E402
from make_inplace.budget import ROWS, default_config, format_summary, run_memory_budget, write_outputs  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--out", default=None, help="directory for memory_budget.json/.csv/.png (default: print only)")
    parser.add_argument("--seq-lens", type=_ints, default=None, help="comma-separated sequence lengths")
    parser.add_argument("--dtypes", type=lambda t: t.split(","), default=None, help="e.g. float16,bfloat16")
    parser.add_argument("--budgets", type=_floats, default=None, help="budgets in GiB, e.g. 4,16")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--d-model", type=int, default=None)
    parser.add_argument("--nhead", type=int, default=None)
    parser.add_argument("--dim-feedforward", type=int, default=None)
    parser.add_argument("--refine-steps", type=int, default=None, help="bisection steps for the longest fitting length")
    parser.add_argument("--rows", type=lambda t: t.split(","), default=None, help=f"subset of {','.join(ROWS)}")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--from-json", default=None, help="re-write tables/CSV/plot from a saved memory_budget.json; runs nothing")
    args = parser.parse_args(argv)

    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        print(format_summary(result))
        if args.out:
            write_outputs(result, args.out, plot=not args.no_plot)
        return 0

    device = torch.device(args.device) if args.device else best_device()
    cfg = default_config(device)
    for name in ("seq_lens", "dtypes", "batch", "d_model", "nhead", "dim_feedforward", "refine_steps", "rows"):
        value = getattr(args, name)
        if value is not None:
            setattr(cfg, name, value)
    if args.budgets is not None:
        cfg.budgets_gib = args.budgets
    unknown = set(cfg.rows) - set(ROWS)
    if unknown:
        parser.error(f"--rows: unknown {sorted(unknown)}; choose from {ROWS}")
    run_memory_budget(device, config=cfg, out_dir=args.out, plot=not args.no_plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
