"""How many rows a residual block processes at once: pure functions of the shapes and the bound.

A block holds, besides x, one panel's temporaries (the normalized rows, the MLP
intermediate, q/k/v, the attention output). Their size is the panel's rows
times a per-row cost, plus, for attention, K and V of every sequence in the
group. These functions turn a byte bound into rows; they read no environment.

Default bound: ``x``'s own size, but never below what ``DEFAULT_MIN_ROWS`` rows
cost (smaller panels leave the GEMMs short of rows and the per-panel launch
work visible) and never above ``DEFAULT_CAP_BYTES``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Rows per panel the default bound always allows: a few thousand rows keep
# cuBLAS near its peak and make per-panel Python work small next to the GEMMs.
DEFAULT_MIN_ROWS = 8192
DEFAULT_CAP_BYTES = 1 << 30


def default_workspace_bytes(x_bytes: int, min_rows_bytes: int) -> int:
    """The bound used when the caller gives none: x's size, at least ``min_rows_bytes``, at most the cap."""
    return min(max(int(x_bytes), int(min_rows_bytes)), DEFAULT_CAP_BYTES)


def balanced_rows(total: int, most: int) -> int:
    """Rows per panel when at most ``most`` fit: equal panels instead of a short last one."""
    if total <= 0:
        return 1
    most = max(1, min(most, total))
    panels = math.ceil(total / most)
    return math.ceil(total / panels)


def check_workspace_bytes(fn: str, workspace_bytes: int | None) -> None:
    """Type check of the caller's bound (the size check needs the plan)."""
    if workspace_bytes is None:
        return
    if isinstance(workspace_bytes, bool) or not isinstance(workspace_bytes, int):
        raise TypeError(f"{fn}: workspace_bytes must be an int or None, got {type(workspace_bytes).__name__}")
    if workspace_bytes < 0:
        raise ValueError(f"{fn}: workspace_bytes must be >= 0, got {workspace_bytes}")


def mlp_panel_rows(fn: str, total_rows: int, row_bytes: int, x_bytes: int, workspace_bytes: int | None) -> int:
    """Rows per MLP panel; ``row_bytes`` is one row's temporaries (normalized row, intermediate(s)).

    Raises ValueError when an explicit bound does not hold one row.
    """
    if workspace_bytes is None:
        bound = default_workspace_bytes(x_bytes, DEFAULT_MIN_ROWS * row_bytes)
    else:
        bound = workspace_bytes
        if bound < row_bytes:
            raise ValueError(
                f"{fn}: workspace_bytes={bound} is below one row's workspace ({row_bytes} bytes); "
                f"pass at least {row_bytes} or None for the default"
            )
    return balanced_rows(total_rows, max(1, bound // row_bytes))


@dataclass(frozen=True)
class AttentionPlan:
    """``group`` sequences at a time; within a group, queries by panels of ``q_rows`` rows.

    ``q_rows == seq_len`` whenever ``group > 1``: a panel then spans whole
    sequences. ``q_rows < seq_len`` only with ``group == 1``, when one
    sequence's queries do not fit at once (``splits_sequences``).
    """

    group: int
    q_rows: int
    seq_len: int

    @property
    def splits_sequences(self) -> bool:
        return self.q_rows < self.seq_len


def attention_plan(
    fn: str,
    *,
    batch: int,
    seq_len: int,
    per_sequence_bytes: int,
    per_row_bytes: int,
    x_bytes: int,
    workspace_bytes: int | None,
) -> AttentionPlan:
    """Sequences per group and query rows per panel within the bound.

    ``per_sequence_bytes``: what one sequence of the group holds whole (its K
    and V, or their head-expanded copies); ``per_row_bytes``: one query row's
    temporaries (normalized row, q, attention output and its copy, rotary
    scratch). Raises ValueError when an explicit bound does not hold one
    sequence's K/V and one query row.
    """
    seq_len = max(1, seq_len)
    one_sequence = per_sequence_bytes + seq_len * per_row_bytes
    minimum = per_sequence_bytes + per_row_bytes
    if workspace_bytes is None:
        sequences_for_min_rows = max(1, math.ceil(DEFAULT_MIN_ROWS / seq_len))
        bound = default_workspace_bytes(x_bytes, min(sequences_for_min_rows, batch) * one_sequence)
        bound = max(bound, minimum)
    else:
        bound = workspace_bytes
        if bound < minimum:
            raise ValueError(
                f"{fn}: workspace_bytes={bound} is below one query row plus one sequence's K and V "
                f"({minimum} bytes); pass at least {minimum} or None for the default"
            )
    group = bound // one_sequence
    if group >= 1:
        group = min(group, batch)
        # As few groups as that takes, of equal size.
        group = math.ceil(batch / math.ceil(batch / group))
        return AttentionPlan(group=group, q_rows=seq_len, seq_len=seq_len)
    q_rows = balanced_rows(seq_len, (bound - per_sequence_bytes) // per_row_bytes)
    return AttentionPlan(group=1, q_rows=q_rows, seq_len=seq_len)
