"""Property tests: InplaceMultiheadAttention and InplaceTransformerEncoderLayer against torch's modules.

(InplaceSoftmax, InplaceLayerNorm and InplaceLinear are in their ops' property tests.)
Float64 and float32 compare with torch's module in float64 at fixed tolerances;
half types with torch's own half-precision module as the yardstick: within the
tolerance or within twice torch's error against float64 (its error there is
larger than any fixed tolerance, see tests/test_encoder.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from make_inplace.nn import InplaceMultiheadAttention, InplaceTransformerEncoderLayer
from _properties import DEVICES, dtypes, no_worse_than_torch, seeds

TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
MASKS = ["none", "key_padding", "attn_bool", "attn_float", "attn3d", "causal", "causal+key_padding"]


def _masks(kind, n, heads, tgt, src, dtype, device, gen):
    """(key_padding_mask, attn_mask, is_causal); every query keeps one key."""
    kpm = attn = None
    causal = "causal" in kind
    if "key_padding" in kind:
        kpm = torch.rand(n, src, generator=gen) < 0.3
        kpm[:, 0] = False
    if kind in ("attn_bool", "attn_float", "attn3d") or causal:
        shape = (n * heads, tgt, src) if kind == "attn3d" else (tgt, src)
        blocked = torch.rand(shape, generator=gen) < 0.3
        blocked[..., 0] = False
        if causal:
            blocked = torch.ones(tgt, src, dtype=torch.bool).triu(1)
        attn = blocked if kind != "attn_float" and kind != "attn3d" else (
            torch.randn(shape, generator=gen, dtype=torch.float64).masked_fill(blocked, float("-inf")).to(dtype))
    to = lambda m: None if m is None else m.to(device)  # noqa: E731
    return to(kpm), to(attn), causal


def _compare(ours, theirs, truth, dtype, what):
    if dtype in (torch.float16, torch.bfloat16):
        no_worse_than_torch(ours, theirs, truth, TOL[dtype], what)
    else:
        torch.testing.assert_close(ours.double(), truth.double(), rtol=TOL[dtype], atol=TOL[dtype], msg=what)


def _run_three(modules, make_input, call, grad, dtype):
    """Runs truth (float64 torch), torch in dtype and ours; returns outputs and grads."""
    results = []
    for module in modules:
        x = make_input(next(module.parameters()).dtype).detach().clone().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            out = call(module, x)
            if grad:
                out[0].double().square().sum().backward() if isinstance(out, tuple) else \
                    out.double().square().sum().backward()
        grads = [x.grad] + [p.grad for p in module.parameters()] if grad else []
        results.append((out, grads))
    return results


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_attention_matches_torch(device, data):
    dtype = data.draw(dtypes)
    heads = data.draw(st.sampled_from([1, 2, 3, 4]))
    head_dim = data.draw(st.sampled_from([1, 2, 5, 8]))  # head_dim 1: embed_dim == num_heads
    e = heads * head_dim
    n, tgt = data.draw(st.sampled_from([1, 2, 3])), data.draw(st.sampled_from([1, 2, 5, 17]))
    cross = data.draw(st.booleans())
    src = data.draw(st.sampled_from([1, 3, 7, 16])) if cross else tgt
    kind = data.draw(st.sampled_from(MASKS if tgt == src else [m for m in MASKS if "causal" not in m]))
    need, average = data.draw(st.booleans()), data.draw(st.booleans())
    core = data.draw(st.sampled_from(["auto", "materialized"]))
    bias = data.draw(st.booleans())
    grad = data.draw(st.booleans())
    gen = torch.Generator().manual_seed(data.draw(seeds))

    truth = nn.MultiheadAttention(e, heads, bias=bias, batch_first=True, device=device, dtype=torch.float64)
    with torch.no_grad():
        for name, p in truth.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * (0.5 if "bias" in name else e**-0.5))
    theirs = copy.deepcopy(truth).to(dtype)
    ours = InplaceMultiheadAttention(e, heads, bias=bias, device=device, dtype=dtype, core=core)
    ours.load_state_dict(theirs.state_dict())
    if not grad:
        ours.eval()  # torch's stay on their standard path (dropout is 0), as below
    query = torch.randn(n, tgt, e, generator=gen, dtype=torch.float64)
    memory = torch.randn(n, src, e, generator=gen, dtype=torch.float64)
    kpm, attn, causal = _masks(kind, n, heads, tgt, src, torch.float64, device, gen)

    def call(module, x):
        d = next(module.parameters()).dtype
        kv = memory.to(d).to(device) if cross else x
        to = lambda m: None if m is None or m.dtype == torch.bool else m.to(d)  # noqa: E731
        return module(x, kv, kv, key_padding_mask=kpm if kpm is None or kpm.dtype == torch.bool else to(kpm),
                      need_weights=need, attn_mask=attn if attn is None or attn.dtype == torch.bool else to(attn),
                      average_attn_weights=average, is_causal=causal)

    (t_out, t_grads), (h_out, h_grads), (o_out, o_grads) = _run_three(
        (truth, theirs, ours), lambda d: query.to(d).to(device), call, grad, dtype)
    _compare(o_out[0].detach(), h_out[0].detach(), t_out[0].detach(), dtype, "output")
    if need:
        _compare(o_out[1].detach(), h_out[1].detach(), t_out[1].detach(), dtype, "weights")
    else:
        assert o_out[1] is None
    for k, (o, h, t) in enumerate(zip(o_grads, h_grads, t_grads)):
        if t is not None:
            _compare(o, h, t, dtype, f"grad {k}")


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
def test_encoder_layer_matches_torch(device, data):
    dtype = data.draw(dtypes)
    heads = data.draw(st.sampled_from([1, 2, 4]))
    d = heads * data.draw(st.sampled_from([1, 4, 8]))
    ff = data.draw(st.sampled_from([1, 8, 24]))
    n, length = data.draw(st.sampled_from([1, 2, 3])), data.draw(st.sampled_from([1, 2, 6, 13]))
    norm_first = data.draw(st.booleans())
    activation = data.draw(st.sampled_from(["relu", "gelu"]))
    kind = data.draw(st.sampled_from(["none", "key_padding", "causal", "attn_float"]))
    grad = data.draw(st.booleans())
    gen = torch.Generator().manual_seed(data.draw(seeds))

    truth = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation=activation, norm_first=norm_first,
                                       batch_first=True, device=device, dtype=torch.float64)
    with torch.no_grad():
        for name, p in truth.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight")):
                # |w| >= 0.5: layer_norm_ rebuilds x_hat from y / w (documented).
                p.copy_(0.5 + torch.rand(p.shape, generator=gen, dtype=torch.float64))
            elif "bias" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    theirs = copy.deepcopy(truth).to(dtype)
    ours = InplaceTransformerEncoderLayer(d, heads, ff, dropout=0.0, activation=activation, norm_first=norm_first,
                                          device=device, dtype=dtype)
    ours.load_state_dict(theirs.state_dict())
    if not grad:
        # torch's modules stay in train mode (dropout is 0): their eval fast path on
        # CPU returns NaN for a 2-D float src_mask with more than one head (torch 2.13).
        ours.eval()
    src = torch.randn(n, length, d, generator=gen, dtype=torch.float64)
    kpm, attn, causal = _masks(kind, n, heads, length, length, torch.float64, device, gen)

    def call(module, x):
        mask = attn if attn is None or attn.dtype == torch.bool else attn.to(next(module.parameters()).dtype)
        before = x.detach().clone()
        y = module(x, src_mask=mask, src_key_padding_mask=kpm, is_causal=causal)
        assert torch.equal(x.detach(), before)  # the layer never writes over src
        return y

    (t_out, t_grads), (h_out, h_grads), (o_out, o_grads) = _run_three(
        (truth, theirs, ours), lambda dt: src.to(dt).to(device), call, grad, dtype)
    _compare(o_out.detach(), h_out.detach(), t_out.detach(), dtype, "output")
    for k, (o, h, t) in enumerate(zip(o_grads, h_grads, t_grads)):
        if t is not None:
            _compare(o, h, t, dtype, f"grad {k}")
