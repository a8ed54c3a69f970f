"""One rank of tests/test_distributed.py: trains an encoder stack, unconverted and
converted by make_inplace.convert_, under DDP and under FSDP2 (fully_shard), runs
converted Hugging Face models' in-place inference under both, and saves each run's
losses, full gradients and outputs for the test. On CPU with gloo, or with
MAKE_INPLACE_DIST_DEVICE=cuda one GPU per rank (cuda:LOCAL_RANK) with NCCL.

Run as ``python _distributed_worker.py OUT_DIR`` with torchrun's environment
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

import make_inplace
import make_inplace.nn.linear as linear_module
from make_inplace.nn import InplaceLinear, InplaceMultiheadAttention

D, HEADS, FF, LAYERS = 16, 2, 32, 2
BATCH, LENGTH, STEPS = 2, 5, 3


def make_model(frozen: bool, device: torch.device) -> nn.TransformerEncoder:
    torch.manual_seed(0)  # every rank and every variant starts from the same weights
    layer = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True, dtype=torch.float64, device=device)
    model = nn.TransformerEncoder(layer, num_layers=LAYERS, enable_nested_tensor=False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name:
                p.normal_(0.0, 0.3)
    if frozen:
        # Frozen output projections: the converted attention then runs them in
        # place through square_matmul_ (with the materialized core, below).
        for layer in model.layers:
            layer.self_attn.out_proj.weight.requires_grad_(False)
    return model


def batch(rank: int, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, LENGTH, D, generator=g, dtype=torch.float64)
    pad = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    pad[1, LENGTH - 2 :] = True
    return x.to(device), pad.to(device)


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().to("cpu", copy=True)


def ddp(model: nn.Module, device: torch.device) -> DistributedDataParallel:
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def train(wrapper: str, frozen: bool, converted: bool, rank: int, world: int, device: torch.device) -> dict:
    model = make_model(frozen, device)
    calls = [0]
    if converted:
        make_inplace.convert_(model)
        if frozen:
            for module in model.modules():
                if isinstance(module, InplaceMultiheadAttention):
                    module.core = "materialized"
    if wrapper == "ddp":
        wrapped = ddp(model, device)
    elif wrapper == "fsdp2":
        for layer in model.layers:
            fully_shard(layer)
        wrapped = fully_shard(model)
    else:  # "single": one process, every rank's batch at once (the reference)
        wrapped = model
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    original = linear_module.square_matmul_

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    linear_module.square_matmul_ = counted
    losses, grads = [], []
    try:
        for step in range(STEPS):
            if wrapper == "single":
                parts = [batch(r, step, device) for r in range(world)]
                x, pad = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
            else:
                x, pad = batch(rank, step, device)
            loss = wrapped(x, src_key_padding_mask=pad).square().mean()
            optimizer.zero_grad()
            loss.backward()
            grads.append({name: full(p.grad) for name, p in model.named_parameters() if p.grad is not None})
            optimizer.step()
            total = loss.detach().clone()
            if wrapper != "single":
                dist.all_reduce(total)
                total /= world
            losses.append(total.item())
    finally:
        linear_module.square_matmul_ = original
    return {"losses": losses, "grads": grads, "square_matmul_calls": calls[0]}


def sharded_weight_check(device: torch.device) -> dict:
    """A frozen InplaceLinear inside an FSDP2 module: its forward sees the
    unsharded weight; called on its own, the weight is a sharded DTensor and
    square_matmul_ must refuse it, naming it, before writing x."""
    torch.manual_seed(0)
    model = nn.Sequential(InplaceLinear(D, dtype=torch.float64, device=device)).requires_grad_(False)
    full_weight, full_bias = model[0].weight.detach().clone(), model[0].bias.detach().clone()
    fully_shard(model)
    x = torch.randn(3, D, dtype=torch.float64, device=device)
    expected = x @ full_weight.t() + full_bias
    result = {"weight_is_sharded": isinstance(model[0].weight, DTensor)}
    y = x.clone()
    try:
        with torch.no_grad():
            model[0](y)  # the layer alone: FSDP's hooks on the root do not run
        result["refusal"] = None
    except RuntimeError as e:
        result["refusal"] = str(e)
    result["refused_x_unchanged"] = torch.equal(y, x)
    y = x.clone()
    with torch.no_grad():
        out = model(y)  # through the FSDP module: the forward sees the whole weight
    result["in_forward_ok"] = out is y and torch.allclose(y, expected, rtol=1e-12, atol=1e-12)
    return result


HF_FAMILIES = ("bert", "gpt2", "llama", "vit")


def hf_inference(wrapper: str, family: str, rank: int, device: torch.device) -> dict:
    """A tiny Hugging Face model and its convert_'d copy under DDP or FSDP2 (every converted
    layer and the root sharded), each rank on a batch of its own, in eval mode without grad:
    both outputs, and how many in-place blocks the converted forward ran."""
    from make_inplace.hf import bert, gpt2, llama, models, registry, vit

    reference = models.build(family, "tiny", dtype=torch.float64, device=device)
    converted = make_inplace.convert_(copy.deepcopy(reference))
    where = registry.FAMILIES[family].layers
    inputs = models.make_inputs(family, reference, batch=2, seq_len=13, device=device, seed=100 + rank)
    if wrapper == "ddp":
        run_reference, run_converted = ddp(reference, device), ddp(converted, device)
    else:  # "fsdp2"
        for model in (reference, converted):
            for layer in model.get_submodule(where):
                fully_shard(layer)
            fully_shard(model)
        run_reference, run_converted = reference, converted
    family_module = {"bert": bert, "gpt2": gpt2, "llama": llama, "vit": vit}[family]
    calls = [0]
    originals = {name: getattr(family_module, name) for name in ("residual_attention_", "residual_mlp_")}

    def counted(real):
        def call(*args, **kwargs):
            calls[0] += 1
            return real(*args, **kwargs)
        return call

    try:
        for name, real in originals.items():
            setattr(family_module, name, counted(real))
        with torch.no_grad():
            expected = models.output_of(run_reference(**inputs))
            got = models.output_of(run_converted(**inputs))
    finally:
        for name, real in originals.items():
            setattr(family_module, name, real)
    return {"expected": expected.cpu(), "got": got.cpu(), "in_place_blocks": calls[0],
            "layers": len(converted.get_submodule(where))}


def main(out_dir: Path) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if os.environ.get("MAKE_INPLACE_DIST_DEVICE", "cpu") == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    results = {"device": str(device), "backend": dist.get_backend()}
    for wrapper in ("single", "ddp", "fsdp2"):
        for frozen in (False, True):
            for converted in (False, True):
                results[(wrapper, frozen, converted)] = train(wrapper, frozen, converted, rank, world, device)
    results["sharded"] = sharded_weight_check(device)
    for wrapper in ("ddp", "fsdp2"):
        for family in HF_FAMILIES:
            results[("hf", wrapper, family)] = hf_inference(wrapper, family, rank, device)
    torch.save(results, out_dir / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
