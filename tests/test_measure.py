"""time_ms: host time on CPU; on CUDA the GPU's time only, however slowly the
host queues the call's kernels."""

from __future__ import annotations

import time

import pytest
import torch

from make_inplace._measure import _spin_cycles_per_ms, time_ms

from conftest import requires_cuda


def test_cpu_time_is_the_calls_host_time():
    assert time_ms(lambda: time.sleep(0.002), torch.device("cpu"), reps=5) >= 2.0


@requires_cuda
def test_cuda_time_leaves_out_host_gaps_between_kernels():
    # Two tiny kernels 3 ms apart on the host: a spin shorter than the call's
    # host time would let the GPU wait inside the timed span.
    device = torch.device("cuda")
    x = torch.zeros(1024, device=device)

    def call():
        x.add_(1)
        time.sleep(0.003)
        x.add_(1)

    assert time_ms(call, device, reps=5) < 1.0


@requires_cuda
@pytest.mark.parametrize("ms", [0.5, 2.0])
def test_cuda_time_is_the_gpus_time(ms):
    device = torch.device("cuda")
    cycles = int(ms * _spin_cycles_per_ms(torch.cuda.current_device()))
    assert time_ms(lambda: torch.cuda._sleep(cycles), device, reps=5) == pytest.approx(ms, rel=0.2)
