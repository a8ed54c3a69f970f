"""The memory-budget benchmark: what an encoder layer's forward costs per sequence length.

For one ``nn.TransformerEncoderLayer`` configuration (CUDA default: d_model
1024, 16 heads, feed-forward 4096, batch 8, fp16 and bf16) it measures, per
sequence length, the peak extra ``max_memory_reserved`` (and allocated) of one
inference forward and its time, for five rows:

* ``torch_eager_weights``: torch's layer, its attention called with
  ``need_weights=True, average_attn_weights=False`` (a caller that needs the
  attention weights), fast path off;
* ``torch_eager``: torch's layer as shipped (``need_weights=False``, SDPA inside), fast path off;
* ``torch_fastpath``: torch's layer with its native inference fast path
  (``torch._transformer_encoder_layer_fwd``; whether it was taken is recorded);
* ``inplace_weights``: :class:`~make_inplace.nn.InplaceTransformerEncoderLayer`
  with ``self_attn.core = "materialized"`` (probabilities materialized, in place);
* ``inplace``: the same layer with its default core (SDPA, nothing of size L x S).

Memory: the allocator is emptied before each point's input is made, and
peaks are taken above the level with weights and input allocated. A
point that raises ``torch.cuda.OutOfMemoryError`` counts as not fitting; once a
row exceeds the largest budget, longer sequences are not run for it. The
longest sequence fitting each budget is the longest measured one, refined by
bisection between the last fitting and the first failing length. On CPU only
times are measured (no allocator statistics), so nothing is said about fit.

Used by ``benchmarks/memory_budget.py`` (CLI) and ``python -m make_inplace``.

Example::

    >>> result = make_inplace.budget.run_memory_budget(device="cpu", out_dir=None)
    >>> sorted(result["rows"]) == sorted(make_inplace.budget.ROWS)
    True
"""

from __future__ import annotations

import csv
import gc
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch import nn

from .nn.encoder import InplaceTransformerEncoderLayer
from ._measure import MiB, best_device, cuda_peak_extra, fresh_cuda_memory, time_ms

GiB = 1 << 30

ROWS = ("torch_eager_weights", "torch_eager", "torch_fastpath", "inplace_weights", "inplace")
ROW_LABELS = {
    "torch_eager_weights": "torch eager, need_weights=True",
    "torch_eager": "torch eager, need_weights=False",
    "torch_fastpath": "torch fast path (native, inference)",
    "inplace_weights": "make_inplace, weights materialized",
    "inplace": "make_inplace, SDPA core",
}


@dataclass
class BudgetConfig:
    device: str
    d_model: int
    nhead: int
    dim_feedforward: int
    batch: int
    seq_lens: list[int]
    dtypes: list[str]
    budgets_gib: list[float]
    refine_steps: int
    rows: list[str] = field(default_factory=lambda: list(ROWS))


def default_config(device: torch.device) -> BudgetConfig:
    """CUDA: an encoder layer of BERT-large's width at batch 8; CPU: a small one that runs in seconds."""
    if device.type == "cuda":
        return BudgetConfig(
            device=str(device),
            d_model=1024,
            nhead=16,
            dim_feedforward=4096,
            batch=8,
            seq_lens=[1024 * 2**i for i in range(8)],  # 1024 .. 131072
            dtypes=["float16", "bfloat16"],
            budgets_gib=[4.0, 16.0],
            refine_steps=3,
        )
    return BudgetConfig(
        device=str(device),
        d_model=64,
        nhead=4,
        dim_feedforward=256,
        batch=2,
        seq_lens=[32, 64, 128, 256],
        dtypes=["float32"],
        budgets_gib=[4.0, 16.0],
        refine_steps=0,
    )


class _TorchLayerNeedingWeights(nn.TransformerEncoderLayer):
    """torch's layer whose attention returns per-head weights, as a caller needing them would ask."""

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        out = self.self_attn(
            x,
            x,
            x,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=True,
            average_attn_weights=False,
            is_causal=is_causal,
        )[0]
        return self.dropout1(out)


def _build_rows(cfg: BudgetConfig, dtype: torch.dtype) -> dict[str, tuple[nn.Module, bool]]:
    """row -> (module, fast path enabled). All rows share one set of weights."""
    device = torch.device(cfg.device)
    torch.manual_seed(0)
    base = nn.TransformerEncoderLayer(
        cfg.d_model, cfg.nhead, cfg.dim_feedforward, dropout=0.0, batch_first=True, device=device, dtype=dtype
    ).eval()
    with_weights = _TorchLayerNeedingWeights(
        cfg.d_model, cfg.nhead, cfg.dim_feedforward, dropout=0.0, batch_first=True, device="meta", dtype=dtype
    ).eval()
    for name in ("self_attn", "linear1", "linear2", "norm1", "norm2"):
        setattr(with_weights, name, getattr(base, name))
    inplace = InplaceTransformerEncoderLayer.from_torch(base)
    inplace_weights = InplaceTransformerEncoderLayer.from_torch(base)
    inplace_weights.self_attn.core = "materialized"
    modules = {
        "torch_eager_weights": (with_weights, False),
        "torch_eager": (base, False),
        "torch_fastpath": (base, True),
        "inplace_weights": (inplace_weights, False),
        "inplace": (inplace, False),
    }
    return {row: modules[row] for row in cfg.rows}


def _fast_path_taken(module: nn.Module, x: torch.Tensor) -> bool:
    """Whether torch's layer ran its native fused forward on x."""
    real = torch._transformer_encoder_layer_fwd
    hits = []

    def spy(*args, **kwargs):
        hits.append(True)
        return real(*args, **kwargs)

    torch._transformer_encoder_layer_fwd = spy
    try:
        with torch.no_grad():
            module(x)
    finally:
        torch._transformer_encoder_layer_fwd = real
    return bool(hits)


class _FastPath:
    """Sets torch.backends.mha's fast-path switch for a block."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self):
        self.saved = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(self.enabled)

    def __exit__(self, *exc):
        torch.backends.mha.set_fastpath_enabled(self.saved)


def _measure(cfg: BudgetConfig, module: nn.Module, fast_path: bool, dtype: torch.dtype, seq_len: int, *, timed: bool) -> dict:
    """One point: peak extra memory (CUDA) and median time of one forward."""
    device = torch.device(cfg.device)
    point: dict = {"seq_len": seq_len, "status": "ok", "peak_reserved_mib": None, "peak_allocated_mib": None, "ms": None}
    x = None
    try:
        with _FastPath(fast_path), torch.no_grad():
            if device.type == "cuda":
                fresh_cuda_memory()
                x = torch.randn(cfg.batch, seq_len, cfg.d_model, device=device, dtype=dtype)
                peak = cuda_peak_extra(lambda: module(x), device)
                point["peak_reserved_mib"] = peak.reserved / MiB
                point["peak_allocated_mib"] = peak.allocated / MiB
            else:
                x = torch.randn(cfg.batch, seq_len, cfg.d_model, device=device, dtype=dtype)
            if timed:
                once = lambda: module(x)  # noqa: E731
                # The memory run warmed it up; long points (seconds each) keep one sample.
                first = time_ms(once, device, warmup=0 if device.type == "cuda" else 1, reps=1)
                point["ms"] = first if first > 1000 else time_ms(once, device, warmup=0, reps=3 if first > 100 else 10)
    except torch.cuda.OutOfMemoryError:
        point["status"] = "oom"
    finally:
        del x
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return point


def _fits(point: dict, budget_bytes: float) -> bool:
    return point["status"] == "ok" and point["peak_reserved_mib"] is not None and point["peak_reserved_mib"] * MiB <= budget_bytes


def _longest_fitting(
    cfg: BudgetConfig, points: list[dict], budget_gib: float, probe: Callable[[int], dict]
) -> dict:
    """Longest measured length within the budget, refined by bisection (multiples of 64)."""
    budget = budget_gib * GiB
    fitting = [p["seq_len"] for p in points if _fits(p, budget)]
    failing = [p["seq_len"] for p in points if not _fits(p, budget) and p["status"] in ("ok", "oom")]
    best = max(fitting) if fitting else None
    above = min((s for s in failing if best is None or s > best), default=None)
    low, high = best or 0, above
    refined = []
    for _ in range(cfg.refine_steps):
        if high is None or high - low <= 64:
            break
        mid = (low + high) // 2 // 64 * 64
        if mid <= low:
            break
        p = probe(mid)
        refined.append(p)
        if _fits(p, budget):
            low = mid
        else:
            high = mid
    best = low or None
    return {
        "budget_gib": budget_gib,
        "longest_seq_len": best,
        # The longest measured length fit: the real limit lies beyond the sweep.
        "at_least": high is None and best is not None,
        "first_not_fitting": high,
        "refinement_points": refined,
    }


def run_memory_budget(
    device: torch.device | str | None = None,
    *,
    config: BudgetConfig | None = None,
    out_dir: str | None = None,
    plot: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Runs the sweep; returns (and with ``out_dir`` writes) the results.

    Args:
        device: defaults to CUDA when available, else CPU.
        config: overrides :func:`default_config` (e.g. from the CLI).
        out_dir: where ``memory_budget.json``, ``memory_budget.csv`` and
            ``memory_budget.png`` go; ``None`` writes nothing.
        plot: write the PNG (skipped with a message when matplotlib is missing).
        log: progress lines.

    Returns:
        ``{"config", "device_name", "torch", "rows", "points", "fits", "fast_path_taken", "summary"}``;
        ``points[dtype][row]`` lists one dict per sequence length.
    """
    device = torch.device(device) if device is not None else best_device()
    cfg = config or default_config(device)
    cfg.device = str(device)
    max_budget = max(cfg.budgets_gib) * GiB
    result: dict = {
        "config": asdict(cfg),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": {row: ROW_LABELS[row] for row in cfg.rows},
        "points": {},
        "fits": {},
        "fast_path_taken": {},
        "memory_measured": device.type == "cuda",
    }
    for dtype_name in cfg.dtypes:
        dtype = getattr(torch, dtype_name)
        modules = _build_rows(cfg, dtype)
        if "torch_fastpath" in modules:
            probe_x = torch.randn(1, 8, cfg.d_model, device=device, dtype=dtype)
            with _FastPath(True):
                result["fast_path_taken"][dtype_name] = _fast_path_taken(modules["torch_fastpath"][0], probe_x)
            del probe_x
        result["points"][dtype_name] = {}
        if result["memory_measured"]:
            result["fits"][dtype_name] = {}
        for row, (module, fast_path) in modules.items():
            with torch.no_grad(), _FastPath(fast_path):
                module(torch.randn(1, 8, cfg.d_model, device=device, dtype=dtype))  # one-time allocations first
            points = []
            for seq_len in sorted(cfg.seq_lens):
                p = _measure(cfg, module, fast_path, dtype, seq_len, timed=True)
                points.append(p)
                log(
                    f"{dtype_name:9s} {row:20s} L={seq_len:7d} {p['status']:4s} "
                    f"reserved={_fmt(p['peak_reserved_mib'])} MiB  {_fmt(p['ms'], 3)} ms"
                )
                if p["status"] == "oom" or (p["peak_reserved_mib"] is not None and p["peak_reserved_mib"] * MiB > max_budget):
                    break  # longer sequences need more: they fit no budget either
            result["points"][dtype_name][row] = points
            if result["memory_measured"]:
                probe = lambda s, m=module, f=fast_path: _measure(cfg, m, f, dtype, s, timed=False)  # noqa: E731
                result["fits"][dtype_name][row] = [_longest_fitting(cfg, points, b, probe) for b in cfg.budgets_gib]
        del modules
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["summary"] = _summary(result)
    log(format_summary(result))
    if out_dir is not None:
        write_outputs(result, out_dir, plot=plot, log=log)
    return result


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _summary(result: dict) -> list[dict]:
    """Per dtype and length: make_inplace's memory and time as ratios to torch's rows."""
    out = []
    for dtype_name, rows in result["points"].items():
        lengths = sorted({p["seq_len"] for pts in rows.values() for p in pts})
        for seq_len in lengths:
            at = {row: next((p for p in pts if p["seq_len"] == seq_len and p["status"] == "ok"), None) for row, pts in rows.items()}
            entry = {"dtype": dtype_name, "seq_len": seq_len}

            def ratio(a: str, b: str, key: str) -> float | None:
                pa, pb = at.get(a), at.get(b)
                if pa is None or pb is None or pa[key] is None or not pb[key]:
                    return None
                return pa[key] / pb[key]

            entry["weights_mem_ratio"] = ratio("inplace_weights", "torch_eager_weights", "peak_reserved_mib")
            entry["weights_time_ratio"] = ratio("inplace_weights", "torch_eager_weights", "ms")
            # Without weights: against torch's lowest-memory path for the same computation.
            lowest = min(
                (r for r in ("torch_eager", "torch_fastpath") if at.get(r) and at[r]["peak_reserved_mib"] is not None),
                key=lambda r: at[r]["peak_reserved_mib"],
                default=None,
            )
            entry["lowest_torch_row"] = lowest
            entry["no_weights_mem_ratio"] = ratio("inplace", lowest, "peak_reserved_mib") if lowest else None
            fastest = min((r for r in ("torch_eager", "torch_fastpath") if at.get(r) and at[r]["ms"]), key=lambda r: at[r]["ms"], default=None)
            entry["fastest_torch_row"] = fastest
            entry["no_weights_time_ratio"] = ratio("inplace", fastest, "ms") if fastest else None
            out.append(entry)
    return out


def format_summary(result: dict) -> str:
    lines = [f"memory budget: {result['device_name']}, torch {result['torch']}, config {result['config']}"]
    header = f"{'dtype':9s} {'row':20s} " + " ".join(f"{'L=' + str(s):>14s}" for s in sorted(result["config"]["seq_lens"]))
    lines.append("peak extra reserved MiB / ms per forward")
    lines.append(header)
    for dtype_name, rows in result["points"].items():
        for row, pts in rows.items():
            by_len = {p["seq_len"]: p for p in pts}
            cells = []
            for s in sorted(result["config"]["seq_lens"]):
                p = by_len.get(s)
                if p is None:
                    cells.append(f"{'not run':>14s}")
                elif p["status"] != "ok":
                    cells.append(f"{p['status']:>14s}")
                else:
                    cells.append(f"{_fmt(p['peak_reserved_mib'], 0) + '/' + _fmt(p['ms'], 2):>14s}")
            lines.append(f"{dtype_name:9s} {row:20s} " + " ".join(cells))
    if result["fits"]:
        lines.append("longest sequence under each budget (>= : the longest measured length fit)")
        for dtype_name, rows in result["fits"].items():
            for row, fits in rows.items():
                cells = [
                    f"{f['budget_gib']:g} GiB: {'>=' if f['at_least'] else ''}{f['longest_seq_len'] if f['longest_seq_len'] else 'none'}"
                    for f in fits
                ]
                lines.append(f"{dtype_name:9s} {row:20s} " + "  ".join(cells))
    if result.get("summary"):
        lines.append(
            "ratios make_inplace / torch (memory: peak extra reserved; time: ms). weights: vs torch eager "
            "need_weights=True; no weights: mem vs torch's lowest-memory row, time vs its fastest"
        )
        for e in result["summary"]:
            lines.append(
                f"{e['dtype']:9s} L={e['seq_len']:<7d} weights mem {_fmt(e['weights_mem_ratio'], 3)} time {_fmt(e['weights_time_ratio'], 3)}"
                f" | no weights mem {_fmt(e['no_weights_mem_ratio'], 3)} (vs {e['lowest_torch_row']})"
                f" time {_fmt(e['no_weights_time_ratio'], 3)} (vs {e['fastest_torch_row']})"
            )
    if result.get("fast_path_taken"):
        lines.append(f"torch fast path taken: {result['fast_path_taken']}")
    return "\n".join(lines)


def write_outputs(result: dict, out_dir: str, *, plot: bool = True, log: Callable[[str], None] = print) -> list[str]:
    """memory_budget.json, .csv and (matplotlib permitting) .png in out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    path = os.path.join(out_dir, "memory_budget.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    written.append(path)
    path = os.path.join(out_dir, "memory_budget.csv")
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dtype", "row", "seq_len", "status", "peak_reserved_mib", "peak_allocated_mib", "ms"])
        for dtype_name, rows in result["points"].items():
            for row, pts in rows.items():
                for p in pts:
                    w.writerow([dtype_name, row, p["seq_len"], p["status"], p["peak_reserved_mib"], p["peak_allocated_mib"], p["ms"]])
    written.append(path)
    if plot:
        png = _plot(result, os.path.join(out_dir, "memory_budget.png"), log)
        if png:
            written.append(png)
    log("wrote " + ", ".join(written))
    return written


def _plot(result: dict, path: str, log: Callable[[str], None]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: skipping the plot (pip install matplotlib)")
        return None
    key, unit = ("peak_reserved_mib", "peak extra max_memory_reserved (MiB)") if result["memory_measured"] else ("ms", "time per forward (ms)")
    dtypes = list(result["points"])
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.8), squeeze=False)
    for ax, dtype_name in zip(axes[0], dtypes):
        for row, pts in result["points"][dtype_name].items():
            xs = [p["seq_len"] for p in pts if p["status"] == "ok" and p[key] is not None]
            ys = [p[key] for p in pts if p["status"] == "ok" and p[key] is not None]
            style = "--" if row.startswith("torch") else "-"
            ax.plot(xs, ys, style, marker="o", label=ROW_LABELS[row])
        if result["memory_measured"]:
            for b in result["config"]["budgets_gib"]:
                ax.axhline(b * 1024, color="grey", linewidth=0.8, linestyle=":")
                ax.text(min(result["config"]["seq_lens"]), b * 1024 * 1.05, f"{b:g} GiB", fontsize=8, color="grey")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(unit)
        c = result["config"]
        ax.set_title(f"encoder layer d={c['d_model']} h={c['nhead']} ff={c['dim_feedforward']} N={c['batch']} {dtype_name}", fontsize=9)
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{result['device_name']}, torch {result['torch']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
