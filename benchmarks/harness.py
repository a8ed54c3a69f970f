"""The one benchmark harness every benchmarks/bench_<op>.py uses.

Pairs torch (eager, and torch.compile on CUDA) with make_inplace at the same
shapes in pytest-benchmark, one group per (op, dtype, shape), so
``pytest benchmarks --benchmark-only --benchmark-group-by=group`` prints them
side by side. Each entry's ``extra_info`` holds the GPU time per call from CUDA events
(median, host launch time not counted: ``make_inplace._measure.time_ms``), throughput
against the card's ceiling, and the peak extra memory
(``max_memory_reserved`` / ``max_memory_allocated``) of one call measured from
a cold allocator (docs/memory.md). ``benchmarks/summarize.py`` turns a run's
JSON into the committed summary.

Short mode (CPU, or ``MAKE_INPLACE_BENCH_SHORT=1``) runs small shapes and skips
torch.compile rows, so CI keeps the suite from rotting in a few seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from make_inplace._measure import MiB, cuda_peak_extra, fresh_cuda_memory, time_ms

DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
SHORT = DEVICE.type == "cpu" or os.environ.get("MAKE_INPLACE_BENCH_SHORT") == "1"
ROUNDS = 5 if SHORT else 30

# Device copy (read + write) bandwidth measured on each GPU (docs/results.md).
COPY_BYTES_PER_S = {"H200": 4224e9, "H100": 3000e9}


def gpu_name() -> str:
    return torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu"


def copy_ceiling() -> float | None:
    name = gpu_name()
    for key, value in COPY_BYTES_PER_S.items():
        if key in name:
            return value
    return None


@dataclass
class Work:
    """What one call must do: FLOPs and the fewest bytes it must move."""

    flops: float = 0.0
    bytes: float = 0.0


def compiled(fn: Callable) -> Callable:
    """torch.compile'd version of a torch reference (static shapes, fresh cache)."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def run(
    benchmark,
    *,
    group: str,
    impl: str,
    make_inputs: Callable[[], tuple],
    fn: Callable[..., object],
    work: Work,
    rotate: int = 1,
) -> None:
    """Benchmarks ``fn(*inputs)`` and records time, throughput and peak memory.

    make_inputs builds one input set; ``rotate`` sets are cycled through so
    inputs that fit in L2 are not timed from cache. fn may overwrite its
    inputs (in-place ops): inputs are made so that repeated application stays
    finite and nonzero.
    """
    benchmark.group = group
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["device"] = gpu_name()
    benchmark.extra_info["torch"] = torch.__version__

    if DEVICE.type == "cuda":
        fresh_cuda_memory()
        inputs = make_inputs()
        peak = cuda_peak_extra(lambda: fn(*inputs))
        benchmark.extra_info["peak_extra_reserved_mib"] = peak.reserved / MiB
        benchmark.extra_info["peak_extra_allocated_mib"] = peak.allocated / MiB
        del inputs
    sets = [make_inputs() for _ in range(rotate)]
    state = {"i": 0}

    def once():
        state["i"] = (state["i"] + 1) % len(sets)
        return fn(*sets[state["i"]])

    ms = time_ms(once, DEVICE, warmup=3, reps=ROUNDS)
    benchmark.extra_info["median_ms"] = ms
    if work.flops:
        benchmark.extra_info["tflops"] = work.flops / (ms * 1e-3) / 1e12
    if work.bytes:
        gbps = work.bytes / (ms * 1e-3) / 1e9
        benchmark.extra_info["gb_per_s"] = gbps
        ceiling = copy_ceiling()
        if ceiling:
            benchmark.extra_info["share_of_copy_bandwidth"] = gbps * 1e9 / ceiling

    def timed():
        once()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()

    benchmark.pedantic(timed, rounds=ROUNDS, iterations=1, warmup_rounds=1)
