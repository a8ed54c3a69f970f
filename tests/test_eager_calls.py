"""The eager entry points (csrc/python/eager_calls.cpp): a plain call skips
torch.ops but must behave as torch.ops does; any other call must be refused
with nothing written, so the wrapper's torch.ops path handles it."""

import threading

import pytest
import torch

import make_inplace
from make_inplace import _loader
from conftest import DEVICES, DispatchRecorder, requires_cuda

ENTRIES = _loader.eager_entries()
OPS = ["square_matmul_", "softmax_", "layer_norm_", "rms_norm_", "outer_product", "trilinear_interpolation"]


def case(op, device="cpu"):
    """(args for the entry in its positional order, the written tensor)."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    if op == "square_matmul_":
        x = randn(5, 8)
        return [x, randn(8, 8), randn(8), False, None], x
    if op == "softmax_":
        x = randn(3, 7)
        return [x, -1, 0.5, False, None], x
    if op == "layer_norm_":
        x = randn(3, 7)
        return [x, [7], randn(7), randn(7), 1e-5], x
    if op == "rms_norm_":
        x = randn(3, 7)
        return [x, [7], randn(7), None], x
    if op == "outer_product":
        out = torch.zeros(2, 3, 4, device=device)
        return [randn(2, 3), randn(2, 4), out], out
    feats = randn(6, 8, 5)
    out = torch.zeros(6, 5, device=device)
    return [feats, torch.rand(6, 3, generator=g).to(device), out], out


def through_torch_ops(op, args):
    ops = torch.ops.make_inplace
    if op in ("outer_product", "trilinear_interpolation"):
        getattr(ops, op)(args[0], args[1], out=args[2])
    else:
        getattr(ops, op)(*args)


def test_the_built_library_has_an_entry_per_forward_op():
    assert sorted(ENTRIES) == sorted(OPS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_plain_call_matches_torch_ops_and_bumps_the_version_once(op, device):
    args, written = case(op, device)
    ref_args, ref_written = case(op, device)
    version, ref_version = written._version, ref_written._version
    assert ENTRIES[op](*args) is True
    through_torch_ops(op, ref_args)
    assert torch.equal(written, ref_written)
    assert written._version - version == ref_written._version - ref_version == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_tensors_requiring_grad_under_no_grad_take_the_entry(op, device):
    """As a module's parameters at inference: with grad mode off nothing is recorded,
    so the entry runs the call (values and version as torch.ops under no_grad)."""
    args, written = case(op, device)
    ref_args, ref_written = case(op, device)
    for a in args + ref_args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            a.requires_grad_()
    version, ref_version = written._version, ref_written._version
    with torch.no_grad():
        assert ENTRIES[op](*args) is True
        through_torch_ops(op, ref_args)
    assert torch.equal(written.detach(), ref_written.detach())
    assert written._version - version == ref_written._version - ref_version == 1
    assert written.grad_fn is None


class _Sub(torch.Tensor):
    pass


def _refusals(op):
    """(why, a context to call in, a change to the arguments) for calls that are not plain."""
    from contextlib import nullcontext

    def set_arg(i, value):
        return lambda args: args.__setitem__(i, value(args[i]))

    refusals = [
        ("requires grad under grad mode", torch.enable_grad, set_arg(0, lambda t: t.requires_grad_())),
        ("subclass", nullcontext, set_arg(0, lambda t: t.as_subclass(_Sub))),
        ("meta input", nullcontext, set_arg(0, lambda t: t.to("meta"))),
        ("profiler", lambda: torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]), None),
        ("dispatch mode", DispatchRecorder, None),
        ("function mode", lambda: torch.device("cpu"), None),
        ("autocast", lambda: torch.autocast("cpu", dtype=torch.bfloat16), None),
        ("wrong arity", nullcontext, lambda args: args.append(None)),
    ]
    written_at = 2 if op in ("outer_product", "trilinear_interpolation") else 0
    refusals.append(("written inference tensor", nullcontext,
                     set_arg(written_at, lambda t: _inference_copy(t))))
    if op == "softmax_":
        refusals.append(("int scale", nullcontext, set_arg(2, lambda s: 1)))
    if op in ("layer_norm_", "rms_norm_"):
        refusals.append(("tuple shape", nullcontext, set_arg(1, tuple)))
    return refusals


def _version(t):
    return None if t.is_inference() else t._version


def _inference_copy(t):
    with torch.inference_mode():
        return t.clone()


@pytest.mark.parametrize("op", OPS)
def test_other_calls_are_refused_with_nothing_written(op):
    for why, context, change in _refusals(op):
        args, _ = case(op)
        if change is not None:
            change(args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        real = [t for t in tensors if t.device.type != "meta"]
        before = [(t.detach().clone(), _version(t)) for t in real]
        with context():
            assert ENTRIES[op](*args) is False, why
        for (old, old_version), t in zip(before, real):
            assert torch.equal(t.detach(), old) and _version(t) == old_version, why


@requires_cuda
@pytest.mark.parametrize("op", OPS)
def test_refused_across_devices_with_nothing_written(op):
    args, written = case(op, "cuda")
    if op == "softmax_":
        args[4] = torch.zeros(3, 7, dtype=torch.bool)
    else:
        i = {"square_matmul_": 1, "layer_norm_": 2, "rms_norm_": 2}.get(op, 0)
        args[i] = args[i].cpu()
    before = written.clone()
    assert ENTRIES[op](*args) is False
    assert torch.equal(written, before) and written._version == 0


@requires_cuda
def test_runs_on_the_tensors_device_not_the_current_one():
    # The kernels set their device guard from x: a call from another current
    # device must still run on x's (checked where a second GPU exists).
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.randn(4, 8, device="cuda:1")
    expected = torch.softmax(x, -1)
    with torch.cuda.device(0):
        make_inplace.softmax_(x, -1)
    torch.testing.assert_close(x, expected)


def test_refused_under_vmap():
    results = []
    torch.func.vmap(lambda row: results.append(ENTRIES["softmax_"](row, -1, None, False, None)) or row)(torch.randn(2, 3))
    assert results == [False]


def test_modes_and_the_profiler_still_see_the_op():
    x = torch.randn(3, 7)
    recorder = DispatchRecorder()
    with recorder:
        make_inplace.softmax_(x, -1)
    assert "make_inplace.softmax_.default" in recorder.seen
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        make_inplace.square_matmul_(torch.randn(4, 8), torch.randn(8, 8))
    assert any(e.name == "make_inplace::square_matmul_" for e in prof.events())


def test_kernel_errors_come_back_as_torch_ops_raises_them_with_nothing_written():
    x = torch.randn(4, 8)
    before = x.clone()
    w = torch.randn(8, 6)
    with pytest.raises(RuntimeError) as through_ops:
        torch.ops.make_inplace.square_matmul_(x, w)
    with pytest.raises(RuntimeError) as through_entry:
        ENTRIES["square_matmul_"](x, w, None, False, None)
    assert str(through_entry.value) == str(through_ops.value)
    assert "make_inplace.square_matmul_" in str(through_entry.value)
    assert torch.equal(x, before) and x._version == 0


def test_calls_from_several_threads_at_once():
    xs = [torch.randn(300, 64) for _ in range(4)]
    w = torch.randn(64, 64) / 8
    expected = [x.double() @ w.double() for x in xs]
    threads = [threading.Thread(target=lambda x=x: [make_inplace.square_matmul_(x, w) for _ in range(1)]) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, e in zip(xs, expected):
        torch.testing.assert_close(x.double(), e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", OPS)
def test_compiled_calls_trace_torch_ops_without_a_graph_break(op):
    calls = {
        "square_matmul_": lambda a: make_inplace.square_matmul_(a[0], a[1], a[2]),
        "softmax_": lambda a: make_inplace.softmax_(a[0], -1, scale=0.5),
        "layer_norm_": lambda a: make_inplace.layer_norm_(a[0], 7, a[2], a[3]),
        "rms_norm_": lambda a: make_inplace.rms_norm_(a[0], 7, a[2]),
        "outer_product": lambda a: make_inplace.outer_product(a[0], a[1], out=a[2]),
        "trilinear_interpolation": lambda a: make_inplace.trilinear_interpolation(a[0], a[1], out=a[2]),
    }
    args, written = case(op)
    ref_args, ref_written = case(op)
    torch._dynamo.reset()
    torch.compile(calls[op], backend="eager", fullgraph=True)(args)
    calls[op](ref_args)
    torch.testing.assert_close(written, ref_written)
