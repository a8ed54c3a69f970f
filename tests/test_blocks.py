"""residual_mlp_ / residual_attention_: the in-place residual blocks against float64 references."""

from __future__ import annotations

import math

import pytest
import torch

from make_inplace.blocks import Norm, residual_attention_, residual_mlp_
from make_inplace._measure import cpu_peak_extra
from make_inplace.blocks.panels import (AttentionPlan, FlashSplitKV, attention_plan, balanced_rows, flash_split_kv_bytes,
                                       mlp_panel_rows)

from conftest import DEVICES, DispatchRecorder

# Compared with a float64 reference; the in-place path rounds in the input dtype.
TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-4, 1e-4), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 3e-2)}


def _close(got: torch.Tensor, expected64: torch.Tensor, dtype: torch.dtype) -> None:
    rtol, atol = TOL[dtype]
    scale = expected64.abs().max().item()
    torch.testing.assert_close(got.double(), expected64, rtol=rtol, atol=atol * max(1.0, scale))


# -- references, written out in float64 -------------------------------------------------------


def _act64(t, name):
    if name == "gelu":
        return 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * t * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t**3)))
    if name == "relu":
        return t.clamp_min(0)
    return t * torch.sigmoid(t)


def _norm64(t, norm: Norm | None):
    if norm is None:
        return t
    eps = norm.eps if norm.eps is not None else torch.finfo(norm.weight.dtype if norm.weight is not None else torch.float32).eps
    if norm.kind == "layer":
        out = (t - t.mean(-1, keepdim=True)) / torch.sqrt(t.var(-1, unbiased=False, keepdim=True) + eps)
    else:
        out = t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + eps)
    if norm.weight is not None:
        out = out * norm.weight.double()
    if norm.bias is not None:
        out = out + norm.bias.double()
    return out


def _lin64(t, w, b, layout):
    w = w.double()
    out = t @ (w.T if layout == "linear" else w)
    return out + b.double() if b is not None else out


def _mlp64(x, w1, w2, b1, b2, act, wg, bg, norm, post_norm, layout):
    x = x.double()
    h = _norm64(x, norm)
    t = _act64(_lin64(h, wg if wg is not None else w1, bg if wg is not None else b1, layout), act)
    if wg is not None:
        t = t * _lin64(h, w1, b1, layout)
    return _norm64(x + _lin64(t, w2, b2, layout), post_norm)


def _rope64(t, cos, sin):  # t (B, S, H, hd); cos/sin (1|B, S, hd)
    cos, sin = cos.double().unsqueeze(2), sin.double().unsqueeze(2)
    half = t.shape[-1] // 2
    return t * cos + torch.cat((-t[..., half:], t[..., :half]), -1) * sin


def _attention64(x, ws, bs, heads, kv_heads, norm, post_norm, causal, mask, rotary, scale, layout, past=None):
    """Materialized scores in float64. past: (k, v) of earlier tokens, (B, Hkv, P, hd), already rotated."""
    x = x.double()
    B, S, d = x.shape
    h = _norm64(x, norm)
    q = _lin64(h, ws[0], bs[0], layout).view(B, S, heads, -1)
    hd = q.shape[-1]
    k = _lin64(h, ws[1], bs[1], layout).view(B, S, kv_heads, hd)
    v = _lin64(h, ws[2], bs[2], layout).view(B, S, kv_heads, hd)
    if rotary is not None:
        q, k = _rope64(q, *rotary), _rope64(k, *rotary)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if past is not None:
        k, v = torch.cat((past[0].double(), k), 2), torch.cat((past[1].double(), v), 2)
    rep = heads // kv_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = (q @ k.transpose(-1, -2)) * (scale if scale is not None else hd**-0.5)
    L = k.shape[2]
    if causal:
        allowed = torch.arange(L)[None, :] <= (torch.arange(S)[:, None] + L - S)
        scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
    o = torch.softmax(scores, -1) @ v
    y = x + _lin64(o.transpose(1, 2).reshape(B, S, -1), ws[3], bs[3], layout)
    return _norm64(y, post_norm)


# -- inputs -------------------------------------------------------------------------------------


def _w(shape, dtype, device, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale / math.sqrt(shape[-1])).to(device, dtype)


def _norm(kind, d, dtype, device, gen, bias=True):
    if kind is None:
        return None
    w = (1 + 0.1 * torch.randn(d, generator=gen, dtype=torch.float64)).to(device, dtype)
    if kind == "rms":
        return Norm.rms(w, eps=1e-6)
    b = (0.1 * torch.randn(d, generator=gen, dtype=torch.float64)).to(device, dtype) if bias else None
    return Norm.layer(w, b, eps=1e-5)


def _mlp_case(shape, inner, dtype, device, *, gated, bias, layout, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype)
    lw = (lambda i, o: (o, i)) if layout == "linear" else (lambda i, o: (i, o))
    w1 = _w(lw(d, inner), dtype, device, gen)
    w2 = _w(lw(inner, d), dtype, device, gen)
    b1 = _w((inner,), dtype, device, gen) if bias else None
    b2 = _w((d,), dtype, device, gen) if bias else None
    wg = _w(lw(d, inner), dtype, device, gen) if gated else None
    bg = _w((inner,), dtype, device, gen) if gated and bias else None
    return x, w1, w2, b1, b2, wg, bg


# -- residual_mlp_ ------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "silu"])
@pytest.mark.parametrize("gated", [False, True])
def test_mlp_activations_and_gating(device, dtype, activation, gated):
    x, w1, w2, b1, b2, wg, bg = _mlp_case((3, 7, 16), 40, dtype, device, gated=gated, bias=True, layout="linear")
    gen = torch.Generator().manual_seed(1)
    norm = _norm("layer", 16, dtype, device, gen)
    expected = _mlp64(x, w1, w2, b1, b2, activation, wg, bg, norm, None, "linear")
    with torch.no_grad():
        y = residual_mlp_(x, w1, w2, b1, b2, activation=activation, gate_weight=wg, gate_bias=bg, norm=norm)
    assert y is x
    _close(x, expected, dtype)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout", ["linear", "conv1d"])
@pytest.mark.parametrize("activation, bias, gated", [
    ("gelu_tanh", True, False), ("relu", True, False),  # fused
    ("gelu", True, False), ("gelu_tanh", False, False), ("relu", True, True),  # not: exact gelu, no bias, gated
])
def test_cuda_mlp_fuses_relu_and_tanh_gelu_into_fc1(dtype, layout, activation, bias, gated):
    """fc1 + activation as one cuBLASLt GEMM with an epilogue where it has one
    (bias, not gated, not float64), the separate in-place activation otherwise;
    both against the float64 block, panels of 33 rows over 3 x 41 rows."""
    x, w1, w2, b1, b2, wg, bg = _mlp_case((3, 41, 64), 256, dtype, "cuda", gated=gated, bias=bias, layout=layout, seed=5)
    norm = _norm("layer", 64, dtype, "cuda", torch.Generator().manual_seed(6))
    expected = _mlp64(x, w1, w2, b1, b2, activation, wg, bg, norm, None, layout)
    row_bytes = x.element_size() * (64 + 256 * (2 if gated else 1))
    with torch.no_grad(), DispatchRecorder() as ops:
        residual_mlp_(x, w1, w2, b1, b2, activation=activation, gate_weight=wg, gate_bias=bg, norm=norm,
                      weight_layout=layout, workspace_bytes=33 * row_bytes)
    fused = bias and not gated and activation != "gelu" and dtype != torch.float64
    assert ops.seen.count("aten._addmm_activation.out") == (4 if fused else 0), ops.seen
    assert not any(op.startswith(("aten.gelu_", "aten.relu_")) for op in ops.seen) == fused, ops.seen
    _close(x, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["linear", "conv1d"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("norms", [(None, None), ("layer", None), ("rms", None), (None, "layer"), ("layer", "rms")])
def test_mlp_layouts_biases_norms(device, layout, bias, norms):
    dtype = torch.float64
    x, w1, w2, b1, b2, wg, bg = _mlp_case((2, 9, 24), 56, dtype, device, gated=False, bias=bias, layout=layout, seed=3)
    gen = torch.Generator().manual_seed(4)
    norm, post_norm = (_norm(k, 24, dtype, device, gen, bias=bias) for k in norms)
    expected = _mlp64(x, w1, w2, b1, b2, "gelu", None, None, norm, post_norm, layout)
    residual_mlp_(x, w1, w2, b1, b2, norm=norm, post_norm=post_norm, weight_layout=layout)
    _close(x, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows_per_panel", [1, 2, 5, 17, 1000])
@pytest.mark.parametrize("shape", [(37, 16), (3, 13, 16), (2, 2, 3, 16)])
def test_mlp_panel_sizes(device, rows_per_panel, shape):
    """From one-row panels to one panel; row counts that leave a short last panel."""
    dtype = torch.float32
    x, w1, w2, b1, b2, wg, bg = _mlp_case(shape, 48, dtype, device, gated=True, bias=True, layout="linear", seed=5)
    gen = torch.Generator().manual_seed(6)
    norm = _norm("rms", 16, dtype, device, gen)
    expected = _mlp64(x, w1, w2, b1, b2, "silu", wg, bg, norm, None, "linear")
    row_bytes = 4 * (16 + 2 * 48)
    residual_mlp_(x, w1, w2, b1, b2, activation="silu", gate_weight=wg, gate_bias=bg, norm=norm,
                  workspace_bytes=rows_per_panel * row_bytes + row_bytes // 2)
    _close(x, expected, dtype)


def test_mlp_grad_mode_computes_out_of_place_with_exact_gradients():
    dtype = torch.float64
    x0, w1, w2, b1, b2, wg, bg = _mlp_case((2, 5, 16), 32, dtype, "cpu", gated=True, bias=True, layout="linear", seed=7)
    gen = torch.Generator().manual_seed(8)
    norm = _norm("layer", 16, dtype, "cpu", gen)
    for t in (w1, b1, w2):
        t.requires_grad_(True)
    x = x0.clone().requires_grad_(True)
    before = x.detach().clone()
    y = residual_mlp_(x, w1, w2, b1, b2, activation="gelu", gate_weight=wg, gate_bias=bg, norm=norm)
    assert y is not x and torch.equal(x.detach(), before)
    _close(y, _mlp64(x0, w1.detach(), w2.detach(), b1.detach(), b2, "gelu", wg, bg, norm, None, "linear"), dtype)
    y.square().sum().backward()
    xr = x0.clone().requires_grad_(True)
    w1r, b1r, w2r = (t.detach().clone().requires_grad_(True) for t in (w1, b1, w2))
    _mlp64(xr, w1r, w2r, b1r, b2, "gelu", wg, bg, norm, None, "linear").square().sum().backward()
    for got, want in ((x.grad, xr.grad), (w1.grad, w1r.grad), (b1.grad, b1r.grad), (w2.grad, w2r.grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_mlp_bumps_the_version_counter():
    x, w1, w2, *_ = _mlp_case((4, 8), 16, torch.float32, "cpu", gated=False, bias=False, layout="linear")
    version = x._version
    with torch.no_grad():
        residual_mlp_(x, w1, w2)
    assert x._version > version


# -- residual_attention_ ------------------------------------------------------------------------


class _ListCache:
    """A KV cache that keeps what it was given and concatenates, as transformers' DynamicCache does."""

    def __init__(self, past=None):
        self.k, self.v = past if past is not None else (None, None)
        self.calls = 0

    def __call__(self, k, v):
        self.calls += 1
        self.k = k if self.k is None else torch.cat((self.k, k), 2)
        self.v = v if self.v is None else torch.cat((self.v, v), 2)
        return self.k, self.v


def _attention_case(B, S, d, heads, kv_heads, dtype, device, *, bias, layout, rotary, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hd = d // heads
    x = torch.randn(B, S, d, generator=gen, dtype=torch.float64).to(device, dtype)
    lw = (lambda i, o: (o, i)) if layout == "linear" else (lambda i, o: (i, o))
    ws = [_w(lw(d, heads * hd), dtype, device, gen, 2.0), _w(lw(d, kv_heads * hd), dtype, device, gen, 2.0),
          _w(lw(d, kv_heads * hd), dtype, device, gen), _w(lw(heads * hd, d), dtype, device, gen)]
    outs = [heads * hd, kv_heads * hd, kv_heads * hd, d]
    bs = [_w((n,), dtype, device, gen) if bias else None for n in outs]
    rot = None
    if rotary:
        pos = torch.arange(S, dtype=torch.float64)[None, :, None] + 3
        freq = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.cat((pos * freq, pos * freq), -1)
        rot = (ang.cos().to(device, dtype), ang.sin().to(device, dtype))
    return x, ws, bs, rot


def _kwargs(ws, bs):
    return dict(zip(("q_weight", "k_weight", "v_weight", "o_weight", "q_bias", "k_bias", "v_bias", "o_bias"), ws + bs))


def _attention_row_bytes(device, dtype, d, heads, head_dim, *, norm=True, rotary=True):
    """One query row's temporaries as residual_attention_ plans them: the normalized row, q, the
    attention output, the rotary scratch, the kernels' log-sum-exp per head; on CPU also the second
    partial output, log-sum-exp and merge weights of a lower-right causal panel."""
    size = torch.empty((), dtype=dtype).element_size()
    lse = 8 if dtype == torch.float64 else 4
    q = heads * head_dim
    elements = (d if norm else 0) + 2 * q + (q if rotary else 0)
    if device == "cuda":
        return elements * size + heads * lse
    return (elements + q) * size + heads * (2 * lse + size)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_heads_rotary_causal(device, dtype, heads, kv_heads, rotary, causal):
    x, ws, bs, rot = _attention_case(3, 11, 32, heads, kv_heads, dtype, device, bias=True, layout="linear", rotary=rotary)
    gen = torch.Generator().manual_seed(2)
    norm = _norm("rms", 32, dtype, device, gen)
    expected = _attention64(x, ws, bs, heads, kv_heads, norm, None, causal, None, rot, None, "linear")
    y = residual_attention_(x, **_kwargs(ws, bs), num_heads=heads, num_kv_heads=kv_heads, norm=norm, causal=causal, rotary=rot)
    assert y is x
    _close(x, expected, dtype)


def _padding_mask(B, S, device, lengths):
    keep = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
    return keep[:, None, None, :].expand(B, 1, S, S).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["linear", "conv1d"])
@pytest.mark.parametrize("norms", [("layer", None), (None, "layer")])
@pytest.mark.parametrize("mask_kind", ["bool", "float", "per_query"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2)])
def test_attention_masks_norms_layouts(device, layout, norms, mask_kind, heads, kv_heads):
    dtype = torch.float64
    B, S, d = 3, 10, 32
    x, ws, bs, _ = _attention_case(B, S, d, heads, kv_heads, dtype, device, bias=norms[1] is None, layout=layout, rotary=False, seed=4)
    gen = torch.Generator().manual_seed(5)
    norm, post_norm = (_norm(k, d, dtype, device, gen) for k in norms)
    keep = _padding_mask(B, S, device, [10, 6, 3])
    if mask_kind == "bool":
        mask = keep
    elif mask_kind == "float":
        mask = torch.zeros(B, 1, S, S, dtype=dtype, device=device).masked_fill(~keep, -1e9)
        mask = mask + 0.3 * torch.randn(B, 1, S, S, generator=gen, dtype=torch.float64).to(device)
    else:  # one row per query, per head: a causal-with-padding pattern
        causal = torch.ones(S, S, dtype=torch.bool, device=device).tril()
        mask = (keep & causal).expand(B, heads, S, S).contiguous()
    expected = _attention64(x, ws, bs, heads, kv_heads, norm, post_norm, False,
                            mask if mask.dtype == torch.bool else mask, None, None, layout)
    residual_attention_(x, **_kwargs(ws, bs), num_heads=heads, num_kv_heads=kv_heads, norm=norm, post_norm=post_norm,
                        attn_mask=mask, weight_layout=layout)
    _close(x, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [1, 3, 4, 7, 13, 40, None])
@pytest.mark.parametrize("mask", [False, True])
def test_attention_panel_sizes_and_groups(device, rows, mask):
    """Query panels of 1 row to whole groups of sequences; awkward counts leave short panels."""
    dtype, B, S, d, heads, kv_heads = torch.float64, 4, 13, 32, 4, 2
    x, ws, bs, rot = _attention_case(B, S, d, heads, kv_heads, dtype, device, bias=True, layout="linear", rotary=True, seed=6)
    gen = torch.Generator().manual_seed(7)
    norm = _norm("layer", d, dtype, device, gen)
    m = _padding_mask(B, S, device, [13, 9, 1, 5]) & torch.ones(S, S, dtype=torch.bool, device=device).tril() if mask else None
    expected = _attention64(x, ws, bs, heads, kv_heads, norm, None, not mask, m, rot, 0.3, "linear")
    size = 8
    per_row = _attention_row_bytes(device, dtype, d, heads, 32 // heads)
    per_seq = (2 * S * 16 + (2 * S * 32 if mask else 0)) * size
    ws_bytes = None if rows is None else per_seq + rows * per_row
    residual_attention_(x, **_kwargs(ws, bs), num_heads=heads, num_kv_heads=kv_heads, norm=norm, causal=not mask,
                        attn_mask=m, rotary=rot, scale=0.3, workspace_bytes=ws_bytes)
    _close(x, expected, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("past_len", [0, 5])
@pytest.mark.parametrize("rows", [1, 4, None])
@pytest.mark.parametrize("S", [1, 6])
def test_attention_with_cache_causal_offsets(device, past_len, rows, S):
    """Keys and values go to the cache; queries sit after the past ones (lower-right causal)."""
    dtype, B, d, heads, kv_heads = torch.float64, 2, 32, 4, 2
    x, ws, bs, rot = _attention_case(B, S, d, heads, kv_heads, dtype, device, bias=False, layout="linear", rotary=True, seed=8)
    gen = torch.Generator().manual_seed(9)
    past = None
    if past_len:
        past = tuple(torch.randn(B, kv_heads, past_len, 8, generator=gen, dtype=torch.float64).to(device) for _ in range(2))
    norm = _norm("rms", d, dtype, device, gen)
    expected = _attention64(x, ws, bs, heads, kv_heads, norm, None, True, None, rot, None, "linear", past=past)
    cache = _ListCache(past)
    per_row = _attention_row_bytes(device, dtype, d, heads, 8)
    residual_attention_(x, **_kwargs(ws, bs), num_heads=heads, num_kv_heads=kv_heads, norm=norm, causal=True,
                        rotary=rot, kv_update=cache, workspace_bytes=None if rows is None else rows * per_row)
    _close(x, expected, dtype)
    assert cache.calls == 1 and cache.k.shape == (B, kv_heads, past_len + S, 8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", [None, "layer"])
def test_biased_projections_add_whole_rows_over_spent_buffers(device, norm):
    """On CUDA, with a bias, the out-projection and a pre-norm fc2 run as a GEMM
    with the bias (into the panel's spent queries / normalized rows) and one
    add of equal shapes: no accumulating GEMM, no broadcast bias add. A
    post-norm MLP (no spent rows), and the CPU, keep the accumulating GEMM.
    Results vs float64."""
    dtype, gen = torch.float32, torch.Generator().manual_seed(8)
    x, ws, bs, _ = _attention_case(2, 9, 16, 4, 4, dtype, device, bias=True, layout="linear", rotary=False, seed=7)
    n = _norm(norm, 16, dtype, device, gen)
    expected = _attention64(x, ws, bs, 4, 4, n, None, False, None, None, None, "linear")
    with torch.no_grad(), DispatchRecorder() as ops:
        residual_attention_(x, **_kwargs(ws, bs), num_heads=4, norm=n)
    _close(x, expected, dtype)
    cuda = device == "cuda"
    assert ("aten.addmm_.default" in ops.seen) != cuda, ops.seen
    x, w1, w2, b1, b2, _, _ = _mlp_case((2, 9, 16), 40, dtype, device, gated=False, bias=True, layout="linear", seed=9)
    expected = _mlp64(x, w1, w2, b1, b2, "gelu", None, None, n, None, "linear")
    with torch.no_grad(), DispatchRecorder() as ops:
        residual_mlp_(x, w1, w2, b1, b2, norm=n)
    _close(x, expected, dtype)
    assert ("aten.addmm_.default" in ops.seen) == (norm is None or not cuda), ops.seen


def test_attention_grad_mode_out_of_place_exact_gradients():
    dtype = torch.float64
    x0, ws, bs, rot = _attention_case(2, 5, 16, 4, 2, dtype, "cpu", bias=True, layout="conv1d", rotary=True, seed=10)
    ws[0].requires_grad_(True)
    x = x0.clone().requires_grad_(True)
    y = residual_attention_(x, **_kwargs(ws, bs), num_heads=4, num_kv_heads=2, causal=True, rotary=rot, weight_layout="conv1d")
    assert y is not x and torch.equal(x.detach(), x0)
    y.square().sum().backward()
    xr, wr = x0.clone().requires_grad_(True), ws[0].detach().clone().requires_grad_(True)
    _attention64(xr, [wr] + ws[1:], bs, 4, 2, None, None, True, None, rot, None, "conv1d").square().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ws[0].grad, wr.grad, rtol=1e-9, atol=1e-10)


# -- errors: named, and x unchanged ---------------------------------------------------------------


def _mlp_args():
    x, w1, w2, b1, b2, *_ = _mlp_case((2, 3, 8), 16, torch.float32, "cpu", gated=False, bias=True, layout="linear")
    return x, w1, w2, b1, b2


@pytest.mark.parametrize(
    "change,error,match",
    [
        (lambda a, k: (a[0].double(), *a[1:]), TypeError, "x has dtype torch.float64 but fc1_weight"),
        (lambda a, k: (a[0].to("meta"), *a[1:]), ValueError, "x is on meta but fc1_weight is on cpu"),
        (lambda a, k: (a[0].to(torch.int32), *a[1:]), TypeError, "x must be float16"),
        (lambda a, k: (a[0].transpose(0, 1), *a[1:]), ValueError, "x must be contiguous"),
        (lambda a, k: k.update(workspace_bytes=63) or a, ValueError, "workspace_bytes=63 is below one row.s workspace \\(64 bytes\\)"),
        (lambda a, k: k.update(activation="tanh") or a, ValueError, "activation must be one of"),
        (lambda a, k: k.update(weight_layout="rows") or a, ValueError, "weight_layout"),
        (lambda a, k: (a[0], a[1][:, :5], *a[2:]), ValueError, "fc1_weight must have shape"),
        (lambda a, k: (a[0], a[1], a[2], a[3], a[0].view(-1)[:8]), ValueError, "fc2_bias shares memory with x"),
        (lambda a, k: k.update(norm=Norm.rms(torch.ones(8), eps=-1.0)) or a, ValueError, "norm.eps"),
    ],
)
def test_mlp_errors_leave_x_unchanged(change, error, match):
    args = _mlp_args()
    kwargs: dict = {}
    args = change(args, kwargs)
    x = args[0]
    before = x.clone() if x.device.type != "meta" else None
    with pytest.raises(error, match=match):
        residual_mlp_(*args, **kwargs)
    if before is not None and x.dtype.is_floating_point:
        assert torch.equal(x, before)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"workspace_bytes": 10}, ValueError, "workspace_bytes=10 is below one query row"),
        ({"num_heads": 3}, ValueError, "not a multiple of num_heads"),
        ({"num_kv_heads": 3}, ValueError, "num_kv_heads must be a positive int dividing"),
        ({"causal": True, "attn_mask": torch.ones(1, 1, 1, 5, dtype=torch.bool)}, ValueError, "not both"),
        ({"attn_mask": torch.ones(1, 1, 1, 4, dtype=torch.bool)}, ValueError, "last dimension must be seq_len=5"),
        ({"rotary": (torch.ones(1, 5, 3), torch.ones(1, 5, 3))}, ValueError, "rotary cos must have shape"),
        ({"kv_update": lambda k, v: (k[:, :, :1], v)}, ValueError, "kv_update must return"),
    ],
)
def test_attention_errors_leave_x_unchanged(kwargs, error, match):
    x, ws, bs, _ = _attention_case(2, 5, 16, 4, 4, torch.float32, "cpu", bias=False, layout="linear", rotary=False)
    before = x.clone()
    args = {"num_heads": 4, **_kwargs(ws, bs), **kwargs}
    with pytest.raises(error, match=match):
        residual_attention_(x, **args)
    assert torch.equal(x, before)


def test_attention_wrong_device_and_dtype_of_x():
    x, ws, bs, _ = _attention_case(2, 5, 16, 4, 4, torch.float32, "cpu", bias=False, layout="linear", rotary=False)
    with pytest.raises(TypeError, match="residual_attention_: x has dtype torch.float16 but q_weight"):
        residual_attention_(x.half(), **_kwargs(ws, bs), num_heads=4)
    with pytest.raises(ValueError, match="residual_attention_: x is on meta but q_weight is on cpu"):
        residual_attention_(x.to("meta"), **_kwargs(ws, bs), num_heads=4)
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        residual_attention_(x[0], **_kwargs(ws, bs), num_heads=4)


# -- the plan -------------------------------------------------------------------------------------


def test_plan_rows_and_groups():
    assert balanced_rows(10, 4) == 4 and balanced_rows(9, 4) == 3 and balanced_rows(5, 100) == 5
    assert mlp_panel_rows("f", 100, 10, 10_000, 35) == 3  # 34 panels: 33 of 3 rows and one of 1 would be unbalanced, but 3 is the most that fits
    # Default bound: at least 8192 rows' worth even for a small x, never more than all rows.
    assert mlp_panel_rows("f", 100_000, 10, 1000, None) == balanced_rows(100_000, 8192)
    plan = attention_plan("f", batch=8, seq_len=100, per_sequence_bytes=1000, per_row_bytes=10, x_bytes=0, workspace_bytes=4500)
    assert plan == AttentionPlan(group=2, q_rows=100, seq_len=100) and not plan.splits_sequences
    plan = attention_plan("f", batch=8, seq_len=100, per_sequence_bytes=1000, per_row_bytes=10, x_bytes=0, workspace_bytes=1500)
    assert plan.group == 1 and plan.q_rows == 50 and plan.splits_sequences
    with pytest.raises(ValueError, match="below one query row"):
        attention_plan("f", batch=8, seq_len=100, per_sequence_bytes=1000, per_row_bytes=10, x_bytes=0, workspace_bytes=1009)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("past_len", [0, 7])
def test_attention_split_sequences_half_precision(device, kv_heads, past_len):
    """Query panels inside a sequence in bf16: on CUDA the lower-right causal bias runs the flash kernel."""
    dtype, B, S, d, heads = torch.bfloat16, 2, 24, 64, 4
    x, ws, bs, rot = _attention_case(B, S, d, heads, kv_heads, dtype, device, bias=False, layout="linear", rotary=True, seed=11)
    gen = torch.Generator().manual_seed(12)
    hd = d // heads
    past = None
    if past_len:
        past = tuple(torch.randn(B, kv_heads, past_len, hd, generator=gen, dtype=torch.float64).to(device, dtype) for _ in range(2))
    expected = _attention64(x, ws, bs, heads, kv_heads, None, None, True, None, rot, None, "linear", past=past)
    per_row = _attention_row_bytes(device, dtype, d, heads, hd, norm=False)
    residual_attention_(x, **_kwargs(ws, bs), num_heads=heads, num_kv_heads=kv_heads, causal=True, rotary=rot,
                        kv_update=_ListCache(past) if past_len else None,
                        workspace_bytes=2 * S * kv_heads * hd * 2 + 5 * per_row)
    _close(x, expected, dtype)


# -- the plan counts what coexists: the attention kernels' own memory ------------------------------


def test_flash_split_kv_scratch_explains_the_h100_peak():
    """FlashAttention-2 splits the keys of a call with few CTAs into float32 partial outputs it allocates.

    test_cuda_attention_stays_within_its_workspace[512] peaked at 6374400 bytes on an H100 (132 SMs)
    against a plan of 3 MiB: K and V of the sequence, the q panel and the attention output (2 MiB),
    the last panel's split-KV accumulators (8 heads x 512 rows x 8 blocks of 64 = 64 CTAs: 4 splits),
    its log-sum-exp and two 512-byte RNG-state blocks.
    """
    scratch = flash_split_kv_bytes(batch=1, heads=8, kv_heads=2, q_len=512, kv_len=2048, head_dim=64, sm_count=132)
    assert scratch == 4 * 8 * 512 * (64 + 1) * 4
    assert (2 << 20) + scratch + 8 * 512 * 4 + 2 * 512 == 6374400
    # Enough CTAs (a whole sequence: 8 heads x 32 blocks of rows), or all keys in one block: no split.
    assert flash_split_kv_bytes(batch=1, heads=8, kv_heads=2, q_len=2048, kv_len=2048, head_dim=64, sm_count=132) == 0
    assert flash_split_kv_bytes(batch=1, heads=8, kv_heads=2, q_len=64, kv_len=256, head_dim=64, sm_count=132) == 0
    # One query with grouped heads: the 4 heads of a group are the kernel's queries; 32 splits of 128 keys.
    assert flash_split_kv_bytes(batch=1, heads=8, kv_heads=2, q_len=1, kv_len=4096, head_dim=128, sm_count=132) == 32 * 2 * 4 * 129 * 4


@pytest.mark.parametrize("sm_count", [108, 114, 132, 148])
@pytest.mark.parametrize("rows", [None, 512, 128])
def test_plan_fits_flash_split_kv_scratch(sm_count, rows):
    """The CUDA workspace case, planned for several GPUs: K/V, each panel's rows and its kernel scratch fit."""
    B, S, d, heads, kv_heads = 8, 2048, 512, 8, 2
    hd = d // heads
    per_row = _attention_row_bytes("cuda", torch.bfloat16, d, heads, hd)
    per_seq = 2 * S * kv_heads * hd * 2
    bound = per_seq + (S if rows is None else rows) * per_row
    scratch = FlashSplitKV(heads=heads, kv_heads=kv_heads, head_dim=hd, seq_len=S, kv_len=S, causal=True, sm_count=sm_count)
    common = dict(batch=B, seq_len=S, per_sequence_bytes=per_seq, per_row_bytes=per_row, x_bytes=B * S * d * 2,
                  workspace_bytes=bound)
    plan = attention_plan("f", **common, kernel_bytes=scratch)
    panels = [(s0, min(s0 + plan.q_rows, S)) for s0 in range(0, S, plan.q_rows)]
    need = plan.group * per_seq + max(plan.group * (s1 - s0) * per_row + scratch(plan.group, s0, s1) for s0, s1 in panels)
    assert need <= bound
    # Without the kernel's scratch the plan took the whole bound for rows: 4 MiB more than it holds.
    assert attention_plan("f", **common).q_rows == (S if rows is None else rows)
    if rows is None:
        assert plan == AttentionPlan(group=1, q_rows=S, seq_len=S)  # a whole sequence fills the GPU: no split
    else:
        assert rows // 8 <= plan.q_rows < rows  # smaller panels, still GEMMs of some rows


def test_plan_error_when_the_kernel_scratch_does_not_fit():
    with pytest.raises(ValueError, match="not the attention kernel's own scratch for them \\(10000 bytes\\); pass at least 12010"):
        attention_plan("f", batch=1, seq_len=100, per_sequence_bytes=2000, per_row_bytes=10, x_bytes=0,
                       workspace_bytes=5000, kernel_bytes=lambda group, s0, s1: 10_000)
    # The default bound makes room for it.
    plan = attention_plan("f", batch=1, seq_len=100, per_sequence_bytes=2000, per_row_bytes=10, x_bytes=0,
                          workspace_bytes=None, kernel_bytes=lambda group, s0, s1: 10_000)
    assert plan == AttentionPlan(group=1, q_rows=100, seq_len=100)


def _cpu_flash_tiles(dtype, q_rows, kv_len, head_dim) -> int:
    """The CPU flash-attention kernel's per-thread tiles (aten FlashAttentionKernel.cpp), all threads:
    per thread, qk scores of a q split x kv split block, row max and sum, and an output tile in the
    accumulation type, and for 16-bit types the scores again and a kv split x head_dim tile of keys
    or values in that type (the profiler shows the last as one 64 KiB block per thread at kv split
    512, head_dim 64: on the 2 cores here the fixed slack hid it, on a 16- or 32-thread host not)."""
    q_split = min(q_rows, 256 if q_rows >= 768 else 64 if q_rows >= 192 else 32)
    kv_split = min(kv_len, 512)
    accumulate = 8 if dtype == torch.float64 else 4
    reduced = torch.empty((), dtype=dtype).element_size() if dtype in (torch.float16, torch.bfloat16) else 0
    per_thread = ((q_split * kv_split + 2 * q_split + q_split * head_dim) * accumulate
                  + (q_split * kv_split + kv_split * head_dim) * reduced)
    return torch.get_num_threads() * per_thread


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_attention_split_sequences_stay_within_workspace(dtype):
    """Query panels inside a sequence with GQA, rotary and causal attention: the CPU peak stays within the plan.

    Panels after a sequence's first see their keys lower-right aligned. torch's causal_lower_right has no
    fused CPU kernel: SDPA materialized a (rows, keys) bool mask and its float copy, and the CausalBias
    object is itself a float32 tensor of shape (2, rows, keys): 13.9 MB here in bf16 against a plan of 3.7.
    """
    B, S, d, heads, kv_heads, rows = 2, 2048, 512, 8, 2, 512
    hd = d // heads
    x, ws, bs, rot = _attention_case(B, S, d, heads, kv_heads, dtype, "cpu", bias=True, layout="linear", rotary=True, seed=15)
    norm = _norm("layer", d, dtype, "cpu", torch.Generator().manual_seed(16))
    bound = 2 * S * kv_heads * hd * x.element_size() + rows * _attention_row_bytes("cpu", dtype, d, heads, hd)
    kwargs = dict(**_kwargs(ws, bs), num_heads=heads, num_kv_heads=kv_heads, norm=norm, causal=True, rotary=rot)
    with torch.no_grad():
        whole = residual_attention_(x.clone(), **kwargs)  # whole sequences: one is_causal call per group
        residual_attention_(x.clone(), **kwargs, workspace_bytes=bound)
        y = x.clone()
        peak = cpu_peak_extra(lambda: residual_attention_(y, **kwargs, workspace_bytes=bound))
    # Beyond the plan: the flash kernel's per-thread tiles and GEMM packing buffers.
    slack = _cpu_flash_tiles(dtype, rows, S, hd) + (256 << 10)
    assert peak <= bound + slack, (peak, bound, slack)
    rtol, atol = (2e-2, 2e-2) if dtype == torch.bfloat16 else (1e-5, 1e-5)
    torch.testing.assert_close(y, whole, rtol=rtol, atol=atol)


# -- CUDA: the workspace bound holds ------------------------------------------------------------------


def _cuda_peak(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_mlp_stays_within_its_workspace():
    dtype, d, inner = torch.bfloat16, 512, 2048
    x, w1, w2, b1, b2, wg, bg = _mlp_case((8, 1024, d), inner, dtype, "cuda", gated=True, bias=True, layout="linear", seed=13)
    norm = _norm("rms", d, dtype, "cuda", torch.Generator().manual_seed(14))
    bound = 1024 * (d + 2 * inner) * 2  # 1024 rows of temporaries
    kwargs = dict(activation="silu", gate_weight=wg, gate_bias=bg, norm=norm, workspace_bytes=bound)
    with torch.no_grad():
        residual_mlp_(x.clone(), w1, w2, b1, b2, **kwargs)  # cuBLAS's own workspace, once
        ours = _cuda_peak(lambda: residual_mlp_(x, w1, w2, b1, b2, **kwargs))
        h = _rms_torch(x, norm)
        eager = _cuda_peak(lambda: x + torch.nn.functional.linear(
            torch.nn.functional.silu(torch.nn.functional.linear(h, wg, bg)) * torch.nn.functional.linear(h, w1, b1), w2, b2))
    assert ours <= bound + (1 << 20), (ours, bound)
    assert eager >= 4 * ours


def _rms_torch(x, norm):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [None, 512])
def test_cuda_attention_stays_within_its_workspace(rows):
    dtype, B, S, d, heads, kv_heads = torch.bfloat16, 8, 2048, 512, 8, 2
    x, ws, bs, rot = _attention_case(B, S, d, heads, kv_heads, dtype, "cuda", bias=True, layout="linear", rotary=True, seed=15)
    norm = _norm("layer", d, dtype, "cuda", torch.Generator().manual_seed(16))
    per_row = _attention_row_bytes("cuda", dtype, d, heads, d // heads)  # normalized row, q, output, rotary, lse
    per_seq = 2 * S * (kv_heads * d // heads) * 2
    bound = per_seq + (S if rows is None else rows) * per_row
    kwargs = dict(**_kwargs(ws, bs), num_heads=heads, num_kv_heads=kv_heads, norm=norm, causal=True, rotary=rot,
                  workspace_bytes=bound)
    with torch.no_grad():
        residual_attention_(x.clone(), **kwargs)
        ours = _cuda_peak(lambda: residual_attention_(x, **kwargs))
    # The flash kernel's logsumexp and the causal bias's bookkeeping come on top: well under a MiB here.
    assert ours <= bound + (1 << 20), (ours, bound)
    assert ours < x.nbytes  # less than one copy of the residual stream
