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

import functools
import math
from dataclasses import dataclass
from typing import Callable

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


KernelBytes = Callable[[int, int, int], int]
"""``kernel_bytes(group, s0, s1)``: bytes the attention kernel allocates for itself for a panel of
``group`` sequences and query rows ``[s0, s1)`` (its own scratch, beyond its output). Pass a
hashable one (such as :class:`FlashSplitKV`) to let plans be cached."""


def attention_plan(
    fn: str,
    *,
    batch: int,
    seq_len: int,
    per_sequence_bytes: int,
    per_row_bytes: int,
    x_bytes: int,
    workspace_bytes: int | None,
    kernel_bytes: KernelBytes | None = None,
) -> AttentionPlan:
    """Sequences per group and query rows per panel within the bound.

    ``per_sequence_bytes``: what one sequence of the group holds whole (its K
    and V, or their head-expanded copies); ``per_row_bytes``: one query row's
    temporaries (normalized row, q, attention output, log-sum-exp, rotary
    scratch). ``kernel_bytes``: the attention kernel's own scratch per panel
    (FlashAttention's split-KV accumulators, :class:`FlashSplitKV`); it is not
    proportional to the rows, so each candidate plan is checked panel by
    panel. Raises ValueError when an explicit bound does not hold one
    sequence's K/V and one query row (with the kernel's scratch for it).
    """
    return _attention_plan(fn, batch, max(1, seq_len), per_sequence_bytes, per_row_bytes, x_bytes, workspace_bytes,
                           kernel_bytes)


def _no_kernel_bytes(group: int, s0: int, s1: int) -> int:
    return 0


@functools.lru_cache(maxsize=1024)
def _attention_plan(fn, batch, seq_len, per_sequence_bytes, per_row_bytes, x_bytes, workspace_bytes, kernel_bytes):
    scratch = kernel_bytes or _no_kernel_bytes
    one_sequence = per_sequence_bytes + seq_len * per_row_bytes
    minimum = per_sequence_bytes + per_row_bytes

    def equal_group(most: int) -> int:
        # As few groups as ``most`` sequences per group takes, of equal size.
        return math.ceil(batch / math.ceil(batch / most))

    def group_bytes(group: int) -> int:
        last = batch - (math.ceil(batch / group) - 1) * group
        return group * one_sequence + max(scratch(group, 0, seq_len), scratch(last, 0, seq_len))

    def split_bytes(most: int) -> int:
        rows = balanced_rows(seq_len, most)
        worst = max(scratch(1, s0, min(s0 + rows, seq_len)) for s0 in range(0, seq_len, rows))
        return per_sequence_bytes + rows * per_row_bytes + worst

    if workspace_bytes is None:
        sequences_for_min_rows = min(batch, max(1, math.ceil(DEFAULT_MIN_ROWS / seq_len)))
        bound = default_workspace_bytes(x_bytes, group_bytes(sequences_for_min_rows))
        bound = max(bound, minimum)
    else:
        bound = workspace_bytes
        if bound < minimum:
            raise ValueError(
                f"{fn}: workspace_bytes={bound} is below one query row plus one sequence's K and V "
                f"({minimum} bytes); pass at least {minimum} or None for the default"
            )
    most = min(bound // one_sequence, batch)
    while most >= 1:
        group = equal_group(most)
        if group_bytes(group) <= bound:
            return AttentionPlan(group=group, q_rows=seq_len, seq_len=seq_len)
        most = group - 1
    # One sequence at a time, its queries by panels. The kernel's scratch is not
    # proportional to the rows: shrink by the overshoot (at most halving per step)
    # until a size fits, then bisect back up towards the last size that did not.
    most, too_many = (bound - per_sequence_bytes) // per_row_bytes, None
    while most >= 1:
        need = split_bytes(most)
        if need <= bound:
            break
        rows = balanced_rows(seq_len, most)
        too_many = most
        most = min(rows - 1, max(most - math.ceil((need - bound) / per_row_bytes), rows // 2))
    else:
        if workspace_bytes is None:
            return AttentionPlan(group=1, q_rows=1, seq_len=seq_len)
        need = split_bytes(1)
        raise ValueError(
            f"{fn}: workspace_bytes={bound} holds one query row and one sequence's K and V but not the attention "
            f"kernel's own scratch for them ({need - minimum} bytes); pass at least {need} or None for the default"
        )
    while too_many is not None and too_many - most > 1:
        middle = (most + too_many) // 2
        if split_bytes(middle) <= bound:
            most = middle
        else:
            too_many = middle
    return AttentionPlan(group=1, q_rows=balanced_rows(seq_len, most), seq_len=seq_len)


# -- FlashAttention-2's split-KV scratch ---------------------------------------------------------
#
# torch's FlashAttention-2 forward (aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp,
# ``mha_fwd`` -> ``set_params_splitkv``, num_splits=0, no dropout) splits the keys of a call that
# launches fewer than 0.8 waves of CTAs (``batch * heads * ceil(q_len / 64)`` against two per SM)
# into ``num_splits`` parts, each written to float32 accumulators it allocates for the call:
# ``out_accum`` (num_splits, batch, heads, q_len, head_dim rounded) and ``softmax_lse_accum``
# (num_splits, batch, heads, q_len). Query panels of a long sequence are exactly such calls: on an
# H100 (132 SMs) a panel of 512 rows of 8 heads over 2048 keys splits 4 ways, 4.06 MiB for an output
# of 0.5 MiB. These functions reproduce that choice.


@functools.lru_cache(maxsize=4096)
def flash_num_splits(ctas: int, sm_count: int, n_blocks: int) -> int:
    """FlashAttention-2's ``num_splits_heuristic(ctas, 2 * sm_count, n_blocks, 128)``."""
    slots = 2 * sm_count
    if ctas >= 0.8 * slots:
        return 1
    max_splits = min(128, slots, n_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or -(-n_blocks // s) != -(-n_blocks // (s - 1))

    efficiency = []
    for s in range(1, max_splits + 1):
        if eligible(s):
            waves = ctas * s / slots
            efficiency.append(waves / math.ceil(waves))
        else:
            efficiency.append(0.0)
    best = max(efficiency, default=0.0)
    for s in range(1, max_splits + 1):
        if eligible(s) and efficiency[s - 1] >= 0.85 * best:
            return s
    return 1


def flash_split_kv_bytes(*, batch: int, heads: int, kv_heads: int, q_len: int, kv_len: int, head_dim: int, sm_count: int) -> int:
    """Bytes FlashAttention-2's forward allocates for split-KV accumulators for one call (0: no split).

    ``batch`` sequences of ``q_len`` queries of ``heads`` heads over ``kv_len``
    keys of ``kv_heads`` heads; ``sm_count``: the GPU's multiprocessors. A call
    with one query and grouped heads runs with the groups as queries, as the
    kernel does (``seqlenq_ngroups_swapped``).
    """
    if batch <= 0 or q_len <= 0 or kv_len <= 0:
        return 0
    size = -(-head_dim // 8) * 8  # padded to a multiple of 8 before the call
    if size > 256:
        return 0  # not a FlashAttention call
    rounded = -(-size // 32) * 32 if size <= 128 else -(-size // 64) * 64
    block_n = 256 if size <= 64 else 128 if size <= 128 else 64
    if q_len == 1 and heads > kv_heads:
        q_len, heads = heads // kv_heads, kv_heads
    splits = flash_num_splits(batch * heads * -(-q_len // 64), sm_count, -(-kv_len // block_n))
    if splits <= 1:
        return 0
    return splits * batch * heads * q_len * (rounded + 1) * 4


@dataclass(frozen=True)
class FlashSplitKV:
    """``kernel_bytes`` of :func:`attention_plan` for FlashAttention-2 on a GPU of ``sm_count`` multiprocessors.

    Queries of a panel ``[s0, s1)`` attend to ``kv_len - seq_len + s1`` keys
    when ``causal`` (lower-right), else to all ``kv_len``.
    """

    heads: int
    kv_heads: int
    head_dim: int
    seq_len: int
    kv_len: int
    causal: bool
    sm_count: int

    def __call__(self, group: int, s0: int, s1: int) -> int:
        visible = self.kv_len - self.seq_len + s1 if self.causal else self.kv_len
        return flash_split_kv_bytes(batch=group, heads=self.heads, kv_heads=self.kv_heads, q_len=s1 - s0,
                                    kv_len=visible, head_dim=self.head_dim, sm_count=self.sm_count)
