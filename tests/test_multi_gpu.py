"""Two GPUs of one host: every op and module on cuda:1 while cuda:0 is the current device.

For each case of the GPU-guarantee table (every op, backward op, kernel route and module)
and each converted Hugging Face family, with the inputs on cuda:1:

* the results (and gradients) are correct;
* nothing is allocated on cuda:0 (its peak ``max_memory_allocated`` does not move) and
  every kernel the profiler sees runs on device 1;
* the kernels run on device 1's *current* stream: the inputs are written on a side
  stream of device 1, behind a slow kernel, and the call is made with that stream
  current and no synchronization, so a launch on any other stream would read them
  unfinished;

and tensors split across the two devices are refused with the op's error, before
anything is written. Skipped on machines with fewer than two GPUs.
"""

from __future__ import annotations

import contextlib
import copy
import re

import pytest
import torch
from torch.autograd import DeviceType

import make_inplace
import test_gpu_guarantees as guarantees
import test_validation as validation

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")

CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)
CASES = guarantees.build_cases()  # their own modules, built on cuda:1 by the first test that uses them


@pytest.fixture(autouse=True)
def _on_cuda1_with_cuda0_current(monkeypatch):
    """The case builders make their tensors and modules on cuda:1; the current device is cuda:0."""
    monkeypatch.setattr(guarantees, "DEVICE", str(CUDA1))
    torch.cuda.set_device(CUDA0)
    yield
    torch.cuda.synchronize(CUDA1)


@contextlib.contextmanager
def _on_cuda1_side_stream():
    """Device 1's current stream is a side stream that first runs a slow kernel; cuda:0 stays
    the current device. Inside, device 1 sees its cuda:0-free peak and the profiler records."""
    torch.cuda.synchronize(CUDA1)
    side = torch.cuda.Stream(device=CUDA1)
    side.wait_stream(torch.cuda.current_stream(CUDA1))
    before0 = torch.cuda.memory_allocated(CUDA0)
    torch.cuda.reset_peak_memory_stats(CUDA0)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        with torch.cuda.stream(side):  # (torch.cuda.set_stream also makes cuda:1 the current device)
            with torch.cuda.device(CUDA1):
                torch.cuda._sleep(20_000_000)  # a launch on another stream would overtake it
            torch.cuda.set_device(CUDA0)  # device 1's current stream stays `side`
            assert torch.cuda.current_stream(CUDA1) == side
            yield side
            assert torch.cuda.current_device() == 0, "the call changed the current device"
        torch.cuda.current_stream(CUDA1).wait_stream(side)
        torch.cuda.synchronize(CUDA1)
    assert torch.cuda.max_memory_allocated(CUDA0) == before0, "the call allocated on cuda:0"
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    assert kernels, "the profiler recorded no kernel"
    elsewhere = sorted({e.name for e in kernels if e.device_index != 1})
    assert not elsewhere, f"kernels ran on another device than cuda:1: {elsewhere}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_on_cuda1(case):
    values = guarantees._fresh(case)
    assert all(v.device == CUDA1 for v in values.values())
    expected, theirs = guarantees._expected(case, values)
    placeholders = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=CUDA1).fill_(float("nan"))
                    for k, v in values.items()}
    with case.forcing(), _on_cuda1_side_stream():
        for k, v in values.items():
            placeholders[k].copy_(v.detach())
            placeholders[k].requires_grad_(v.requires_grad)
        results = case.run(placeholders)
        grads = guarantees._backward(results, placeholders, case.grads) if case.grads else []
    assert all(r.device == CUDA1 for r in results + grads)
    guarantees._check(results, expected, case.tol, case.name, theirs)
    if case.grads:
        if case.yardstick is None:
            reference = guarantees._reference_grads(case, values)
            guarantees._check(grads, reference, case.tol * 4, f"{case.name} grads vs reference")
        else:  # modules: against the same computation on device 1's default stream
            eager = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in values.items()}
            with case.forcing():
                eager_grads = guarantees._backward(case.run(eager), eager, case.grads)
            guarantees._check(grads, eager_grads, case.tol, f"{case.name} grads vs the default stream")


# ------------------------------------------------------- converted Hugging Face models


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "vit"])
def test_converted_hugging_face_model_on_cuda1(family, monkeypatch):
    pytest.importorskip("transformers")
    from make_inplace.hf import models
    from test_hf_convert import FAMILY_MODULE, _Spy

    reference = models.build(family, "tiny", dtype=torch.float32, device=CUDA1)
    inputs = models.make_inputs(family, reference, batch=3, seq_len=37, device=CUDA1)
    model = make_inplace.convert_(copy.deepcopy(reference))
    assert model.make_inplace_report.replaced
    spy = _Spy(monkeypatch, FAMILY_MODULE[family])
    with torch.no_grad():
        expected = models.output_of(reference(**inputs))
        written = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        fresh = {k: torch.full_like(v, 1 if v.dtype == torch.long else float("nan")) for k, v in written.items()}
        with _on_cuda1_side_stream():
            for k, v in written.items():
                fresh[k].copy_(v)
            got = models.output_of(model(**{**inputs, **fresh}))
    assert spy.calls == 2 * reference.config.num_hidden_layers  # every block ran in place
    assert got.device == CUDA1
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


# ------------------------------------------------------------ inputs split across devices


# The Python wrappers' message (tests/conftest.py: device_mismatch) and the C++ checks' one.
_SPLIT_MESSAGE = r"all tensor arguments must be on one device|must be on the same device as"


def _split_cases():
    """(op table, case, the argument moved to cuda:0) for every tensor argument of every op."""
    out = []
    for table_name, table in (("public", validation.PUBLIC), ("torch.ops", validation.RAW)):
        for case in table:
            for name in case.build():
                out.append(pytest.param(case, name, id=f"{table_name}-{case.op}-{name}"))
    return out


@pytest.mark.parametrize("case,moved", _split_cases())
def test_inputs_split_across_devices_are_refused(case, moved):
    tensors = {k: v.to(CUDA0 if k == moved else CUDA1) for k, v in case.build().items()}
    before = {k: v.clone() for k, v in tensors.items()}
    with pytest.raises(RuntimeError) as info:
        case.run(tensors)
    message = str(info.value)
    assert re.search(rf"make_inplace\.{re.escape(case.op)}\b", message), message
    assert re.search(_SPLIT_MESSAGE, message) and "cuda:0" in message and "cuda:1" in message, message
    for k, v in tensors.items():
        assert torch.equal(v.flatten().view(torch.uint8), before[k].flatten().view(torch.uint8)), \
            f"{case.op}: {k} was written although the call was refused"


def test_module_on_cuda1_refuses_an_input_on_cuda0():
    from make_inplace.nn import InplaceLinear

    layer = InplaceLinear(64, device=CUDA1).requires_grad_(False)
    x = torch.randn(8, 64, device=CUDA0)
    before = x.clone()
    with pytest.raises(RuntimeError, match=_SPLIT_MESSAGE):
        layer(x)
    assert torch.equal(x, before)
