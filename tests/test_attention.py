"""InplaceMultiheadAttention against torch.nn.MultiheadAttention(batch_first=True)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import make_inplace
import make_inplace.nn.attention as attention_module
import make_inplace.nn.linear as linear_module
from make_inplace.nn import InplaceMultiheadAttention
from make_inplace._measure import cuda_peak_extra, fresh_cuda_memory

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _pair(e: int, h: int, *, dtype=torch.float64, device="cpu", **kw) -> tuple[nn.MultiheadAttention, InplaceMultiheadAttention]:
    ref = nn.MultiheadAttention(e, h, batch_first=True, device=device, dtype=dtype, **kw)
    with torch.no_grad():  # torch zeroes the biases; make them count
        for name, p in ref.named_parameters():
            if "bias" in name:
                p.normal_()
    ours = InplaceMultiheadAttention(e, h, device=device, dtype=dtype, **kw)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _masks(case: str, n: int, h: int, tgt: int, src: int, dtype, device="cpu"):
    """(key_padding_mask, attn_mask, is_causal); no query row is fully masked."""
    g = torch.Generator().manual_seed(7)
    kpm = attn = None
    is_causal = False
    pad = torch.zeros(n, src, dtype=torch.bool)
    for b in range(n):
        pad[b, src - min(b, src - 1) :] = True  # batch b has its last b keys padded
    if "kpm_bool" in case:
        kpm = pad
    if "kpm_float" in case:
        kpm = torch.randn(n, src, generator=g, dtype=dtype).masked_fill(pad, float("-inf"))
    if "attn2d" in case or "attn3d" in case:
        shape = (tgt, src) if "attn2d" in case else (n * h, tgt, src)
        blocked = torch.rand(shape, generator=g) < 0.3
        blocked[..., 0] = False
        attn = blocked if "bool" in case.split("attn")[1] else torch.randn(shape, generator=g, dtype=dtype).masked_fill(blocked, float("-inf"))
    if "causal" in case:
        attn = torch.ones(tgt, src, dtype=torch.bool).triu(1)
        is_causal = True
    to = lambda m: None if m is None else m.to(device)  # noqa: E731
    return to(kpm), to(attn), is_causal


MASK_CASES = [
    "none",
    "kpm_bool",
    "kpm_float",
    "attn2d_bool",
    "attn2d_float",
    "attn3d_bool",
    "attn3d_float",
    "kpm_bool+attn2d_bool",
    "kpm_float+attn3d_float",
    "causal",
    "causal+kpm_bool",
]
WEIGHT_MODES = [(True, True), (True, False), (False, True)]


def _run(module, q, k, v, kpm, attn, causal, need, avg):
    return module(q, k, v, key_padding_mask=kpm, need_weights=need, attn_mask=attn, average_attn_weights=avg, is_causal=causal)


@pytest.mark.parametrize("case", MASK_CASES)
@pytest.mark.parametrize("need,avg", WEIGHT_MODES)
def test_outputs_and_weights_match_torch(case, need, avg):
    torch.manual_seed(0)
    n, h, e, length = 3, 2, 16, 6
    ref, ours = _pair(e, h)
    x = torch.randn(n, length, e, dtype=torch.float64)
    kpm, attn, causal = _masks(case, n, h, length, length, torch.float64)
    expected = _run(ref, x, x, x, kpm, attn, causal, need, avg)
    x_before = x.clone()
    got = _run(ours, x, x, x, kpm, attn, causal, need, avg)
    torch.testing.assert_close(x, x_before)  # the caller's input is never written
    torch.testing.assert_close(got[0], expected[0], rtol=1e-10, atol=1e-10)
    if need:
        torch.testing.assert_close(got[1], expected[1], rtol=1e-10, atol=1e-10)
    else:
        assert got[1] is None


@pytest.mark.parametrize("case", ["none", "kpm_bool+attn2d_bool", "kpm_float", "causal+kpm_bool"])
@pytest.mark.parametrize("need", [True, False])
def test_inference_mode_matches_torch_fast_path(case, need):
    """eval + no_grad: torch takes its native fast path for bool masks; we run in place."""
    torch.manual_seed(1)
    n, h, e, length = 3, 4, 16, 7
    ref, ours = _pair(e, h, dtype=torch.float32)
    ref.eval(), ours.eval()
    x = torch.randn(n, length, e)
    kpm, attn, causal = _masks(case, n, h, length, length, torch.float32)
    with torch.no_grad():
        expected = _run(ref, x, x, x, kpm, attn, causal, need, True)
        got = _run(ours, x, x, x, kpm, attn, causal, need, True)
    torch.testing.assert_close(got[0], expected[0], rtol=2e-5, atol=2e-5)
    if need:
        torch.testing.assert_close(got[1], expected[1], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", MASK_CASES)
def test_cpu_inference_weights_take_the_fused_projection(case, dtype):
    """No graph on CPU: torch's fused bias/scale/head-layout op feeds the scores,
    and the products reuse q's and k's memory; outputs and per-head weights
    match a float64 torch reference."""
    torch.manual_seed(2)
    n, h, e, length = 3, 4, 32, 9  # head_dim 8: q's scale 1/sqrt(8) is not a power of two
    ref, _ = _pair(e, h)
    ours = InplaceMultiheadAttention(e, h, dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(n, length, e, dtype=dtype)
    kpm, attn, causal = _masks(case, n, h, length, length, dtype)
    widen = lambda m: m if m is None or m.dtype == torch.bool else m.double()  # noqa: E731
    expected = _run(ref, x.double(), x.double(), x.double(), widen(kpm), widen(attn), causal, True, False)
    with torch.no_grad(), torch.profiler.profile() as prof:
        got = _run(ours, x, x, x, kpm, attn, causal, True, False)
    assert "aten::_transform_bias_rescale_qkv" in {ev.name for ev in prof.events()}
    tol = TOL[dtype]
    torch.testing.assert_close(got[0].double(), expected[0], rtol=tol, atol=tol)
    torch.testing.assert_close(got[1].double(), expected[1], rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["key_is_value", "separate", "kdim_vdim"])
@pytest.mark.parametrize("need", [True, False])
def test_cross_attention(kind, need):
    torch.manual_seed(2)
    n, h, e, tgt, src = 2, 2, 12, 5, 9
    kw = {"kdim": 7, "vdim": 10} if kind == "kdim_vdim" else {}
    ref, ours = _pair(e, h, **kw)
    assert list(ours.state_dict()) == list(ref.state_dict())
    q = torch.randn(n, tgt, e, dtype=torch.float64)
    k = torch.randn(n, src, kw.get("kdim", e), dtype=torch.float64)
    v = k if kind == "key_is_value" else torch.randn(n, src, kw.get("vdim", e), dtype=torch.float64)
    kpm, attn, _ = _masks("kpm_float+attn2d_float", n, h, tgt, src, torch.float64)
    expected = _run(ref, q, k, v, kpm, attn, False, need, False)
    got = _run(ours, q, k, v, kpm, attn, False, need, False)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-10, atol=1e-10)
    if need:
        torch.testing.assert_close(got[1], expected[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("need", [True, False])
def test_unbatched_and_no_bias(need):
    torch.manual_seed(3)
    ref, ours = _pair(8, 2, bias=False)
    x = torch.randn(5, 8, dtype=torch.float64)
    kpm = torch.tensor([False, False, False, True, True])
    expected = ref(x, x, x, key_padding_mask=kpm, need_weights=need)
    got = ours(x, x, x, key_padding_mask=kpm, need_weights=need)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-10, atol=1e-10)
    if need:
        torch.testing.assert_close(got[1], expected[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", ["none", "kpm_bool+attn2d_bool", "attn3d_float", "causal"])
@pytest.mark.parametrize("need", [True, False])
def test_gradients_match_torch(case, need):
    torch.manual_seed(4)
    n, h, e, tgt, src = 2, 2, 8, 4, 6
    ref, ours = _pair(e, h)
    q = torch.randn(n, tgt, e, dtype=torch.float64)
    kv = torch.randn(n, src, e, dtype=torch.float64)
    if case == "causal":
        kv = q  # causal self-attention
        src = tgt
    kpm, attn, causal = _masks(case, n, h, tgt, src, torch.float64)
    grads = []
    for module in (ref, ours):
        module.zero_grad()
        qq = q.clone().requires_grad_()
        kk = qq if case == "causal" else kv.clone().requires_grad_()
        out, w = _run(module, qq, kk, kk, kpm, attn, causal, need, True)
        loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum()
        if w is not None:
            loss = loss + (w * w).sum()
        loss.backward()
        grads.append([qq.grad, kk.grad] + [p.grad for p in module.parameters()])
    for g_ours, g_ref in zip(grads[1], grads[0]):
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-9, atol=1e-10)


def test_gradcheck_materialized_core_float64():
    torch.manual_seed(5)
    _, ours = _pair(4, 2)
    ours.requires_grad_(False)
    x = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    kpm = torch.tensor([[False, False, True]])
    fn = lambda t: ours(t, t, t, key_padding_mask=kpm, need_weights=True, average_attn_weights=False)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))


@pytest.mark.parametrize("need", [True, False])
def test_dropout_in_training_matches_torch_with_the_same_seed(need):
    ref, ours = _pair(16, 2, dropout=0.5)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    torch.manual_seed(9)
    expected = ref(x, x, x, need_weights=need, average_attn_weights=False)
    for grad in (True, False):
        torch.manual_seed(9)
        with torch.set_grad_enabled(grad):
            got = ours(x, x, x, need_weights=need, average_attn_weights=False)
        torch.testing.assert_close(got[0], expected[0], rtol=1e-10, atol=1e-10)
        if need:
            torch.testing.assert_close(got[1], expected[1], rtol=1e-10, atol=1e-10)
    ours.eval(), ref.eval()
    torch.testing.assert_close(ours(x, x, x)[0], ref(x, x, x)[0], rtol=1e-10, atol=1e-10)


def _count_calls(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args[0].data_ptr())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_in_place_ops_are_used_where_autograd_allows(monkeypatch):
    softmax_calls = _count_calls(monkeypatch, attention_module, "softmax_")
    matmul_calls = _count_calls(monkeypatch, linear_module, "square_matmul_")
    _, ours = _pair(8, 2)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        ours(x, x, x, need_weights=True)
    assert len(softmax_calls) == 1 and len(matmul_calls) == 1
    with torch.no_grad():
        ours(x, x, x, need_weights=False)  # SDPA core: no scores, projection still in place
    assert len(softmax_calls) == 1 and len(matmul_calls) == 2
    ours.core = "materialized"
    with torch.no_grad():
        assert ours(x, x, x, need_weights=False)[1] is None
    assert len(softmax_calls) == 2 and len(matmul_calls) == 3
    # Training the projection weight: out of place (dW needs its input).
    ours(x, x, x, need_weights=True)[0].sum().backward()
    assert len(softmax_calls) == 3 and len(matmul_calls) == 3
    # Frozen projection, inputs requiring grad: the materialized core's buffer is ours to overwrite.
    ours.out_proj.requires_grad_(False)
    ours(x, x, x.clone().requires_grad_(), need_weights=True)[0].sum().backward()
    assert len(matmul_calls) == 4


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_strided_batched_products_match_matmul(device):
    """The no-copy products the CUDA inference path uses, checked on every device."""
    n, length, h, d = 3, 5, 2, 4
    proj = torch.randn(n, length, 3, h, d, dtype=torch.float64, device=device)
    q, k, v = (t.transpose(1, 2) for t in proj.unbind(2))
    scores = attention_module._batched_matmul(q, k.transpose(-2, -1), True)
    torch.testing.assert_close(scores, torch.matmul(q, k.transpose(-2, -1)), rtol=1e-12, atol=1e-12)
    probs = scores.softmax(-1)
    got = attention_module._weighted_values(probs, v, True)
    expected = attention_module._weighted_values(probs, v, False)
    assert got.shape == (n, length, h * d) and got.is_contiguous()
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_from_torch_shares_parameters_and_mode():
    ref = nn.MultiheadAttention(8, 2, batch_first=True, dropout=0.1).eval()
    ours = InplaceMultiheadAttention.from_torch(ref)
    assert not ours.training and ours.dropout == 0.1
    assert ours.in_proj_weight is ref.in_proj_weight and ours.out_proj.weight is ref.out_proj.weight
    assert list(ours.state_dict()) == list(ref.state_dict())
    separate = nn.MultiheadAttention(8, 2, batch_first=True, kdim=3, vdim=5)
    ours2 = InplaceMultiheadAttention.from_torch(separate)
    assert ours2.k_proj_weight is separate.k_proj_weight and ours2.in_proj_weight is None


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"batch_first": False}, "batch_first"),
        ({"add_bias_kv": True}, "add_bias_kv"),
        ({"add_zero_attn": True}, "add_zero_attn"),
        ({"core": "flash"}, "core"),
    ],
)
def test_refused_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InplaceMultiheadAttention(8, 2, **kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"attn_mask": torch.zeros(4, 5)}, "attn_mask"),
        ({"attn_mask": torch.zeros(3, 5, 5)}, "attn_mask"),
        ({"attn_mask": torch.zeros(5, 5, dtype=torch.int64)}, "attn_mask"),
        ({"key_padding_mask": torch.zeros(2, 4, dtype=torch.bool)}, "key_padding_mask"),
    ],
)
def test_bad_masks_are_refused(kwargs, match):
    _, ours = _pair(8, 2)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    before = x.clone()
    with pytest.raises((ValueError, TypeError), match=match):
        ours(x, x, x, **kwargs)
    torch.testing.assert_close(x, before)


def test_exported():
    assert make_inplace.nn.InplaceMultiheadAttention is InplaceMultiheadAttention
    assert isinstance(InplaceMultiheadAttention(8, 2), nn.MultiheadAttention)


# ---------------------------------------------------------------- CUDA


@CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", ["none", "kpm_bool+attn2d_bool", "attn3d_float", "causal"])
@pytest.mark.parametrize("need", [True, False])
def test_cuda_matches_torch(dtype, case, need):
    torch.manual_seed(10)
    n, h, e, length = 2, 4, 64, 33
    ref, ours = _pair(e, h, dtype=dtype, device="cuda")
    x = torch.randn(n, length, e, dtype=dtype, device="cuda")
    kpm, attn, causal = _masks(case, n, h, length, length, dtype, device="cuda")
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            expected = _run(ref, x, x, x, kpm, attn, causal, need, False)
            got = _run(ours, x, x, x, kpm, attn, causal, need, False)
        tol = TOL[dtype] * (4 if dtype != torch.float32 else 1)
        torch.testing.assert_close(got[0], expected[0], rtol=tol, atol=tol)
        if need:
            torch.testing.assert_close(got[1], expected[1], rtol=tol, atol=tol)


@CUDA
@pytest.mark.fresh_process
def test_cuda_weights_use_one_scores_buffer_where_torch_uses_two():
    """need_weights=True: torch holds scores and probabilities; we hold one buffer."""
    n, h, e, length, dtype = 4, 16, 1024, 1024, torch.float16
    scores_bytes = n * h * length * length * 2
    peaks = {}
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # torch eager, the comparison the memory budget makes
    try:
        for name in ("torch", "ours"):
            ref, ours = _pair(e, h, dtype=dtype, device="cuda")
            module = (ref if name == "torch" else ours).eval()
            with torch.no_grad():
                small = torch.randn(1, 8, e, dtype=dtype, device="cuda")
                module(small, small, small)  # one-time allocations (cuBLAS workspace) first
                del small
                fresh_cuda_memory()
                x = torch.randn(n, length, e, dtype=dtype, device="cuda")
                peaks[name] = cuda_peak_extra(lambda: module(x, x, x, need_weights=True, average_attn_weights=False))
            del ref, ours, module, x
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
    # Both end holding the output and the per-head weights. At torch's peak it
    # also holds the scores beside the probabilities; at ours we hold the
    # packed projection (which torch may have freed) and the attention output
    # being written: one (N, L, E) buffer more than torch at most.
    small = n * length * e * 2
    assert peaks["torch"].allocated - peaks["ours"].allocated >= scores_bytes - small
    assert peaks["torch"].reserved - peaks["ours"].reserved >= scores_bytes - small


@pytest.mark.parametrize("device, amp", [("cpu", torch.bfloat16), pytest.param("cuda", torch.float16, marks=CUDA)])
@pytest.mark.parametrize("need", [True, False])
@pytest.mark.parametrize("src_dtype", ["float32", "amp"])
def test_autocast_matches_torch(device, amp, need, src_dtype):
    """Under torch.autocast the in-place out-projection takes the autocast dtype
    (its weight cast as autocast casts nn.Linear's); outputs match torch's layer
    (fast path off, which autocast on the CPU would otherwise take) in dtype and value."""
    torch.manual_seed(5)
    ref = nn.MultiheadAttention(64, 4, batch_first=True, device=device).eval()
    ours = InplaceMultiheadAttention.from_torch(ref)
    x = torch.randn(2, 9, 64, device=device, dtype=torch.float32 if src_dtype == "float32" else amp)
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), torch.autocast(device, dtype=amp):
            expected, expected_w = ref(x, x, x, need_weights=need)
            y, w = ours(x, x, x, need_weights=need)
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
    assert y.dtype == expected.dtype
    torch.testing.assert_close(y, expected, rtol=TOL[amp], atol=TOL[amp])
    if need:
        torch.testing.assert_close(w, expected_w, rtol=TOL[amp], atol=TOL[amp])
