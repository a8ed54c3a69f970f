"""The in-place layers against torch's at the same shapes (inference forward).

Groups pair torch and make_inplace: InplaceLinear vs nn.Linear (and
torch.compile on the full run), InplaceMultiheadAttention vs
nn.MultiheadAttention with and without weights, InplaceTransformerEncoderLayer
vs nn.TransformerEncoderLayer eager (fast path off), its native fast path and
torch.compile. Peak extra memory of one call is in each entry's extra_info.
"""

import pytest
import torch
from torch import nn

from harness import DEVICE, SHORT, Work, compiled, run
from make_inplace.nn import InplaceLinear, InplaceMultiheadAttention, InplaceTransformerEncoderLayer

if SHORT:
    SHAPES = [(2, 64, 64, 4)]  # (batch, seq_len, d_model, heads)
    DTYPES = [torch.float32]
else:
    SHAPES = [(8, 1024, 1024, 16), (8, 4096, 1024, 16), (4, 2048, 768, 12)]
    DTYPES = [torch.float16, torch.bfloat16]


def _skip_compile(impl: str, shape: tuple) -> None:
    if impl != "torch.compile":
        return
    if SHORT:
        pytest.skip("torch.compile rows run in the full (GPU) mode")
    if shape != SHAPES[0]:
        pytest.skip("torch.compile rows at the first shape only (each compile takes tens of seconds)")


def _fast_path(enabled: bool):
    """A function that runs fn with torch's MHA fast path switched as asked."""

    def wrap(fn):
        def call(*args):
            saved = torch.backends.mha.get_fastpath_enabled()
            torch.backends.mha.set_fastpath_enabled(enabled)
            try:
                with torch.no_grad():
                    return fn(*args)
            finally:
                torch.backends.mha.set_fastpath_enabled(saved)

        return call

    return wrap


def _run(benchmark, *, group, impl, make_inputs, fn, work):
    # Compile, cuBLAS/cuBLASLt workspaces and other one-time costs happen
    # here, not in the memory measurement the harness takes first.
    fn(*make_inputs())
    run(benchmark, group=group, impl=impl, make_inputs=make_inputs, fn=fn, work=work)


def _label(dtype, n, length, d, h):
    return f"{str(dtype)[6:]} ({n}, {length}, {d}) h={h}"


@pytest.mark.parametrize("impl", ["torch", "torch.compile", "make_inplace"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,length,d,h", SHAPES)
def test_linear(benchmark, n, length, d, h, dtype, impl):
    _skip_compile(impl, (n, length, d, h))
    torch.manual_seed(0)
    linear = nn.Linear(d, d, device=DEVICE, dtype=dtype).requires_grad_(False)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(d, d, device=DEVICE, dtype=dtype) / d**0.5)  # gain ~1: repeated in-place use stays finite
    if impl == "make_inplace":
        module = InplaceLinear(d, device=DEVICE, dtype=dtype).requires_grad_(False)
        module.load_state_dict(linear.state_dict())
    else:
        module = compiled(linear) if impl == "torch.compile" else linear
    elem = torch.finfo(dtype).bits // 8
    _run(benchmark, group=f"layers InplaceLinear {_label(dtype, n, length, d, h)}", impl=impl,
        make_inputs=lambda: (torch.randn(n, length, d, device=DEVICE, dtype=dtype),),
        fn=_fast_path(True)(module), work=Work(flops=2.0 * n * length * d * d, bytes=elem * (2.0 * n * length * d + d * d)))


@pytest.mark.parametrize("impl", ["torch", "make_inplace"])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,length,d,h", SHAPES)
def test_multihead_attention(benchmark, n, length, d, h, dtype, need_weights, impl):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(d, h, batch_first=True, device=DEVICE, dtype=dtype).eval()
    module = InplaceMultiheadAttention.from_torch(mha) if impl == "make_inplace" else mha
    fn = _fast_path(True)(lambda x: module(x, x, x, need_weights=need_weights, average_attn_weights=False)[0])
    flops = 2.0 * n * length * d * 4 * d + 4.0 * n * length * length * d
    _run(benchmark, group=f"layers InplaceMultiheadAttention need_weights={need_weights} {_label(dtype, n, length, d, h)}",
        impl=impl, make_inputs=lambda: (torch.randn(n, length, d, device=DEVICE, dtype=dtype),), fn=fn, work=Work(flops=flops))


@pytest.mark.parametrize("impl", ["torch eager", "torch fast path", "torch.compile", "make_inplace"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,length,d,h", SHAPES)
def test_transformer_encoder_layer(benchmark, n, length, d, h, dtype, impl):
    _skip_compile(impl, (n, length, d, h))
    torch.manual_seed(0)
    ff = 4 * d
    layer = nn.TransformerEncoderLayer(d, h, ff, dropout=0.0, batch_first=True, device=DEVICE, dtype=dtype).eval()
    if impl == "make_inplace":
        fn = _fast_path(False)(InplaceTransformerEncoderLayer.from_torch(layer))
    elif impl == "torch.compile":
        fn = _fast_path(False)(compiled(layer))
    else:
        fn = _fast_path(impl == "torch fast path")(layer)
    flops = 2.0 * n * length * d * (4 * d + 2 * ff) + 4.0 * n * length * length * d
    _run(benchmark, group=f"layers InplaceTransformerEncoderLayer ff={ff} {_label(dtype, n, length, d, h)}", impl=impl,
        make_inputs=lambda: (torch.randn(n, length, d, device=DEVICE, dtype=dtype),), fn=fn, work=Work(flops=flops))
