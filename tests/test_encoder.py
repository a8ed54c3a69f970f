"""InplaceTransformerEncoderLayer against torch.nn.TransformerEncoderLayer(batch_first=True)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import make_inplace
from make_inplace.nn import InplaceTransformerEncoderLayer
from make_inplace._measure import cuda_peak_extra, fresh_cuda_memory
from conftest import DispatchRecorder

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}


def _pair(d=16, h=2, ff=24, *, dtype=torch.float64, device="cpu", **kw):
    ref = nn.TransformerEncoderLayer(d, h, ff, batch_first=True, device=device, dtype=dtype, **kw)
    with torch.no_grad():  # non-trivial norms and biases
        for name, p in ref.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight")):
                # In [0.5, 1.5]: layer_norm_'s backward rebuilds x_hat = (y - bias) / weight
                # from the half-precision y, which loses accuracy as |weight| -> 0.
                p.uniform_(0.5, 1.5)
            elif "bias" in name:
                p.normal_(0.0, 0.5)
    ours = InplaceTransformerEncoderLayer(d, h, ff, device=device, dtype=dtype, **kw)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _padding(n, length):
    pad = torch.zeros(n, length, dtype=torch.bool)
    for b in range(n):
        pad[b, length - min(b, length - 1) :] = True
    return pad


ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "F.gelu": F.gelu,
    "GELU-tanh": nn.GELU(approximate="tanh"),
    "ReLU": nn.ReLU(),
    "tanh": torch.tanh,
}


def test_same_state_dict_and_init_as_torch():
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(16, 2, 24, batch_first=True)
    torch.manual_seed(0)
    ours = InplaceTransformerEncoderLayer(16, 2, 24)
    assert list(ours.state_dict()) == list(ref.state_dict())
    for (name, a), (_, b) in zip(ref.state_dict().items(), ours.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
    nn.TransformerEncoderLayer(16, 2, 24, batch_first=True).load_state_dict(ours.state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("masks", ["none", "padding+bool_mask", "causal"])
def test_training_outputs_and_gradients_match_torch(norm_first, activation, masks):
    torch.manual_seed(1)
    n, length, d = 3, 6, 16
    ref, ours = _pair(d, dropout=0.0, norm_first=norm_first, activation=ACTIVATIONS[activation])
    x = torch.randn(n, length, d, dtype=torch.float64)
    kw = {}
    if masks == "padding+bool_mask":
        blocked = torch.rand(length, length) < 0.3
        blocked[:, 0] = False
        kw = {"src_key_padding_mask": _padding(n, length), "src_mask": blocked}
    elif masks == "causal":
        kw = {"src_mask": nn.Transformer.generate_square_subsequent_mask(length, dtype=torch.float64), "is_causal": True}
    results = []
    for module in (ref, ours):
        xx = x.clone().requires_grad_()
        y = module(xx, **kw)
        (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
        results.append((y.detach(), xx.grad, [p.grad for p in module.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-8, atol=1e-9)
    for g_ours, g_ref in zip(results[1][2], results[0][2]):
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("padded", [False, True])
def test_inference_matches_torch_fast_path_and_leaves_src_alone(norm_first, activation, padded):
    torch.manual_seed(2)
    n, length, d = 3, 7, 16
    ref, ours = _pair(d, 4, dtype=torch.float32, norm_first=norm_first, activation=activation)
    ref.eval(), ours.eval()
    x = torch.randn(n, length, d)
    before = x.clone()
    kpm = _padding(n, length) if padded else None
    with torch.no_grad():
        expected = ref(x, src_key_padding_mask=kpm)
        got = ours(x, src_key_padding_mask=kpm)
    torch.testing.assert_close(x, before)
    torch.testing.assert_close(got, expected, rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_inference_in_place_activations_match_torch_eager(activation):
    """Fast path off: torch's native path runs exact gelu even for GELU(approximate="tanh")."""
    torch.manual_seed(5)
    ref, ours = _pair(16, 2, activation=ACTIVATIONS[activation])
    ref.eval(), ours.eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    saved = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            expected = ref(x)
            got = ours(x)
    finally:
        torch.backends.mha.set_fastpath_enabled(saved)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_dropout_in_training_matches_torch_with_the_same_seed():
    """Attention and feed-forward dropouts draw the same masks as torch's.

    dropout1 draws its mask over the attention output, whose memory layout
    differs from torch's ((L, N, E) there), so its mask differs; p=1 checks
    that it is applied.
    """
    ref, ours = _pair(16, 2, 32, dropout=0.3)
    for m in (ref, ours):
        m.dropout1.p = 1.0
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    torch.manual_seed(3)
    expected = ref(x)
    for grad in (True, False):
        torch.manual_seed(3)
        with torch.set_grad_enabled(grad):
            got = ours(x)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_from_torch_adopts_submodules_and_mode():
    ref = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.2, activation="gelu", norm_first=True, batch_first=True).eval()
    ours = InplaceTransformerEncoderLayer.from_torch(ref)
    assert not ours.training and not ours.self_attn.training and ours.norm_first
    assert ours.linear1 is ref.linear1 and ours.norm2 is ref.norm2 and ours.dropout.p == 0.2
    assert ours.self_attn.in_proj_weight is ref.self_attn.in_proj_weight
    assert ours.activation is F.gelu
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=3e-5, atol=3e-5)


def test_refusals():
    with pytest.raises(ValueError, match="batch_first"):
        InplaceTransformerEncoderLayer(16, 2, batch_first=False)
    with pytest.raises(RuntimeError, match="activation"):
        InplaceTransformerEncoderLayer(16, 2, activation="swish")
    with pytest.raises(TypeError, match="activation"):
        InplaceTransformerEncoderLayer(16, 2, activation=3)


def test_exported():
    assert make_inplace.nn.InplaceTransformerEncoderLayer is InplaceTransformerEncoderLayer


# ---------------------------------------------------------------- CUDA


def _grad_error(grad, truth):
    return (grad.double() - truth).abs().max().item()


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_cuda_matches_torch(dtype, norm_first, grad):
    """Outputs against torch's layer in the same dtype; gradients against the same
    layer run in float64, since in half precision torch's own gradients are off
    the float64 ones by more than the per-dtype tolerance (x grad of this layer on
    an H100: 0.07-0.30 absolute in fp16 at max |grad| 6-13). Ours must be within
    the tolerance or within twice torch's own error, whichever is larger.
    """
    torch.manual_seed(4)
    n, length, d = 2, 65, 64
    ref, ours = _pair(d, 4, 128, dtype=dtype, device="cuda", dropout=0.0, norm_first=norm_first)
    truth = copy.deepcopy(ref).double()
    if not grad:
        ref.eval(), ours.eval(), truth.eval()
    x = torch.randn(n, length, d, dtype=dtype, device="cuda")
    kpm = _padding(n, length).cuda()
    results = []
    for module in (truth, ref, ours):
        xx = x.to(next(module.parameters()).dtype, copy=True).requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            y = module(xx, src_key_padding_mask=kpm)
            if grad:
                y.double().square().sum().backward()
        results.append((y.detach(), xx.grad, [p.grad for p in module.parameters()]))
    exact, theirs, mine = results
    tol = TOL[dtype]
    torch.testing.assert_close(mine[0], theirs[0], rtol=tol, atol=tol)
    if grad:
        pairs = [("x", exact[1], theirs[1], mine[1])]
        names = [name for name, _ in ours.named_parameters()]
        pairs += list(zip(names, exact[2], theirs[2], mine[2]))
        for name, g_exact, g_torch, g_ours in pairs:
            bound = max(tol * max(1.0, g_exact.abs().max().item()), 2 * _grad_error(g_torch, g_exact))
            assert _grad_error(g_ours, g_exact) <= bound, (name, _grad_error(g_ours, g_exact), bound)


@CUDA
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.fresh_process
def test_cuda_converted_layer_forward_peak_below_torch_eager(dtype):
    """Inference, post-norm relu layer: the in-place activation removes one
    (N, L, dim_feedforward) buffer at torch's peak (relu's output beside
    linear1's), and the in-place residual adds / norms keep ours below it.
    """
    n, length, d, h, ff = 8, 1024, 1024, 16, 4096
    item = torch.tensor([], dtype=dtype).element_size()
    removed = n * length * (ff - d) * item  # the relu buffer, less the one extra (N, L, d) we hold there
    peaks = {}
    for name in ("torch", "ours"):
        ref = nn.TransformerEncoderLayer(d, h, ff, batch_first=True, device="cuda", dtype=dtype).eval()
        module = ref if name == "torch" else make_inplace.convert_(ref)
        fast_path = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)  # torch eager, not its fused fast path
        try:
            with torch.no_grad():
                # One-time allocations (cuBLAS workspace) happen before the measurement.
                module(torch.randn(1, 8, d, device="cuda", dtype=dtype))
                fresh_cuda_memory()
                x = torch.randn(n, length, d, device="cuda", dtype=dtype)
                peaks[name] = cuda_peak_extra(lambda: module(x))
        finally:
            torch.backends.mha.set_fastpath_enabled(fast_path)
        del ref, module, x
    assert peaks["torch"].allocated - peaks["ours"].allocated >= removed
    assert peaks["torch"].reserved - peaks["ours"].reserved >= removed


@CUDA
@pytest.mark.parametrize("case, fused", [("no_grad", True), ("grad", False), ("gelu", False), ("no_bias", False)])
def test_cuda_relu_feed_forward_runs_as_one_gemm_where_no_graph_is_recorded(case, fused):
    """linear1 + ReLU take cuBLASLt's bias + ReLU epilogue (one aten op, no relu_)
    only where nothing needs a backward (the fused op has none) and with a bias;
    the output matches torch's eager layer (its fast path fuses gelu as the tanh
    approximation, so it is off for the comparison)."""
    torch.manual_seed(7)
    kw = {"activation": "gelu"} if case == "gelu" else {"bias": False} if case == "no_bias" else {}
    ref, ours = _pair(64, 4, 256, dtype=torch.float32, device="cuda", dropout=0.0, **kw)
    ref.eval(), ours.eval()
    x = torch.randn(3, 17, 64, device="cuda")
    with torch.set_grad_enabled(case == "grad"):
        xx = x.clone().requires_grad_(case == "grad")
        with DispatchRecorder() as ops:
            y = ours(xx)
    assert ("aten._addmm_activation.default" in ops.seen) == fused, ops.seen
    assert ("aten.relu_.default" in ops.seen) == (not fused and case != "gelu"), ops.seen
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            expected = ref(x)
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
    torch.testing.assert_close(y.detach(), expected, rtol=TOL[torch.float32], atol=TOL[torch.float32])


@CUDA
def test_cuda_feed_forward_under_autocast_is_not_fused():
    """Autocast casts linear1's operands; the fused op is not on its list, so the
    feed-forward keeps F.linear there (the block alone: the attention's in-place
    out-projection does not take autocast's mixed dtypes)."""
    _, ours = _pair(64, 4, 256, dtype=torch.float32, device="cuda", dropout=0.0)
    ours.eval()
    x = torch.randn(3, 17, 64, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        with DispatchRecorder() as ops:
            y = ours._ff_block(x)
        expected = ours.linear2(torch.relu(ours.linear1(x)))
    assert "aten._addmm_activation.default" not in ops.seen and "aten.relu_.default" in ops.seen, ops.seen
    assert y.dtype == torch.float16
    torch.testing.assert_close(y, expected, rtol=TOL[torch.float16], atol=TOL[torch.float16])


@pytest.mark.parametrize("device, amp", [("cpu", torch.bfloat16), ("cpu", torch.float16), pytest.param("cuda", torch.float16, marks=CUDA)])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("src_dtype", ["float32", "amp"])
@pytest.mark.parametrize("grad", [False, True])
def test_autocast_matches_torch_eager(device, amp, norm_first, src_dtype, grad):
    """Under torch.autocast: torch's eager layer's output dtype and values (its
    fast path off: on the CPU it would take it under autocast) and src untouched.
    Gradients, where a graph is recorded, against the layer in float64 without
    autocast: within the tolerance or twice torch's own error (as in
    test_cuda_matches_torch).

    The gradient runs use gelu: with ReLU, a feed-forward pre-activation
    within an ulp of zero can take the other side of the kink in either 16-bit
    layer (their roundings differ), and one flipped mask entry moves the
    gradients by O(1) (docs/semantics.md)."""
    torch.manual_seed(6)
    activation = "gelu" if grad else "relu"
    ref, ours = _pair(64, 4, 128, dtype=torch.float32, device=device, dropout=0.0, norm_first=norm_first, activation=activation)
    truth = copy.deepcopy(ref).double()
    if not grad:
        ref.eval(), ours.eval(), truth.eval()
    src = torch.randn(2, 9, 64, device=device, dtype=torch.float32 if src_dtype == "float32" else amp)
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    results = []
    try:
        for module in (truth, ref, ours):
            x = (src.double() if module is truth else src.clone()).requires_grad_(grad)
            with torch.set_grad_enabled(grad), torch.autocast(device, dtype=amp, enabled=module is not truth):
                y = module(x)
            if grad:
                y.double().square().sum().backward()
            assert torch.equal(x.detach().to(src.dtype), src)
            results.append((y.detach(), x.grad, [p.grad for p in module.parameters()]))
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
    exact, (expected, *theirs), (y, *mine) = results
    tol = TOL[amp]
    assert y.dtype == expected.dtype
    torch.testing.assert_close(y, expected, rtol=2 * tol, atol=2 * tol)
    if grad:
        names = ["x"] + [name for name, _ in ours.named_parameters()]
        for name, g_exact, g_torch, g_ours in zip(names, [exact[1], *exact[2]], [theirs[0], *theirs[1]], [mine[0], *mine[1]]):
            bound = max(tol * max(1.0, g_exact.abs().max().item()), 2 * _grad_error(g_torch, g_exact))
            assert _grad_error(g_ours, g_exact) <= bound, (name, _grad_error(g_ours, g_exact), bound)
