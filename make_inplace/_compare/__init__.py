"""The main job's comparison: one row per op and case, ours against torch.

Each module in this package defines ``rows(device: torch.device) -> list[Row]``;
``collect_rows`` discovers them, so adding an op's rows means adding one module here.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

import torch


@dataclass
class Row:
    op: str
    device: str
    dtype: str
    shape: str
    ours_ms: float
    torch_ms: float
    rel_error: float
    # Peak extra bytes of one call (make_inplace._measure.peak_extra); None: not measured.
    ours_bytes: int | None = None
    torch_bytes: int | None = None
    notes: str = ""

    @property
    def saved_bytes(self) -> int | None:
        if self.ours_bytes is None or self.torch_bytes is None:
            return None
        return self.torch_bytes - self.ours_bytes


def row_modules() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    # square_matmul first: it is the library's first op; the rest alphabetically.
    return sorted(names, key=lambda n: (n != "square_matmul", n))


def collect_rows(device: torch.device, only: list[str] | None = None) -> list[Row]:
    rows: list[Row] = []
    for name in row_modules():
        if only and name not in only:
            continue
        module = importlib.import_module(f"{__name__}.{name}")
        rows.extend(module.rows(device))
    return rows


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / (1 << 20):.1f}"


def format_table(rows: list[Row]) -> str:
    header = ["op", "device", "dtype", "shape", "ours ms", "torch ms", "speed", "ours MiB", "torch MiB", "saved MiB", "rel err"]
    body = [
        [
            r.op,
            r.device,
            r.dtype,
            r.shape,
            f"{r.ours_ms:.3f}",
            f"{r.torch_ms:.3f}",
            f"{r.torch_ms / r.ours_ms:.2f}x" if r.ours_ms > 0 else "-",
            _mib(r.ours_bytes),
            _mib(r.torch_bytes),
            _mib(r.saved_bytes),
            f"{r.rel_error:.1e}",
        ]
        for r in rows
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [line(header), line(["-" * w for w in widths])] + [line(b) for b in body]
    return "\n".join(out)
