"""Peak memory per rank under data parallelism: converted vs unconverted models.

One process per GPU (NCCL), and a fresh set of processes for every point, so no
point inherits another's allocator cache. Points:

* ``train``: an ``nn.TransformerEncoder`` stack (BERT-large-like layers: d = 1024,
  16 heads, MLP 4096, post-norm, bf16) under DDP or FSDP2 (``fully_shard`` per
  layer and on the root), as built or after ``make_inplace.convert_``; one
  training step (forward, backward, SGD step) after a warm-up step;
* ``infer``: a Llama-style 1B Hugging Face model (``make_inplace.hf.models``,
  "reference" size, bf16, random weights) under DDP or FSDP2, eager or converted;
  one forward under ``torch.no_grad()`` after a warm-up forward.

Per rank, for the measured step (the allocator's cache emptied before it): what
was allocated before it (the rank's weights, inputs and, in training, optimizer
state), the peak ``max_memory_allocated`` and ``max_memory_reserved`` during it
(everything the card had to hold), and its extra allocation (peak minus before:
activations, gradients, unsharded parameters, communication buffers). Outputs
under ``--out``: distributed_memory.csv and distributed_memory.md.

    python benchmarks/distributed_memory.py --out /tmp/dm            # every GPU of the machine
    python benchmarks/distributed_memory.py --device cpu --size tiny --out /tmp/dm   # a smoke run (gloo)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1 << 20
# (kind, wrapper, variant) in the order the table shows them.
POINTS = [(kind, wrapper, variant) for kind, variants in (("train", ("unconverted", "converted")),
                                                          ("infer", ("eager", "converted")))
          for wrapper in ("ddp", "fsdp2") for variant in variants]
# Per size: encoder (d, heads, MLP, layers, batch, sequence) and Hugging Face (size, batch, sequence) per rank.
SIZES = {
    "reference": {"encoder": (1024, 16, 4096, 8, 8, 1024), "hf": ("reference", 1, 8192)},
    "tiny": {"encoder": (32, 2, 64, 2, 2, 16), "hf": ("tiny", 2, 16)},
}


def _encoder(d: int, heads: int, ff: int, layers: int, device, dtype) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, device=device, dtype=dtype)
    return nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)


def _shard(model: nn.Module, layers) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in layers:
        fully_shard(layer)
    return fully_shard(model)


def _wrap(model: nn.Module, wrapper: str, layers, device: torch.device) -> nn.Module:
    if wrapper == "fsdp2":
        return _shard(model, layers)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


FIELDS = ("allocated_before", "step_extra_allocated", "step_peak_allocated", "step_peak_reserved")


def _measure(step, device: torch.device) -> dict:
    """A warm-up step, then the measured one from a cold allocator cache (CPU: no figures)."""
    step()
    if device.type != "cuda":
        step()
        return dict.fromkeys(FIELDS)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"allocated_before": before, "step_extra_allocated": peak - before, "step_peak_allocated": peak,
            "step_peak_reserved": torch.cuda.max_memory_reserved(device)}


def _train_point(wrapper: str, variant: str, size: dict, rank: int, device, dtype) -> dict:
    import make_inplace

    d, heads, ff, layers, batch, seq = size["encoder"]
    model = _encoder(d, heads, ff, layers, device, dtype)
    if variant == "converted":
        make_inplace.convert_(model)
    wrapped = _wrap(model, wrapper, model.layers, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, seq, d, generator=g).to(device, dtype)

    def step():
        loss = wrapped(x.clone()).float().square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _measure(step, device)


def _infer_point(wrapper: str, variant: str, size: dict, rank: int, device, dtype) -> dict:
    import make_inplace
    from make_inplace.hf import models, registry

    hf_size, batch, seq = size["hf"]
    model = models.build("llama", hf_size, dtype=dtype, device=device, max_positions=max(512, seq))
    if variant == "converted":
        make_inplace.convert_(model)
        assert model.make_inplace_report.replaced, model.make_inplace_report
    wrapped = _wrap(model, wrapper, model.get_submodule(registry.FAMILIES["llama"].layers), device)
    inputs = models.make_inputs("llama", model, batch=batch, seq_len=seq, device=device, seed=rank)

    def step():
        with torch.no_grad():
            models.output_of(wrapped(**inputs))

    return _measure(step, device)


def _rank(rank: int, world: int, point: tuple, size_name: str, device_type: str, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    if device_type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    kind, wrapper, variant = point
    dtype = torch.bfloat16 if device_type == "cuda" else torch.float32
    run = _train_point if kind == "train" else _infer_point
    result = run(wrapper, variant, SIZES[size_name], rank, device, dtype)
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_point(point: tuple, size_name: str, device_type: str, world: int) -> list[dict]:
    """One point in a fresh set of processes; one result per rank."""
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(world, point, size_name, device_type, _free_port(), out), nprocs=world,
                           start_method="spawn")
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def _mib(v) -> str:
    return "" if v is None else f"{v / MiB:.0f}"


def write_tables(rows: list[dict], out: Path, header: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fields = ["kind", "wrapper", "variant", "rank"] + [f"{k}_mib" for k in FIELDS]
    with open(out / "distributed_memory.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in fields})
    lines = [header, "",
             "| point | wrapper | model | rank | allocated before MiB | step extra allocated MiB "
             "| step peak allocated MiB | step peak reserved MiB |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['kind']} | {r['wrapper']} | {r['variant']} | {r['rank']} | "
                     + " | ".join(r[f"{k}_mib"] for k in FIELDS) + " |")
    (out / "distributed_memory.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=tuple(SIZES), default="reference")
    parser.add_argument("--world", type=int, default=None, help="processes (default: every GPU; 2 on CPU)")
    parser.add_argument("--commit", default="unknown", help="the library's commit, for the table's header")
    parser.add_argument("--points", nargs="+", metavar="KIND:WRAPPER:VARIANT", default=None,
                        help="only these points, e.g. train:fsdp2:converted (default: all)")
    args = parser.parse_args(argv)
    points = POINTS if args.points is None else [tuple(p.split(":")) for p in args.points]
    unknown = [":".join(p) for p in points if p not in POINTS]
    if unknown:
        parser.error(f"unknown points {unknown}; known: {[':'.join(p) for p in POINTS]}")
    world = args.world or (torch.cuda.device_count() if args.device == "cuda" else 2)
    if args.device == "cuda" and world < 2:
        parser.error(f"needs two GPUs or more, found {torch.cuda.device_count()}")
    rows = []
    for point in points:
        for rank, result in enumerate(run_point(point, args.size, args.device, world)):
            row = dict(zip(("kind", "wrapper", "variant"), point), rank=rank)
            for key in FIELDS:
                row[f"{key}_mib"] = _mib(result[key])
            rows.append(row)
            print(json.dumps(row), flush=True)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (gloo; no memory figures)"
    header = (f"# Peak memory per rank, {world} x {name}, torch {torch.__version__}, size {args.size}, "
              f"make_inplace at {args.commit}\n\n"
              f"Written by benchmarks/distributed_memory.py. train: {SIZES[args.size]['encoder']} "
              f"(d, heads, MLP, layers, batch, sequence per rank); infer: Llama {SIZES[args.size]['hf']} "
              f"(size, batch, sequence per rank).")
    write_tables(rows, args.out, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
