"""One measurement point: a model's activation memory and time for one inference forward.

Run as a fresh process per point (the benchmark and the GPU tests do)::

    python -m make_inplace.hf.measure --family bert --mode converted --size reference --batch 8 --seq-len 4096

prints one JSON line. Activation memory is the peak ``max_memory_allocated``
during one forward minus ``memory_allocated`` just before it (weights and
inputs already allocated), and the same for ``max_memory_reserved``; the
forward before it (at the same shape) warms cuBLAS, the compiler and the
allocator, and ``empty_cache()`` then hands the allocator's cache back so the
reserved figure starts cold. Modes: ``eager`` (transformers with sdpa),
``compile`` (``torch.compile`` of the same model, static shapes) and
``converted`` (``make_inplace.convert_``). Everything runs under
``torch.inference_mode()``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

MODES = ("eager", "compile", "converted")


def prepare(family: str, mode: str, size: str, *, dtype: torch.dtype, device, max_positions: int):
    """(callable running one forward, model)."""
    import make_inplace
    from . import models

    model = models.build(family, size, dtype=dtype, device=device, max_positions=max_positions)
    if mode == "converted":
        make_inplace.convert_(model)
        if not model.make_inplace_report.replaced:
            raise RuntimeError(f"convert_ replaced nothing in {family}: {model.make_inplace_report}")
        run = model
    elif mode == "compile":
        torch._dynamo.reset()
        run = torch.compile(model, dynamic=False)
    elif mode == "eager":
        run = model
    else:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return run, model


def _median_ms(fn, device, reps: int) -> float:
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(200_000)  # the host queues the forward while the GPU spins: launch time hidden as in a loop
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(
    family: str,
    mode: str,
    size: str,
    batch: int,
    seq_len: int | None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cuda",
    reps: int = 5,
    sample_path: str | None = None,
) -> dict:
    """Builds the model, runs the point, returns the figures (status ``"oom"`` when it does not fit)."""
    from . import models

    device = torch.device(device)
    point = {
        "family": family, "mode": mode, "size": size, "batch": batch, "seq_len": seq_len,
        "tokens": models.tokens(family, size, batch, seq_len), "dtype": str(dtype).replace("torch.", ""),
        "status": "ok", "peak_allocated": None, "peak_reserved": None, "ms": None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    max_positions = max(512, (seq_len or 0) + 8)
    try:
        t0 = time.perf_counter()
        run, model = prepare(family, mode, size, dtype=dtype, device=device, max_positions=max_positions)
        inputs = models.make_inputs(family, model, batch=batch, seq_len=seq_len, device=device)
        with torch.inference_mode():
            forward = lambda: run(**inputs)  # noqa: E731
            out = forward()  # warm-up at the measured shape (compiles in compile mode)
            del out
            point["setup_s"] = round(time.perf_counter() - t0, 2)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
                allocated0, reserved0 = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
            out = forward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                point["peak_allocated"] = torch.cuda.max_memory_allocated(device) - allocated0
                point["peak_reserved"] = torch.cuda.max_memory_reserved(device) - reserved0
                point["unit_bytes"] = point["tokens"] * model.config.hidden_size * torch.finfo(dtype).bits // 8
            if sample_path:
                torch.save(models.output_of(out)[:1].float().cpu(), sample_path)
            del out
            point["ms"] = _median_ms(forward, device, reps) if reps else None
    except torch.cuda.OutOfMemoryError:
        point["status"] = "oom"
    return point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", required=True)
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--size", default="reference")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sample", default=None, help="save the first sequence's output here (torch.save)")
    args = parser.parse_args(argv)
    if args.dtype == "float32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    point = measure(
        args.family, args.mode, args.size, args.batch, args.seq_len,
        dtype=getattr(torch, args.dtype), device=args.device, reps=args.reps, sample_path=args.sample,
    )
    print(json.dumps(point), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
