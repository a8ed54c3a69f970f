"""Draws one GPU's benchmark summary (summary.csv's rows) as summary.png.

One panel per op (its variants, e.g. ``workspace_bytes=0``, share the op's
panel); one bar per shape, dtype and variant: speed vs best torch, with a line
at 1.0 (above it ours is faster). For memory-bound rows the ceiling share
(GB/s as a share of the card's copy bandwidth) is a marker on the right axis.
matplotlib (Agg) is imported only here, when a plot is drawn: summarize.py
writes its tables without it.
"""

from __future__ import annotations

import io
import math

COLORS = {"bfloat16": "#4C72B0", "float16": "#55A868", "float32": "#C44E52", "float64": "#8172B2"}
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "workspace_bytes=0": "ws=0",
         "need_weights=True": "weights", "need_weights=False": "no weights"}
# The right axis: ceiling shares run up to ~1.1 (a fill-bound op over the copy bandwidth). The left axis
# starts at the same height, so where speeds stay small the two 1.0s are one line.
SHARE_MAX = 1.25
PANEL_W, PANEL_H = 7.0, 3.6  # inches


def _float(text: str) -> float:
    return float(text) if text else math.nan


def panels(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows by op, variants with their op ('square_matmul_ (workspace_bytes=0)' -> 'square_matmul_'), in row order."""
    found: dict[str, list[dict]] = {}
    for r in rows:
        found.setdefault(r["op"].split(" (")[0], []).append(r)
    return found


def case_label(row: dict) -> str:
    """'(16384, 512) bf16 ws=0': shape, dtype and the variant the op name carries in parentheses."""
    variant = row["op"].partition(" (")[2].rstrip(")")
    words = [row["shape"], SHORT.get(row["dtype"], row["dtype"])] + ([SHORT.get(variant, variant)] if variant else [])
    return " ".join(words)


def plot(rows: list[dict], path: str, title: str) -> str | None:
    """Writes the figure to path; None (and a note) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
        from PIL import Image  # a dependency of matplotlib
    except ImportError:
        print(f"matplotlib is not installed: no {path}")
        return None
    groups = panels(rows)
    ncols = 2 if len(groups) > 1 else 1
    nrows = max(1, math.ceil(len(groups) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(PANEL_W * ncols, PANEL_H * nrows + 0.8), squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    for ax, (op, rs) in zip(axes.flat, groups.items()):
        x = list(range(len(rs)))
        speed = [_float(r["speed_vs_best_torch"]) for r in rs]
        bars = ax.bar(x, speed, width=0.75, color=[COLORS.get(r["dtype"], "grey") for r in rs])
        for bar, s in zip(bars, speed):
            if not math.isnan(s):
                ax.annotate(f"{s:.2f}", (bar.get_x() + bar.get_width() / 2, s), xytext=(0, 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=6, rotation=90)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.9)
        top = max([s for s in speed if not math.isnan(s)], default=1.0)
        ax.set_ylim(0, max(SHARE_MAX, top * 1.18))
        ax.set_ylabel("speed vs best torch (bars)", fontsize=8)
        ax.set_xticks(x)
        ax.set_xticklabels([case_label(r) for r in rs], rotation=90, fontsize=7)
        ax.set_xlim(-0.6, len(rs) - 0.4)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(True, axis="y", linewidth=0.3)
        commits = ", ".join(dict.fromkeys(r["commit"] for r in rs))
        ax.set_title(f"{op}  ({commits})", fontsize=9)
        shares = [_float(r["ceiling_share"]) for r in rs]
        if any(not math.isnan(s) for s in shares):
            right = ax.twinx()
            right.plot(x, shares, linestyle="none", marker="D", markersize=4, color="black")
            right.set_ylim(0, max(SHARE_MAX, max(s for s in shares if not math.isnan(s)) * 1.1))
            right.set_ylabel("ceiling share (markers)", fontsize=8)
            right.tick_params(axis="y", labelsize=7)
    dtypes = [d for d in COLORS if any(r["dtype"] == d for r in rows)]
    handles = [Patch(color=COLORS[d], label=d) for d in dtypes] + [
        Line2D([], [], color="black", linestyle="--", label="1.0: as fast as the best torch"),
        Line2D([], [], color="black", linestyle="none", marker="D", markersize=4,
               label="ceiling share: GB/s / copy bandwidth (right axis, memory-bound ops)"),
    ]
    height = fig.get_figheight()  # the title and the legend in the top 0.8 inch
    fig.suptitle(title, fontsize=11, y=1 - 0.08 / height, va="top")
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.38 / height), ncol=len(handles), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.75 / height))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    # A 64-colour palette: a third of the RGBA file's size (~500 KB for ten panels), the text still sharp.
    Image.open(buffer).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return path
