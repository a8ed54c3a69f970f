"""Training a convert_'d encoder stack, and converted Hugging Face models' in-place
inference, under DDP and FSDP2: 2 processes, on CPU with gloo and, where the machine
has two GPUs, one GPU per process with NCCL.

tests/_distributed_worker.py runs every variant in one launch per device (starting
processes is the slow part); the tests here compare what the ranks saved.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

WORLD = 2
WORKER = Path(__file__).with_name("_distributed_worker.py")
TOL = dict(rtol=1e-10, atol=1e-12)  # float64 throughout

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="needs torch.distributed with gloo")
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(
        torch.cuda.device_count() < WORLD or not dist.is_nccl_available(), reason="needs two GPUs and NCCL")),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=DEVICES)
def ranks(request, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp(f"distributed-{request.param}")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(WORLD),
           "OMP_NUM_THREADS": "1", "MAKE_INPLACE_DIST_DEVICE": request.param}
    if request.param == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(out)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r][-4000:]}"
    results = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    expected = ["cpu", "cpu"] if request.param == "cpu" else [f"cuda:{r}" for r in range(WORLD)]
    assert [r["device"] for r in results] == expected
    assert {r["backend"] for r in results} == {"gloo" if request.param == "cpu" else "nccl"}
    return results


def _same_run(a: dict, b: dict, what: str) -> None:
    assert len(a["losses"]) == len(b["losses"]) > 0
    torch.testing.assert_close(torch.tensor(a["losses"]), torch.tensor(b["losses"]), **TOL, msg=what)
    for step, (ga, gb) in enumerate(zip(a["grads"], b["grads"])):
        assert ga.keys() == gb.keys(), (what, step, sorted(ga.keys() ^ gb.keys()))
        for name in ga:
            torch.testing.assert_close(ga[name], gb[name], **TOL, msg=f"{what}: step {step}, {name}")


@pytest.mark.parametrize("frozen", [False, True], ids=["trainable", "frozen-out-proj"])
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_converted_model_trains_like_the_unconverted_one(ranks, wrapper, frozen):
    for rank, results in enumerate(ranks):
        converted, unconverted = results[(wrapper, frozen, True)], results[(wrapper, frozen, False)]
        _same_run(converted, unconverted, f"rank {rank}, {wrapper}: converted vs unconverted")
        # And both as one process training on every rank's batch: the gradients were synchronized.
        _same_run(unconverted, results[("single", frozen, False)], f"rank {rank}, {wrapper} vs one process")
    # Every rank saw the same losses and gradients.
    _same_run(ranks[0][(wrapper, frozen, True)], ranks[1][(wrapper, frozen, True)], f"{wrapper}: rank 0 vs rank 1")


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_frozen_projections_ran_in_place(ranks, wrapper):
    # The frozen variant exercises square_matmul_ on FSDP's unsharded weights;
    # the trainable one never calls it (out of place, dW needs x).
    for results in ranks:
        assert results[(wrapper, True, True)]["square_matmul_calls"] > 0
        assert results[(wrapper, False, True)]["square_matmul_calls"] == 0


def test_sharded_weight_is_seen_whole_in_forward_and_refused_outside(ranks):
    for results in ranks:
        check = results["sharded"]
        assert check["in_forward_ok"]
        assert check["weight_is_sharded"]
        assert check["refusal"] is not None, "square_matmul_ ran on a sharded weight"
        assert "make_inplace.square_matmul_: weight is a DTensor" in check["refusal"]
        assert check["refused_x_unchanged"]


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "vit"])
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_converted_hugging_face_inference_in_each_rank(ranks, wrapper, family):
    # Llama's RMSNorm computes in float32 whatever the model's dtype (transformers' own code).
    tol = dict(rtol=1e-6, atol=1e-6) if family == "llama" else TOL
    outputs = []
    for rank, results in enumerate(ranks):
        run = results[("hf", wrapper, family)]
        assert run["in_place_blocks"] == 2 * run["layers"] > 0, f"rank {rank}: the in-place blocks did not all run"
        torch.testing.assert_close(run["got"], run["expected"], **tol, msg=f"rank {rank}, {wrapper}, {family}")
        outputs.append(run["got"])
    # Each rank ran a batch of its own.
    assert not torch.equal(outputs[0], outputs[1])


def test_memory_benchmark_points_run(tmp_path):
    # benchmarks/distributed_memory.py at its tiny size on CPU (gloo): each point's processes
    # build, wrap and step their model; the GPU run reports the memory.
    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "distributed_memory.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, str(bench), "--device", "cpu", "--size", "tiny", "--out", str(tmp_path),
                             "--points", "train:fsdp2:converted", "infer:ddp:converted"],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    table = (tmp_path / "distributed_memory.md").read_text()
    assert "| train | fsdp2 | converted | 1 |" in table and "| infer | ddp | converted | 1 |" in table
