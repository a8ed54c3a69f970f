"""Private hooks for tests and sweeps; not part of the public API.

- ``forced_route``: force square_matmul_'s kernel route (or switch off the
  staged-rows kernels of softmax_/layer_norm_) for a block of code.
- ``square_matmul_route``: the routing policy's plan for a call described by
  its shape, dtype, layout and device facts; runs without a GPU.
- ``trilinear_reference``: trilinear_interpolation's formula in plain torch,
  the reference the tests and the sanitizer cases compare against.

docs/routing.md describes the routes, the policy's rules and these hooks.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple, Sequence

import torch

from . import _loader

_loader.load()

# Names forced_route accepts for square_matmul_: a family (the policy picks
# the mode) or one mode of it.
FORCED_ROUTES = (
    "wgmma",
    "wgmma_counted",
    "wgmma_clusters",
    "wgmma_grid",
    "wgmma_rows",
    "ffma",
    "ffma_counted",
    "ffma_grid",
    "panels",
    "waves",
)


@contextlib.contextmanager
def forced_route(
    route: str | None = None,
    *,
    tiles_per_cta: int | None = None,
    col_tile: int | None = None,
    panels_batched: bool = True,
    staged_rows: bool = True,
) -> Iterator[None]:
    """Forces kernel choices inside the block, then restores what was set before.

    Args:
        route: a square_matmul_ route from FORCED_ROUTES. It runs wherever it can
            run the call (dtype, alignment, GPU, workspace bound), whatever the
            policy's size thresholds; where it cannot, the policy decides.
        tiles_per_cta: result tiles per CTA (1 or 2) of the 128-row wgmma
            kernel (128 x 256) and the FFMA kernel (128 x 128); None lets the
            policy choose (a number keeps "wgmma" off the 64-row kernel).
        col_tile: result columns per tile (256 or 192) of the 128-row wgmma
            kernel; None lets the policy choose (a number keeps "wgmma" off
            the 64-row kernel).
        panels_batched: False runs the panel route's GEMMs one workspace block
            at a time instead of one batched call per panel.
        staged_rows: False keeps softmax_ and layer_norm_ off their staged-rows
            (shared-memory ring) kernels.

    The switch is process-wide (not per thread): for tests and sweeps only.
    """
    previous = torch.ops.make_inplace._route_override()
    torch.ops.make_inplace._set_route_override(
        route or "", tiles_per_cta or 0, col_tile or 0, panels_batched, staged_rows
    )
    try:
        yield
    finally:
        torch.ops.make_inplace._set_route_override(*previous)


class DeviceFacts(NamedTuple):
    """What the policy knows of a CUDA device (the binding asks the device)."""

    capability: tuple[int, int] = (9, 0)
    sm90a: bool = True  # the library carries the sm_90a (wgmma) kernels
    tensor_maps: bool = True  # the driver can encode TMA tensor maps
    wgmma_ctas: int = 0  # wgmma CTAs resident at once in a cooperative grid (also the 64-row kernel's)
    wgmma_clusters: Sequence[int] = ()  # [c]: wgmma clusters of c CTAs resident at once
    ffma_ctas: int = 0  # FFMA CTAs resident at once in a cooperative grid
    waves_max_width: int = 0  # widest n the waves kernel takes for the call's dtype


class RoutePlan(NamedTuple):
    """The policy's plan: the route and what its launch or workspace needs."""

    route: str
    tiles_per_cta: int  # wgmma/FFMA: result tiles per CTA per row-block (wgmma_rows: 256-column halves)
    group_ctas: int  # wgmma/FFMA: CTAs per group (cluster size in cluster modes)
    groups: int  # wgmma/FFMA: groups launched
    col_tile: int  # the 128-row wgmma kernel: result columns per tile (256 or 192); 0 for other routes
    counter_bytes: int  # counted modes: one 4-byte counter per 128-row block
    panel_blocks: int  # panel routes: workspace blocks per panel
    panel_rows_per_block: int
    panel_block_bytes: int
    panels_batched: bool

    @property
    def workspace_bytes(self) -> int:
        """Device memory the route allocates."""
        return self.counter_bytes + self.panel_blocks * self.panel_block_bytes


def square_matmul_route(
    rows: int,
    n: int,
    dtype: torch.dtype,
    *,
    device: DeviceFacts | None = None,
    transpose: bool = False,
    workspace_bytes: int | None = None,
    x_aligned: bool = True,
    weight_aligned: bool = True,
    bias_aligned: bool = True,
    allow_tf32: bool = False,
    forced: str | None = None,
    tiles_per_cta: int | None = None,
    col_tile: int | None = None,
    panels_batched: bool = True,
    cpu_l2_bytes: int | None = 0,
    cpu_bf16_dot: bool | None = True,
    cpu_amx: bool | None = False,
    cpu_rows_bf16_dot: bool | None = False,
) -> RoutePlan:
    """The plan square_matmul_ follows for x of shape (rows, n) on ``device``
    (None: the CPU, whose L2 rule weighs ``cpu_l2_bytes`` per core: 0 for no
    L2 rule, None for this machine's, as the op uses; ``cpu_bf16_dot``: whether
    the CPU has bfloat16 dot products, ``cpu_amx``: AMX tiles, ``cpu_rows_bf16_dot``:
    whether the row kernel multiplies bfloat16 with dot products, each None for
    this machine's). Raises RuntimeError where
    square_matmul_ would (a width too wide for the zero-workspace kernel with
    no room for a panel)."""
    facts = device or DeviceFacts()
    result = torch.ops.make_inplace._square_matmul_route(
        rows,
        n,
        dtype,
        device="cpu" if device is None else "cuda",
        transpose=transpose,
        workspace_bytes=workspace_bytes,
        x_aligned=x_aligned,
        weight_aligned=weight_aligned,
        bias_aligned=bias_aligned,
        allow_tf32=allow_tf32,
        capability_major=facts.capability[0],
        capability_minor=facts.capability[1],
        sm90a=facts.sm90a,
        tensor_maps=facts.tensor_maps,
        wgmma_ctas=facts.wgmma_ctas,
        wgmma_clusters=list(facts.wgmma_clusters),
        ffma_ctas=facts.ffma_ctas,
        waves_max_width=facts.waves_max_width,
        forced=forced or "",
        tiles_per_cta=tiles_per_cta or 0,
        col_tile=col_tile or 0,
        panels_batched=panels_batched,
        cpu_l2_bytes=cpu_l2_bytes,
        cpu_bf16_dot=cpu_bf16_dot,
        cpu_amx=cpu_amx,
        cpu_rows_bf16_dot=cpu_rows_bf16_dot,
    )
    return RoutePlan(*result)


def trilinear_reference(feats: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """The trilinear formula in plain torch: differentiable, in the inputs' dtype
    (float64 when given float64). feats (N, 8, F) corners, points (N, 3) in [-1, 1]."""
    u, v, w = ((points + 1) / 2).unbind(-1)
    out = 0
    for k in range(8):
        i, j, l = k >> 2, (k >> 1) & 1, k & 1
        weight = (u if i else 1 - u) * (v if j else 1 - v) * (w if l else 1 - w)
        out = out + weight[:, None] * feats[:, k]
    return out
