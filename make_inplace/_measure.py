"""How the library measures memory and time, shared by the main job
(``python -m make_inplace``), the benchmarks and the tests.

Memory is the peak a call adds above the level before it. On CUDA:
``max_memory_reserved`` (what the card loses to the process) and
``max_memory_allocated``, with the caching allocator emptied before the inputs
are made (``fresh_cuda_memory``) so the figure does not depend on what earlier
code left cached. On CPU: the running sum of the profiler's allocation and free
events (``cpu_peak_extra``). docs/memory.md says why each is honest.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

MiB = 1 << 20


def best_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def fresh_cuda_memory() -> None:
    """Frees cached blocks so the next measurement starts from a cold allocator."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@dataclass
class PeakExtra:
    reserved: int
    allocated: int


def cuda_peak_extra(fn: Callable[[], object], device: torch.device | None = None) -> PeakExtra:
    """Runs ``fn`` once; returns the peak memory it added above the level before it.

    Call ``fresh_cuda_memory()`` before allocating fn's inputs.
    """
    device = device or torch.device("cuda")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    reserved0 = torch.cuda.memory_reserved(device)
    allocated0 = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = PeakExtra(
        reserved=torch.cuda.max_memory_reserved(device) - reserved0,
        allocated=torch.cuda.max_memory_allocated(device) - allocated0,
    )
    del result
    return peak


@contextlib.contextmanager
def _fd2_to_devnull():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cpu_peak_extra(fn: Callable[[], object]) -> int:
    """Runs ``fn`` once; returns the peak bytes its CPU allocations added.

    torch.profiler (``profile_memory=True``) records every allocation and free
    of torch's CPU allocator, which keeps no cache: the highest running sum of
    those events, in time order, is the most the call held at once.
    """
    from torch.profiler import ProfilerActivity, profile

    # torch 2.13's profiler writes two lines to stderr (fd 2) per start and stop.
    with _fd2_to_devnull(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    del result
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def peak_extra(fn: Callable[[], object], device: torch.device) -> PeakExtra:
    """``cuda_peak_extra`` on CUDA; on CPU reserved and allocated are the same figure."""
    if device.type == "cuda":
        return cuda_peak_extra(fn, device)
    peak = cpu_peak_extra(fn)
    return PeakExtra(reserved=peak, allocated=peak)


# Cycles of the spin kernel queued ahead of each timed CUDA call, at least:
# about 0.1 ms on an H100/H200, longer than one op's host-side launch work.
HOST_AHEAD_CYCLES = 200_000


@functools.lru_cache(maxsize=None)
def _spin_cycles_per_ms(device_index: int) -> float:
    """The spin kernel's cycles per millisecond on this device (timed once)."""
    with torch.cuda.device(device_index):
        torch.cuda._sleep(HOST_AHEAD_CYCLES)  # first launch out of the way
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(5 * HOST_AHEAD_CYCLES)
        end.record()
        end.synchronize()
        return 5 * HOST_AHEAD_CYCLES / start.elapsed_time(end)


def time_ms(fn: Callable[[], object], device: torch.device, *, warmup: int = 3, reps: int = 20) -> float:
    """Median time of one call of ``fn`` in milliseconds.

    On CUDA: GPU time between CUDA events, one call per pair. A spin kernel
    is queued before the start event, long enough that the host has queued
    all of the call's kernels before the GPU reaches them: at least
    HOST_AHEAD_CYCLES, and twice the shortest host time of the warm-up calls
    (a layer of a dozen kernels takes longer to launch than 0.1 ms, and its
    time then depended on how fast the host ran). So the host's launch time
    is not counted, as inside a model, where the host runs ahead of the GPU;
    ``lab/host_time.py`` measures it.
    """
    host = []
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        ahead_ms = 2e3 * min(host) if host else 0.0
        cycles = max(HOST_AHEAD_CYCLES, int(ahead_ms * _spin_cycles_per_ms(index)))
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(cycles)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def relative_error(result: torch.Tensor, reference: torch.Tensor) -> float:
    """||result - reference|| / ||reference|| in float64 (NaN-safe: NaN stays NaN)."""
    r = result.detach().double().cpu()
    ref = reference.detach().double().cpu()
    denom = ref.norm().item()
    return (r - ref).norm().item() / (denom if denom > 0 else 1.0)
