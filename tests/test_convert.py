"""convert_: swapping a model's attention / encoder layers, weights carried over."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

import make_inplace
from make_inplace import ConversionReport, convert_
from make_inplace.nn import InplaceLinear, InplaceMultiheadAttention, InplaceTransformerEncoderLayer


class _CustomMHA(nn.MultiheadAttention):
    pass


class _Model(nn.Module):
    """Encoder stack + a cross-attention + modules convert_ must leave alone."""

    def __init__(self, d: int = 16, h: int = 2) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, h, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False)
        self.cross = nn.MultiheadAttention(d, h, batch_first=True)
        self.seq_first = nn.MultiheadAttention(d, h)  # batch_first=False: skipped
        self.custom = _CustomMHA(d, h, batch_first=True)  # subclass: skipped
        self.head = nn.Linear(d, d)  # bare Linear: left alone
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, kpm: torch.Tensor | None = None) -> torch.Tensor:
        h = self.encoder(x, src_key_padding_mask=kpm)
        h = h + self.cross(h, memory, memory, need_weights=False)[0]
        s = self.seq_first(h.transpose(0, 1), h.transpose(0, 1), h.transpose(0, 1))[0].transpose(0, 1)
        c = self.custom(h, h, h)[0]
        return self.norm(self.head(h) + s + c + x)  # x read again after the encoder


def _inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, 16, generator=g, dtype=dtype)
    memory = torch.randn(3, 4, 16, generator=g, dtype=dtype)
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[1, 4:] = True
    kpm[2, 2:] = True
    return x, memory, kpm


def test_model_of_several_layers_same_outputs_grads_and_report(caplog):
    torch.manual_seed(1)
    ref = _Model().double()
    model = copy.deepcopy(ref)
    params_before = list(model.parameters())
    with caplog.at_level(logging.INFO, logger="make_inplace.convert"):
        out = convert_(model)
    assert out is model
    # Same Parameter objects: an optimizer built before the call keeps working.
    assert [id(p) for p in model.parameters()] == [id(p) for p in params_before]
    assert list(model.state_dict()) == list(ref.state_dict())
    assert all(type(layer) is InplaceTransformerEncoderLayer for layer in model.encoder.layers)
    assert type(model.cross) is InplaceMultiheadAttention
    assert type(model.seq_first) is nn.MultiheadAttention and type(model.custom) is _CustomMHA
    assert type(model.head) is nn.Linear and type(model.norm) is nn.LayerNorm

    report = model.make_inplace_report
    assert isinstance(report, ConversionReport)
    assert [name for name, _, _ in report.replaced] == ["encoder.layers.0", "encoder.layers.1", "encoder.layers.2", "cross"]
    skipped = {name: why for name, _, why in report.skipped}
    assert "batch_first=False" in skipped["seq_first"]
    assert "subclass" in skipped["custom"]
    assert "read again" in skipped["head"] and "read again" in skipped["norm"]
    assert "replaced 4" in caplog.text and "seq_first" in caplog.text

    x, memory, kpm = _inputs()
    for grad in (False, True):
        xs = [x.clone().requires_grad_(grad) for _ in range(2)]
        with torch.set_grad_enabled(grad):
            expected = ref(xs[0], memory, kpm)
            got = model(xs[1], memory, kpm)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
        if grad:
            expected.square().sum().backward()
            got.square().sum().backward()
            torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-9, atol=1e-10)
            for (name, p_ref), p in zip(ref.named_parameters(), model.parameters()):
                torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-9, atol=1e-10, msg=name)


def test_eval_mode_kept_and_matches_torch_nested_fast_path_where_not_padded():
    torch.manual_seed(2)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    ref = nn.TransformerEncoder(layer, num_layers=2).eval()  # nested-tensor fast path on
    model = convert_(copy.deepcopy(ref))
    assert not any(m.training for m in model.modules())
    assert not model.use_nested_tensor
    assert model.make_inplace_report.notes[0][0] == ""
    x, _, kpm = _inputs(torch.float32)
    with torch.no_grad():
        expected = ref(x, src_key_padding_mask=kpm)
        got = model(x, src_key_padding_mask=kpm)
    # torch's nested path zeroes padded positions; the rest must agree.
    keep = ~kpm
    torch.testing.assert_close(got[keep], expected[keep], rtol=3e-5, atol=3e-5)


def test_root_layer_is_replaced_and_returned():
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dtype=torch.float64)
    new = convert_(layer)
    assert type(new) is InplaceTransformerEncoderLayer
    assert new.linear1.weight.dtype == torch.float64
    assert new.make_inplace_report.replaced == [("", "TransformerEncoderLayer", "InplaceTransformerEncoderLayer")]


def test_skips_with_reasons():
    hooked = nn.MultiheadAttention(16, 2, batch_first=True)
    hooked.register_forward_hook(lambda *args: None)
    model = nn.ModuleDict(
        {
            "bias_kv": nn.MultiheadAttention(16, 2, batch_first=True, add_bias_kv=True),
            "zero_attn": nn.MultiheadAttention(16, 2, batch_first=True, add_zero_attn=True),
            "hooked": hooked,
            "seq_first_layer": nn.TransformerEncoderLayer(16, 2, 32),
            "ours": InplaceLinear(16),
        }
    )
    convert_(model)
    skipped = {name: why for name, _, why in model.make_inplace_report.skipped}
    assert "add_bias_kv" in skipped["bias_kv"]
    assert "add_zero_attn" in skipped["zero_attn"]
    assert "hooks" in skipped["hooked"]
    assert "batch_first=False" in skipped["seq_first_layer"]
    assert "batch_first=False" in skipped["seq_first_layer.self_attn"]
    assert "ours" not in skipped
    assert model.make_inplace_report.replaced == []
    assert "skipped" in str(model.make_inplace_report)


def test_converting_twice_changes_nothing():
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2, enable_nested_tensor=False)
    convert_(model)
    layers = list(model.layers)
    convert_(model)
    assert list(model.layers) == layers and model.make_inplace_report.replaced == []


def test_refuses_non_modules():
    with pytest.raises(TypeError, match="model"):
        convert_("not a module")


def test_exported():
    assert "convert_" in make_inplace.__all__ and make_inplace.convert_ is convert_
