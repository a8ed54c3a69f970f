"""Writes one GPU's committed benchmark summary from pytest-benchmark JSON.

    pytest benchmarks --benchmark-only --benchmark-json=bench.json      # on the GPU
    python benchmarks/summarize.py bench.json@abc1234 --out benchmarks/results/h100
    python benchmarks/summarize.py benchmarks/results/h100/summary.csv --readme
    python benchmarks/summarize.py --plot benchmarks/results/h100     # summary.png again from summary.csv

Each input is PATH or PATH@COMMIT (the commit the library was built from:
pytest-benchmark's own commit_info is wrong on a machine that gets the tree
without .git). Several inputs merge; a later file's groups replace an earlier
one's. Writes summary.csv (one row per op, shape, dtype and make_inplace
variant), summary.md (the same as a table, plus where each row comes from)
and summary.png (speed vs best torch and ceiling share per op: summary_plot.py;
skipped with a note where matplotlib is not installed). ``--plot DIR`` draws
DIR/summary.png again from DIR/summary.csv (and the GPU named in summary.md).
``--readme`` prints the README's excerpt instead: per op, bfloat16 (and
float32 for square_matmul_), the range over the benchmark's shapes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

from summary_plot import plot

DTYPES = ("bfloat16", "float16", "float32", "float64")
# Benchmark group prefix -> public name (the bench files name groups "<op> [fwd|bwd] <dtype> <shape>").
OPS = {
    "square_matmul": "square_matmul_",
    "softmax": "softmax_",
    "layer_norm": "layer_norm_",
    "rms_norm": "rms_norm_",
    "trilinear fwd": "trilinear_interpolation",
    "trilinear bwd": "trilinear_interpolation_backward",
    "outer_product fwd": "outer_product",
    "outer_product bwd": "outer_product_backward",
}
EAGER = ("torch", "torch eager", "torch.matmul")
COLUMNS = [
    "op", "shape", "dtype", "ours_ms", "torch_eager_ms", "torch_compile_ms", "other_torch",
    "speed_vs_best_torch", "ours_throughput", "ceiling_share",
    "ours_mib", "torch_eager_mib", "torch_compile_mib", "commit",
]


def split_group(group: str) -> tuple[str, str, str]:
    """'layers InplaceTransformerEncoderLayer ff=4096 float16 (8, 1024, 1024) h=16' -> (op, dtype, shape)."""
    words = group.split()
    at = next(i for i, w in enumerate(words) if w in DTYPES)
    head, dtype, shape = words[:at], words[at], " ".join(words[at + 1 :])
    if head[0] == "layers":
        name, rest = head[1], head[2:]
    elif " ".join(head[:2]) in OPS:
        name, rest = OPS[" ".join(head[:2])], head[2:]
    else:
        name, rest = OPS.get(head[0], head[0]), head[1:]
    return (f"{name} ({' '.join(rest)})" if rest else name), dtype, shape


def _mib(e: dict) -> str:
    v = e.get("peak_extra_reserved_mib")
    return "" if v is None else f"{v:.0f}"


def _ms(e: dict | None) -> str:
    return "" if e is None else f"{e['median_ms']:.3f}"


def summarize(items: list[dict], commit: str) -> list[dict]:
    """Rows for one benchmark group (every impl at one op, dtype and shape)."""
    by_impl = {b["extra_info"]["impl"]: b["extra_info"] for b in items}
    op, dtype, shape = split_group(items[0]["group"])
    eager = next((by_impl[i] for i in EAGER if i in by_impl), None)
    compiled = by_impl.get("torch.compile")
    others = {i: e for i, e in by_impl.items() if i.startswith("torch") and e is not eager and e is not compiled}
    torch_ms = [e["median_ms"] for i, e in by_impl.items() if i.startswith("torch")]
    rows = []
    for impl, e in by_impl.items():
        if not impl.startswith("make_inplace"):
            continue
        compute_bound = "tflops" in e
        rows.append({
            "op": op + (" (workspace_bytes=0)" if impl.endswith("ws=0") else ""),
            "shape": shape,
            "dtype": dtype,
            "ours_ms": _ms(e),
            "torch_eager_ms": _ms(eager),
            "torch_compile_ms": _ms(compiled),
            "other_torch": "; ".join(f"{i}: {_ms(o)} ms, {_mib(o)} MiB" for i, o in others.items()),
            "speed_vs_best_torch": f"{min(torch_ms) / e['median_ms']:.2f}" if torch_ms else "",
            "ours_throughput": f"{e['tflops']:.0f} TFLOP/s" if compute_bound else (f"{e['gb_per_s']:.0f} GB/s" if "gb_per_s" in e else ""),
            # Share of the card's copy bandwidth: a ceiling only for memory-bound ops.
            "ceiling_share": "" if compute_bound or "share_of_copy_bandwidth" not in e else f"{e['share_of_copy_bandwidth']:.2f}",
            "ours_mib": _mib(e),
            "torch_eager_mib": _mib(eager) if eager else "",
            "torch_compile_mib": _mib(compiled) if compiled else "",
            "commit": commit,
        })
    return rows


def load(inputs: list[str]) -> tuple[list[dict], list[dict]]:
    """(rows, sources) from PATH[@COMMIT] arguments; later groups replace earlier ones."""
    groups: dict[str, tuple[list[dict], str]] = {}
    rows: list[dict] = []
    sources = []
    for arg in inputs:
        path, _, commit = arg.partition("@")
        if path.endswith(".csv"):  # an earlier summary: its rows, and its sources from the summary.md beside it
            with open(path, newline="") as f:
                rows += csv.DictReader(f)
            sources += earlier_sources(os.path.join(os.path.dirname(path), "summary.md"))
            continue
        with open(path) as f:
            data = json.load(f)
        extra = data["benchmarks"][0]["extra_info"]
        sources.append({"file": os.path.basename(path), "commit": commit or "unknown", "date": data.get("datetime", "")[:10],
                        "device": extra.get("device", ""), "torch": extra.get("torch", "")})
        fresh: dict[str, list[dict]] = {}
        for b in data["benchmarks"]:
            fresh.setdefault(b["group"], []).append(b)
        groups.update({g: (items, commit or "unknown") for g, items in fresh.items()})
    fresh_rows = [row for items, commit in groups.values() for row in summarize(items, commit)]
    # A benchmark run replaces an earlier summary's rows for the same op, shape and dtype.
    replaced = {_key(r) for r in fresh_rows}
    rows = [r for r in rows if _key(r) not in replaced] + fresh_rows
    # A source stays while a row of its commit does; one of the per-op files
    # (bench_softmax.json, ...) only while a row of its own op does.
    used = {r["commit"] for r in rows} | {(bench_file(r["op"]), r["commit"]) for r in rows}
    sources = [s for s in sources
               if s["commit"] in used and (s["file"] not in BENCH_FILES or (s["file"], s["commit"]) in used)]
    order = list(OPS.values())
    rows.sort(key=lambda r: next((i for i, name in enumerate(order) if r["op"].split(" ")[0] == name), len(order)))
    return rows, sources


BENCH_STEMS = ("square_matmul", "softmax", "layer_norm", "rms_norm", "trilinear", "outer_product", "layers")
BENCH_FILES = {f"bench_{stem}.json" for stem in BENCH_STEMS}


def bench_file(op: str) -> str:
    """The per-op JSON (named after benchmarks/bench_<op>.py) a summary row's op comes from."""
    if op.startswith("Inplace"):
        return "bench_layers.json"
    return next((f"bench_{stem}.json" for stem in BENCH_STEMS if op.startswith(stem)), "")


def _key(row: dict) -> tuple[str, str, str]:
    return row["op"], row["shape"], row["dtype"]


def earlier_sources(md_path: str) -> list[dict]:
    """The source table of a summary.md written by this script (none if it is absent)."""
    if not os.path.exists(md_path):
        return []
    found = []
    with open(md_path) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 5 and cells[0].endswith(".json"):
                found.append(dict(zip(("file", "commit", "date", "device", "torch"), cells)))
    return found


HEADERS = {
    "ours_ms": "ours ms", "torch_eager_ms": "torch eager ms", "torch_compile_ms": "torch.compile ms",
    "other_torch": "other torch", "speed_vs_best_torch": "speed vs best torch", "ours_throughput": "ours throughput",
    "ceiling_share": "ceiling share", "ours_mib": "ours MiB", "torch_eager_mib": "eager MiB",
    "torch_compile_mib": "compile MiB",
}


def markdown(rows: list[dict], columns: list[str] | None = None) -> str:
    columns = columns or COLUMNS
    lines = ["| " + " | ".join(HEADERS.get(c, c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _span(values: list[str]) -> str:
    present = sorted((v for v in values if v), key=float)
    if not present:
        return ""
    lo, hi = present[0], present[-1]
    return lo if lo == hi else f"{lo}–{hi}"


def readme_rows(rows: list[dict]) -> list[dict]:
    """One row per op and dtype (bfloat16; float32 too for square_matmul_), as ranges over the shapes."""
    picked: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if r["dtype"] == "bfloat16" or (r["op"].startswith("square_matmul_") and r["dtype"] == "float32"):
            picked.setdefault((r["op"], r["dtype"]), []).append(r)
    return [
        {
            "op": op, "dtype": dtype, "shapes": str(len(rs)),
            "speed_vs_best_torch": _span([r["speed_vs_best_torch"] for r in rs]),
            "ceiling_share": _span([r["ceiling_share"] for r in rs]),
            "ours_mib": _span([r["ours_mib"] for r in rs]),
            "torch_eager_mib": _span([r["torch_eager_mib"] for r in rs]),
            "commit": ", ".join(dict.fromkeys(r["commit"] for r in rs)),  # every commit behind the range
        }
        for (op, dtype), rs in picked.items()
    ]


README_COLUMNS = ["op", "dtype", "shapes", "speed_vs_best_torch", "ceiling_share", "ours_mib", "torch_eager_mib", "commit"]


def write(rows: list[dict], sources: list[dict], out: str) -> str | None:
    """summary.csv, summary.md and summary.png in out; the PNG's path, or None where matplotlib is missing."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out, "summary.md"), "w") as f:
        devices = ", ".join(sorted({s["device"] for s in sources}))
        f.write(f"# Benchmark summary: {devices}\n\nWritten by `benchmarks/summarize.py` from the pytest-benchmark runs below "
                "(the raw JSON is not kept in the tree: git history has it). Columns: docs/results.md.\n\n")
        f.write("| source | commit | date | device | torch |\n|---|---|---|---|---|\n")
        f.writelines(f"| {s['file']} | {s['commit']} | {s['date']} | {s['device']} | {s['torch']} |\n" for s in sources)
        f.write("\n" + markdown(rows) + "\n")
    return write_plot(rows, sources, out)


def write_plot(rows: list[dict], sources: list[dict], out: str) -> str | None:
    """out/summary.png, titled with the GPU and torch of the sources (the folder's name if none are known)."""
    devices = ", ".join(sorted({s["device"] for s in sources if s["device"]})) or os.path.basename(os.path.abspath(out))
    torches = ", ".join(sorted({s["torch"] for s in sources if s["torch"]}))
    title = f"make_inplace vs the best torch: {devices}" + (f", torch {torches}" if torches else "")
    return plot(rows, os.path.join(out, "summary.png"), title)


def replot(folder: str) -> str | None:
    """summary.png again from a folder's summary.csv and summary.md (the raw JSON is not kept)."""
    with open(os.path.join(folder, "summary.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    return write_plot(rows, earlier_sources(os.path.join(folder, "summary.md")), folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="*", help="pytest-benchmark JSON files, each PATH or PATH@COMMIT, or a summary.csv")
    parser.add_argument("--out", help="directory for summary.csv, summary.md and summary.png")
    parser.add_argument("--plot", metavar="DIR", help="draw DIR/summary.png from DIR/summary.csv; reads no inputs")
    parser.add_argument("--readme", action="store_true", help="print the README's table instead")
    args = parser.parse_args(argv)
    if args.plot:
        if args.inputs or args.out or args.readme:
            parser.error("--plot DIR takes no inputs, --out or --readme")
        png = replot(args.plot)
        if png:
            print(f"wrote {png}")
        return 0
    if not args.inputs:
        parser.error("give pytest-benchmark JSON files or a summary.csv (or --plot DIR)")
    rows, sources = load(args.inputs)
    if args.readme:
        print(markdown(readme_rows(rows), README_COLUMNS))
    elif args.out:
        png = write(rows, sources, args.out)
        print(f"wrote {len(rows)} rows to {args.out}/summary.csv and summary.md" + (" and summary.png" if png else ""))
    else:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
