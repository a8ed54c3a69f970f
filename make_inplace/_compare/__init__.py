"""The main job's comparison: one row per op and case, ours against torch eager
and, on the devices in COMPILE_DEVICES, torch.compile of the same reference.

Each module in this package defines ``rows(device: torch.device) -> list[Row]``;
``collect_rows`` discovers them, so adding an op's rows means adding one module here.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from dataclasses import dataclass
from typing import Callable

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
    # torch.compile of the same torch reference (compiled_ms); None: not measured.
    compile_ms: float | None = None

    @property
    def saved_bytes(self) -> int | None:
        if self.ours_bytes is None or self.torch_bytes is None:
            return None
        return self.torch_bytes - self.ours_bytes


# Devices whose rows carry a torch.compile column; rows on other devices print "-".
COMPILE_DEVICES = {"cpu"}


def compiled_ms(
    reference: Callable, args: tuple, device: torch.device, *, call: Callable[[Callable], Callable] | None = None
) -> float | None:
    """Median time of ``torch.compile(reference)(*args)`` (Inductor, static
    shapes, a fresh dynamo cache), measured as the eager reference is; None on
    devices outside COMPILE_DEVICES, or with a warning when compiling fails.
    ``call(compiled)`` gives the callable to time instead (e.g. a compiled
    forward followed by autograd's backward)."""
    if device.type not in COMPILE_DEVICES:
        return None
    from .._measure import time_ms

    torch._dynamo.reset()
    compiled = torch.compile(reference, dynamic=False)
    run = call(compiled) if call is not None else (lambda: compiled(*args))
    try:
        run()  # compiles here, outside the timing
    except Exception as error:  # noqa: BLE001 - any backend failure leaves the column empty, said aloud
        warnings.warn(f"torch.compile of {getattr(reference, '__name__', reference)} failed: {error!r}", stacklevel=2)
        return None
    return time_ms(run, device)


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


def _speed(theirs: float | None, ours: float) -> str:
    return f"{theirs / ours:.2f}x" if theirs is not None and ours > 0 else "-"


def format_table(rows: list[Row]) -> str:
    header = ["op", "device", "dtype", "shape", "ours ms", "torch ms", "compile ms", "speed", "vs compile", "ours MiB",
              "torch MiB", "saved MiB", "rel err"]
    body = [
        [
            r.op,
            r.device,
            r.dtype,
            r.shape,
            f"{r.ours_ms:.3f}",
            f"{r.torch_ms:.3f}",
            "-" if r.compile_ms is None else f"{r.compile_ms:.3f}",
            _speed(r.torch_ms, r.ours_ms),
            _speed(r.compile_ms, r.ours_ms),
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
