"""Memory budget of Hugging Face models: eager vs torch.compile vs make_inplace.convert_, per family.

For BERT-large-like, GPT-2 medium-like, Llama-style (d=2048, 16 layers, GQA
32/8, MLP 8192) and ViT-L/14-at-448px-like base models (bf16, random weights
from configs), each point - one family, one mode, one sequence length (ViT:
one batch size) - runs in a fresh process (``python -m
make_inplace.hf.measure``): activation memory = peak ``max_memory_allocated``
during one forward minus ``memory_allocated`` before it (reserved likewise),
and the median forward time. Then:

* per family at the reference shape: the three modes side by side, converted
  memory / the better of eager and compile (target <= 0.35), eager time /
  converted time (target >= 0.9), and the converted output's error against
  eager (bf16);
* the longest sequence (ViT: largest batch) whose activation memory fits 8 and
  16 GiB: the longest measured point that fits, and, when even the longest
  measured one fits, an extrapolation (quadratic through the last three
  points, linear through two), marked as such;
* outputs: ``--out``/hf_memory_budget.json (every point), and in
  ``benchmarks/results/<gpu>/``: hf_memory_budget.csv, .md and .png.

    python benchmarks/hf_memory_budget.py --quick --out /tmp/hfmb          # < 9 min on an H100
    python benchmarks/hf_memory_budget.py --out /tmp/hfmb                  # more lengths, compile at three
    python benchmarks/hf_memory_budget.py --from-json /tmp/hfmb/hf_memory_budget.json   # tables and plot again
    python benchmarks/hf_memory_budget.py --quick --modes compile --merge /tmp/hfmb/hf_memory_budget.json --out /tmp/hfmb2
      (a second command adds the compile points to a first run's: two device commands instead of one)

``--quick``: three lengths per family for eager and converted, compile only at
the reference shape, and a deadline after which remaining points are skipped
(recorded as skipped).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from make_inplace.hf.models import DESCRIPTIONS, FAMILIES, REFERENCE_POINTS, sweeps_batch  # noqa: E402

MODES = ("eager", "compile", "converted")
MiB = 1 << 20
GiB = 1 << 30
TARGET_MEMORY, TARGET_SPEED = 0.35, 0.9


def sweep(family: str, quick: bool) -> list[int]:
    """Sequence lengths (ViT: batch sizes) in increasing order; the reference point is among them."""
    batch, seq = REFERENCE_POINTS[family]
    reference = batch if sweeps_batch(family) else seq
    factors = (0.25, 0.5, 1) if quick else (0.25, 0.5, 1, 2, 4)
    return sorted({max(1, int(reference * f)) for f in factors})


def reference_value(family: str) -> int:
    batch, seq = REFERENCE_POINTS[family]
    return batch if sweeps_batch(family) else seq


def shape_of(family: str, value: int) -> tuple[int, int | None]:
    batch, seq = REFERENCE_POINTS[family]
    return (value, None) if sweeps_batch(family) else (batch, value)


def run_point(family: str, mode: str, value: int, *, reps: int, sample: str | None, timeout: int,
              size: str = "reference", device: str = "cuda") -> dict:
    """One point in a fresh process."""
    batch, seq = shape_of(family, value)
    cmd = [sys.executable, "-m", "make_inplace.hf.measure", "--family", family, "--mode", mode, "--size", size,
           "--batch", str(batch), "--reps", str(reps), "--device", device]
    if seq is not None:
        cmd += ["--seq-len", str(seq)]
    if sample:
        cmd += ["--sample", sample]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"family": family, "mode": mode, "value": value, "status": "timeout", "wall_s": timeout}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-600:]
        return {"family": family, "mode": mode, "value": value, "status": "error", "error": tail,
                "wall_s": round(time.perf_counter() - t0, 1)}
    point = json.loads(lines[-1])
    point.update(value=value, wall_s=round(time.perf_counter() - t0, 1))
    return point


def _activation(p: dict) -> float | None:
    return p.get("peak_allocated") if p.get("status") == "ok" else None


def longest_fitting(points: list[dict], budget: float) -> dict:
    """The longest measured value within the budget; beyond the sweep, an extrapolation marked as such."""
    ok = sorted((p["value"], _activation(p)) for p in points if _activation(p) is not None)
    fitting = [v for v, m in ok if m <= budget]
    over = [v for v, m in ok if m > budget] + [p["value"] for p in points if p.get("status") == "oom"]
    best = max(fitting) if fitting else None
    result = {"budget_gib": budget / GiB, "measured": best, "extrapolated": None, "how": None}
    if best is not None and not any(v > best for v in over) and len(ok) >= 2:
        xs, ys = [v for v, _ in ok[-3:]], [m for _, m in ok[-3:]]
        result["extrapolated"], result["how"] = _solve(xs, ys, budget), ("quadratic" if len(xs) == 3 else "linear")
    return result


def _solve(xs: list[float], ys: list[float], budget: float) -> int | None:
    """Largest x with fit(x) <= budget, the fit through the given points (quadratic for three)."""
    if len(xs) == 3:
        (x0, x1, x2), (y0, y1, y2) = xs, ys
        # Lagrange form -> a x^2 + b x + c
        d0, d1, d2 = (x0 - x1) * (x0 - x2), (x1 - x0) * (x1 - x2), (x2 - x0) * (x2 - x1)
        a = y0 / d0 + y1 / d1 + y2 / d2
        b = -(y0 * (x1 + x2) / d0 + y1 * (x0 + x2) / d1 + y2 * (x0 + x1) / d2)
        c = y0 * x1 * x2 / d0 + y1 * x0 * x2 / d1 + y2 * x0 * x1 / d2
        if a > 0:
            disc = b * b - 4 * a * (c - budget)
            return int((-b + disc**0.5) / (2 * a)) if disc >= 0 else None
        xs, ys = xs[1:], ys[1:]  # concave or flat: the last two points' line is the safer guess
    (x0, x1), (y0, y1) = xs[-2:], ys[-2:]
    slope = (y1 - y0) / (x1 - x0)
    if slope <= 0:
        return None
    return int(x1 + (budget - y1) / slope)


def compare_samples(a: str, b: str) -> float | None:
    try:
        import torch

        x, y = torch.load(a), torch.load(b)
    except (OSError, RuntimeError):
        return None
    return ((x - y).abs().max() / x.abs().max()).item()


def run(args) -> dict:
    families = args.families
    modes = args.modes
    reps = 3 if args.quick else 5
    deadline = time.perf_counter() + args.deadline_s if args.deadline_s else None
    samples = tempfile.mkdtemp(prefix="hf_samples_")
    points: list[dict] = []
    plan = []
    # Reference shape first (the headline), then the other lengths, compile last (it compiles for minutes).
    for family in families:
        for mode in modes:
            if mode != "compile":
                plan.append((0, family, mode, reference_value(family)))
    for family in families:
        for mode in modes:
            values = sweep(family, args.quick)
            if mode == "compile":
                values = [reference_value(family)] if args.quick else [v for v in values if v <= reference_value(family)]
            for v in values:
                if mode == "compile" or v != reference_value(family):
                    plan.append((2 if mode == "compile" else 1, family, mode, v))
    plan.sort(key=lambda t: t[0])
    # Smallest value per (family, mode) that did not fit the largest budget: longer ones are not run.
    too_big: dict[tuple[str, str], int] = {}
    max_budget = max(args.budgets) * GiB
    for _, family, mode, value in plan:
        base = {"family": family, "mode": mode, "value": value}
        if value > too_big.get((family, mode), value):
            points.append({**base, "status": "skipped (a shorter point exceeded the largest budget)"})
            continue
        if deadline is not None and time.perf_counter() > deadline:
            points.append({**base, "status": "skipped (deadline)"})
            print(f"{family:6s} {mode:9s} {value:7d} skipped: deadline", flush=True)
            continue
        sample = os.path.join(samples, f"{family}_{mode}.pt") if value == reference_value(family) and mode != "compile" else None
        timeout = 420 if mode == "compile" else 240
        p = run_point(family, mode, value, reps=reps, sample=sample, timeout=timeout, size=args.size, device=args.device)
        if sample and p.get("status") == "ok":
            p["sample"] = sample
        points.append(p)
        act = _activation(p)
        print(f"{family:6s} {mode:9s} {value:7d} {p['status']:8s} act={_mib(act)} MiB "
              f"reserved={_mib(p.get('peak_reserved'))} MiB {p.get('ms') or 0:.1f} ms ({p.get('wall_s')} s)", flush=True)
        if p.get("status") == "oom" or (act is not None and act > max_budget):
            too_big[(family, mode)] = min(value, too_big.get((family, mode), value))
    result = {"quick": args.quick, "budgets_gib": args.budgets, "points": points}
    result["device"] = next((p["device"] for p in points if p.get("device")), "unknown")
    result["torch"] = next((p["torch"] for p in points if p.get("torch")), "unknown")
    result["summary"] = summarize(result)
    return result


def summarize(result: dict) -> list[dict]:
    out = []
    points = result["points"]
    for family in FAMILIES:
        fam = [p for p in points if p["family"] == family]
        if not fam:
            continue
        at = {m: next((p for p in fam if p["mode"] == m and p["value"] == reference_value(family)), None) for m in MODES}
        row = {"family": family, "description": DESCRIPTIONS[family], "reference_value": reference_value(family),
               "sweeps": "batch" if sweeps_batch(family) else "seq_len"}
        for m in MODES:
            p = at[m] or {}
            row[f"{m}_mib"] = _activation(p) / MiB if _activation(p) is not None else None
            row[f"{m}_reserved_mib"] = p.get("peak_reserved") / MiB if p.get("peak_reserved") is not None else None
            row[f"{m}_ms"] = p.get("ms")
            row[f"{m}_units"] = (_activation(p) / p["unit_bytes"]) if _activation(p) is not None and p.get("unit_bytes") else None
        peers = [row[f"{m}_mib"] for m in ("eager", "compile") if row[f"{m}_mib"] is not None]
        row["memory_ratio"] = row["converted_mib"] / min(peers) if peers and row["converted_mib"] is not None else None
        row["speed_vs_eager"] = row["eager_ms"] / row["converted_ms"] if row["eager_ms"] and row["converted_ms"] else None
        row["speed_vs_compile"] = row["compile_ms"] / row["converted_ms"] if row["compile_ms"] and row["converted_ms"] else None
        if at["eager"] and at["converted"] and at["eager"].get("sample") and at["converted"].get("sample"):
            row["bf16_rel_error"] = compare_samples(at["eager"]["sample"], at["converted"]["sample"])
        else:
            row["bf16_rel_error"] = None
        row["meets_memory"] = row["memory_ratio"] is not None and row["memory_ratio"] <= TARGET_MEMORY
        row["meets_speed"] = row["speed_vs_eager"] is not None and row["speed_vs_eager"] >= TARGET_SPEED
        for m in MODES:
            mode_points = [p for p in fam if p["mode"] == m]
            row[f"{m}_fits"] = [longest_fitting(mode_points, b * GiB) for b in result["budgets_gib"]] if mode_points else []
        out.append(row)
    return out


def _mib(value) -> str:
    return "-" if value is None else f"{value / MiB:.0f}"


def _f(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fit_text(fit: dict) -> str:
    if fit["measured"] is None:
        return "none measured"
    text = str(fit["measured"])
    if fit["extrapolated"] is not None:
        text += f" (>= ; ~{fit['extrapolated']} {fit['how']} extrapolation)"
    return text


def markdown(result: dict) -> str:
    lines = [
        f"# Hugging Face models: activation memory and time, {result['device']}",
        "",
        f"Written by `benchmarks/hf_memory_budget.py` ({'--quick' if result['quick'] else 'full'}), torch {result['torch']}, "
        "bf16, random weights, base models, one inference forward, each point in a fresh process. "
        "Activation memory: peak `max_memory_allocated` during the forward minus `memory_allocated` before it "
        "(reserved in brackets); a unit is tokens x hidden x 2 bytes. Targets: converted memory <= "
        f"{TARGET_MEMORY} x the better of eager and compile; converted speed >= {TARGET_SPEED} x eager.",
        "",
        "| family | reference shape | eager MiB (res.) | compile MiB (res.) | converted MiB (res.) | units e/c/conv | mem ratio | eager ms | compile ms | converted ms | speed vs eager | bf16 rel err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        batch, seq = REFERENCE_POINTS[r["family"]]
        shape = f"{batch} x {seq}" if seq else f"{batch} images"
        cell = lambda m: f"{_f(r[m + '_mib'], 0)} ({_f(r[m + '_reserved_mib'], 0)})"  # noqa: E731
        units = "/".join(_f(r[f"{m}_units"], 1) for m in ("eager", "compile", "converted"))
        lines.append(
            f"| {r['family']} | {shape} | {cell('eager')} | {cell('compile')} | {cell('converted')} | {units} | "
            f"{_f(r['memory_ratio'], 3)} | {_f(r['eager_ms'])} | {_f(r['compile_ms'])} | {_f(r['converted_ms'])} | "
            f"{_f(r['speed_vs_eager'])} | {_f(r['bf16_rel_error'], 4) if r['bf16_rel_error'] is not None else '-'} |"
        )
    lines += ["", "Longest sequence (ViT: largest batch) whose activation memory fits each budget:", "",
              "| family | mode | " + " | ".join(f"{b:g} GiB" for b in result["budgets_gib"]) + " |",
              "|---|---|" + "---|" * len(result["budgets_gib"])]
    for r in result["summary"]:
        for m in MODES:
            if r[f"{m}_fits"]:
                lines.append(f"| {r['family']} | {m} | " + " | ".join(_fit_text(f) for f in r[f"{m}_fits"]) + " |")
    lines += ["", "Every point (value = sequence length, ViT: batch):", "",
              "| family | mode | value | status | activation MiB | reserved MiB | ms |", "|---|---|---|---|---|---|---|"]
    for p in result["points"]:
        lines.append(f"| {p['family']} | {p['mode']} | {p['value']} | {p.get('status')} | {_mib(_activation(p))} | "
                     f"{_mib(p.get('peak_reserved'))} | {_f(p.get('ms'))} |")
    return "\n".join(lines) + "\n"


def write(result: dict, out_dir: str | None, results_root: str) -> list[str]:
    written = []
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, "hf_memory_budget.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        written.append(path)
    gpu = gpu_folder(result["device"])
    folder = os.path.join(results_root, gpu)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "hf_memory_budget.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["family", "mode", "value", "tokens", "status", "activation_mib", "reserved_mib", "ms"])
        for p in result["points"]:
            act = _activation(p)
            w.writerow([p["family"], p["mode"], p["value"], p.get("tokens"), p.get("status"),
                        None if act is None else round(act / MiB, 1),
                        None if p.get("peak_reserved") is None else round(p["peak_reserved"] / MiB, 1), p.get("ms")])
    written.append(path)
    path = os.path.join(folder, "hf_memory_budget.md")
    with open(path, "w") as f:
        f.write(markdown(result))
    written.append(path)
    png = plot(result, os.path.join(folder, "hf_memory_budget.png"))
    if png:
        written.append(png)
    return written


def gpu_folder(device: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; anything else: a slug of the name."""
    match = re.search(r"\b([A-Z]\d{2,4})\b", device)
    return match.group(1).lower() if match else re.sub(r"[^a-z0-9]+", "_", device.lower()).strip("_") or "unknown"


def plot(result: dict, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return None
    families = [r["family"] for r in result["summary"]]
    fig, axes = plt.subplots(1, len(families), figsize=(4.6 * len(families), 4.2), squeeze=False)
    for ax, family in zip(axes[0], families):
        for mode, style in zip(MODES, ("o--", "s:", "^-")):
            pts = sorted((p["value"], _activation(p) / MiB) for p in result["points"]
                         if p["family"] == family and p["mode"] == mode and _activation(p) is not None)
            if pts:
                ax.plot([v for v, _ in pts], [m for _, m in pts], style, label=mode)
        for b in result["budgets_gib"]:
            ax.axhline(b * 1024, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (images)" if sweeps_batch(family) else "sequence length")
        ax.set_ylabel("activation memory (MiB)")
        ax.set_title(DESCRIPTIONS[family], fontsize=8)
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['device']}, torch {result['torch']}, bf16", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="folder for hf_memory_budget.json")
    parser.add_argument("--quick", action="store_true", help="three lengths, compile at the reference shape, a deadline")
    parser.add_argument("--families", type=lambda t: t.split(","), default=list(FAMILIES))
    parser.add_argument("--modes", type=lambda t: t.split(","), default=list(MODES))
    parser.add_argument("--budgets", type=lambda t: [float(v) for v in t.split(",")], default=[8.0, 16.0])
    parser.add_argument("--deadline-s", type=float, default=None, help="skip points after this many seconds (--quick: 480)")
    parser.add_argument("--results-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--size", default="reference", help="model size (tiny/small: a smoke test of this script)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test (no memory figures)")
    parser.add_argument("--from-json", default=None, help="write tables and plot from a saved run; runs nothing")
    parser.add_argument("--merge", default=None, help="a saved run's JSON whose points join this run's (this run's win)")
    args = parser.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
        result["summary"] = summarize(result)
    else:
        unknown = set(args.families) - set(FAMILIES) | set(args.modes) - set(MODES)
        if unknown:
            parser.error(f"unknown families/modes: {sorted(unknown)}")
        if args.quick and args.deadline_s is None:
            args.deadline_s = 480.0
        result = run(args)
    if args.merge:
        with open(args.merge) as f:
            earlier = json.load(f)
        key = lambda p: (p["family"], p["mode"], p["value"])  # noqa: E731
        mine = {key(p) for p in result["points"]}
        result["points"] = [p for p in earlier["points"] if key(p) not in mine] + result["points"]
        result["summary"] = summarize(result)
    print(markdown(result))
    for path in write(result, args.out, args.results_dir):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
