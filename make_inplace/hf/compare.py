"""The main job's rows for Hugging Face models: one per family, converted against eager, at a small shape.

``rows(device)`` returns ``make_inplace._compare.Row`` objects (op
``hf <family>``): time of one inference forward and its activation memory
(peak allocated above the level before the call, from an emptied cache; on
CPU the profiler's allocation peak), eager transformers (sdpa) against the
same model after ``convert_``, and the relative error of the converted output.
Times are medians; on CPU the two models are timed in alternating pairs
(``paired_ms``) so that both see the same load. Returns no rows without
transformers.
"""

from __future__ import annotations

import copy
import gc
import statistics
import time
from typing import Callable

import torch

from .._measure import cpu_peak_extra

# (batch, sequence length) per family at the main job's shape; ViT: batch of small images.
SHAPES = {"bert": (8, 4096), "gpt2": (8, 4096), "llama": (8, 4096), "vit": (160, None)}
CPU_SHAPES = {"bert": (2, 128), "gpt2": (2, 128), "llama": (2, 128), "vit": (4, None)}


def _peak(fn, device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        del out
        return peak
    return cpu_peak_extra(fn)


# Timed pairs per row on CPU, where a forward at CPU_SHAPES takes about a millisecond.
CPU_PAIRS = 21


def paired_ms(ours: Callable[[], object], theirs: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median CPU milliseconds of ``ours`` and ``theirs``, timed in pairs of alternating order.

    On a shared CPU the time of a forward of about a millisecond is set by the
    machine's load more than by the model: an OpenMP parallel region (a GEMM,
    a layer norm, an activation, attention) ends only when all its threads
    have run, and while other processes hold the cores a descheduled thread
    costs a scheduler slice, ~12 ms per region: ~250 ms for a ViT forward of
    ~20 regions, eager or converted alike. Timing one model's calls and then
    the other's puts such a period on one side only; alternating pairs share
    it. Two warm-up calls each first.
    """
    for _ in range(2):
        ours()
        theirs()
    times: dict[int, list[float]] = {0: [], 1: []}
    fns = (ours, theirs)
    for rep in range(reps):
        for which in ((0, 1) if rep % 2 == 0 else (1, 0)):
            t0 = time.perf_counter()
            fns[which]()
            times[which].append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def rows(device: torch.device) -> list:
    """One Row per family (bf16 on CUDA, float32 on CPU)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return []
    import make_inplace
    from make_inplace._compare import Row

    from . import models
    from .measure import _median_ms

    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size = "small" if device.type == "cuda" else "tiny"
    shapes = SHAPES if device.type == "cuda" else CPU_SHAPES
    out_rows = []
    for family, (batch, seq_len) in shapes.items():
        eager = models.build(family, size, dtype=dtype, device=device, max_positions=max(512, (seq_len or 0) + 8))
        converted = copy.deepcopy(eager)
        make_inplace.convert_(converted)
        inputs = models.make_inputs(family, eager, batch=batch, seq_len=seq_len, device=device)
        with torch.inference_mode():
            run_eager = lambda: eager(**inputs)  # noqa: E731
            run_ours = lambda: converted(**inputs)  # noqa: E731
            expected = models.output_of(run_eager()).float()
            got = models.output_of(run_ours()).float()
            error = ((got - expected).abs().max() / expected.abs().max()).item()
            del expected, got
            ours_bytes, torch_bytes = _peak(run_ours, device), _peak(run_eager, device)
            if device.type == "cuda":
                ours_ms, torch_ms = _median_ms(run_ours, device, 10), _median_ms(run_eager, device, 10)
            else:
                ours_ms, torch_ms = paired_ms(run_ours, run_eager, CPU_PAIRS)
        tokens = models.tokens(family, size, batch, seq_len)
        shape = f"{batch}x{seq_len}" if seq_len else f"{batch} images {models.IMAGE_SIZE[size]}px"
        out_rows.append(
            Row(
                op=f"hf {family}",
                device=device.type,
                dtype=str(dtype).replace("torch.", ""),
                shape=f"{shape}, {models.SHAPES[size][family].layers} layers d={models.SHAPES[size][family].hidden}",
                ours_ms=ours_ms,
                torch_ms=torch_ms,
                rel_error=error,
                ours_bytes=ours_bytes,
                torch_bytes=torch_bytes,
                notes=f"{models.DESCRIPTIONS[family]}: convert_ vs transformers eager (sdpa), activation memory, {tokens} tokens",
            )
        )
        del eager, converted, inputs
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out_rows
