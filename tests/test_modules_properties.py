"""Property tests: InplaceMultiheadAttention and InplaceTransformerEncoderLayer against torch's modules.

(InplaceSoftmax, InplaceLayerNorm and InplaceLinear are in their ops' property tests.)
Float64 and float32 compare with torch's module in float64 at fixed tolerances;
half types with torch's own half-precision module as the yardstick: within the
tolerance or within twice torch's error against float64 (its error there is
larger than any fixed tolerance, see tests/test_encoder.py).
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from make_inplace.nn import InplaceMultiheadAttention, InplaceTransformerEncoderLayer
from _properties import DEVICES, dtypes, no_worse_than_torch, seeds

# The tolerances of tests/test_attention.py and tests/test_encoder.py.
ATTENTION_TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
ENCODER_TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}
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


def _compare(ours, theirs, truth, dtype, what, tol):
    """float64: tol scaled by the values' magnitude; other dtypes: within that or
    within twice torch's own error in the same dtype (sums of many rounded terms
    can be off by more than tol times their result)."""
    if dtype == torch.float64:
        scale = max(1.0, truth.abs().max().item()) if truth.numel() else 1.0
        torch.testing.assert_close(ours.double(), truth.double(), rtol=tol[dtype], atol=tol[dtype] * scale, msg=what)
    else:
        no_worse_than_torch(ours, theirs, truth, tol[dtype], what)


UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24, torch.float64: 2.0**-53}


def _run_all(truth, theirs, ours, make_input, call, grad):
    """Runs truth (float64 torch), torch in the case's dtype three ways and ours;
    returns (output, grads) for each: truth, [torch runs], ours.

    The torch runs are all torch's own results in that dtype: with its default
    attention backends, with the math backend only, and on the input moved by
    one rounding (each element times 1 +- the unit roundoff). The last one
    measures the problem's conditioning: where one rounding of the input moves
    torch's result by a lot (a layer norm over two nearly equal features, say),
    ours, which rounds in another order, may move as much."""
    results = []
    dtype = next(theirs.parameters()).dtype
    runs = ((truth, None, False), (theirs, None, False), (theirs, [SDPBackend.MATH], False), (theirs, None, True),
            (ours, None, False))
    for module, backends, perturbed in runs:
        x = make_input(next(module.parameters()).dtype).detach().clone()
        if perturbed:
            signs = torch.randint(0, 2, x.shape, generator=torch.Generator().manual_seed(1)).to(x.device) * 2 - 1
            x = (x.double() * (1 + UNIT_ROUNDOFF[dtype] * signs)).to(x.dtype)
        x.requires_grad_(grad)
        for p in module.parameters():
            p.grad = None
        with torch.set_grad_enabled(grad), (sdpa_kernel(backends) if backends else contextlib.nullcontext()):
            out = call(module, x)
            loss_of = out[0] if isinstance(out, tuple) else out
            if grad:
                loss_of.double().square().sum().backward()
        grads = [x.grad] + [p.grad for p in module.parameters()] if grad else []
        results.append((out, grads))
    return results[0], results[1:4], results[4]


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
    seed = data.draw(seeds)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the modules' own initialization, reproducible per example

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

    (t_out, t_grads), torch_runs, (o_out, o_grads) = _run_all(
        truth, theirs, ours, lambda d: query.to(d).to(device), call, grad)
    h_outs = [[r[0][0].detach(), None if r[0][1] is None else r[0][1].detach()] for r in torch_runs]
    _compare(o_out[0].detach(), [h[0] for h in h_outs], t_out[0].detach(), dtype, "output", ATTENTION_TOL)
    if need:
        _compare(o_out[1].detach(), [h[1] for h in h_outs], t_out[1].detach(), dtype, "weights", ATTENTION_TOL)
    else:
        assert o_out[1] is None
    for k, (o, t) in enumerate(zip(o_grads, t_grads)):
        if t is not None:
            # Gradients: the gradient tolerance of tests/test_encoder.py.
            _compare(o, [r[1][k] for r in torch_runs], t, dtype, f"grad {k}", ENCODER_TOL)


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
    seed = data.draw(seeds)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the modules' own initialization, reproducible per example

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

    (t_out, t_grads), torch_runs, (o_out, o_grads) = _run_all(
        truth, theirs, ours, lambda dt: src.to(dt).to(device), call, grad)
    _compare(o_out.detach(), [r[0].detach() for r in torch_runs], t_out.detach(), dtype, "output", ENCODER_TOL)
    if not norm_first and dtype in (torch.float16, torch.bfloat16):
        # Post-norm runs layer_norm_, whose backward rebuilds x_hat from the rounded
        # half-precision output (documented): its error grows with the norm's rstd,
        # which these tiny random layers make arbitrary, so no bound relative to
        # torch's error holds here. tests/test_encoder.py bounds it at d = 64 on CUDA.
        assert all(torch.isfinite(o).all() for o in o_grads if o is not None)
        return
    for k, (o, t) in enumerate(zip(o_grads, t_grads)):
        if t is not None:
            _compare(o, [r[1][k] for r in torch_runs], t, dtype, f"grad {k}", ENCODER_TOL)
