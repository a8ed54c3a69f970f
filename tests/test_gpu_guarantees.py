"""The GPU guarantees, for every op and module (CUDA only; skipped without a GPU):

* on a non-default stream with no synchronization: the inputs are written on
  that stream right before the call, behind a slow kernel, so an op that
  launched anywhere else would read them unfinished;
* under CUDA-graph capture, replayed with new inputs;
* under ``torch.compile(fullgraph=True)`` with inductor (forward, and backward
  where the case is differentiable);
* bitwise identical results (and gradients) on a rerun;
* with tensors of more than 2**31 elements (each case at most ~13 GB).

Cases cover every kernel route (register, staged and long rows, columns,
the square-matmul routes forced one by one), each backward op and each module.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import make_inplace
from make_inplace._testing import forced_route, trilinear_reference
from make_inplace.nn import (
    InplaceLayerNorm,
    InplaceLinear,
    InplaceMultiheadAttention,
    InplaceSoftmax,
    InplaceTransformerEncoderLayer,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICE = "cuda"
op = torch.ops.make_inplace
TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64

Tensors = dict  # argument name -> tensor


@dataclass
class Case:
    """make(seed) builds the inputs; run(inputs) calls ours and returns the results
    (for in-place ops the written tensors); reference(inputs) computes them with
    torch (float64 where it can). grads: names of inputs whose gradients the
    case checks after a backward of sum(result**2) (outside any graph capture)."""

    name: str
    make: Callable[[int], Tensors]
    run: Callable[[Tensors], list]
    reference: Callable[[Tensors], list]
    tol: float
    route: str | None = None
    grads: tuple[str, ...] = ()
    capturable: bool = True
    staged_rows: bool = True
    # Modules: torch's own module in the case's dtype. Ours must be within tol of
    # the reference or within twice torch's own error, whichever is larger.
    yardstick: Callable[[Tensors], list] | None = None

    def forcing(self):
        if self.route is None and self.staged_rows:
            return contextlib.nullcontext()
        return forced_route(self.route, staged_rows=self.staged_rows)


def _randn(seed, *shape, dtype=F32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dtype).to(DEVICE)


def _d(t):
    return None if t is None else t.double()


# ------------------------------------------------------------------ op cases


def _softmax_case(name, shape, dtype, dim=-1, mask_shape=None, causal=False, scale=None, staged=True, grad=False):
    def make(seed):
        t = {"x": _randn(seed, *shape, dtype=dtype, scale=3.0)}
        if mask_shape is not None:
            t["mask"] = _randn(seed + 1, *mask_shape, dtype=dtype)
        if grad:
            t["x"].requires_grad_()
        return t

    def run(t):
        x = t["x"] * 1.0 if grad else t["x"]
        return [make_inplace.softmax_(x, dim, scale=scale, causal=causal, mask=t.get("mask"))]

    def reference(t):
        v = t["x"].double() * (1.0 if scale is None else scale)
        if "mask" in t:
            v = v + t["mask"].double()
        if causal:
            cut = torch.ones(shape[-2], shape[-1], dtype=torch.bool, device=DEVICE).triu(1)
            v = v.masked_fill(cut, float("-inf"))
        return [torch.softmax(v, dim)]

    return Case(name, make, run, reference, TOL[dtype], staged_rows=staged, grads=("x",) if grad else ())


def _softmax_backward_case(name, shape, dtype, dim=-1, in_place=False):
    def make(seed):
        return {"grad": _randn(seed, *shape, dtype=dtype), "y": torch.softmax(_randn(seed + 1, *shape), dim).to(dtype)}

    def run(t):
        if in_place:
            op.softmax_backward_(t["grad"], t["y"], dim, 0.5)
            return [t["grad"]]
        return [op.softmax_backward(t["grad"], t["y"], dim, 0.5)]

    def reference(t):
        g, y = t["grad"].double(), t["y"].double()
        return [0.5 * y * (g - (g * y).sum(dim, keepdim=True))]

    return Case(name, make, run, reference, TOL[dtype] * 4)


def _layer_norm_case(name, shape, norm, dtype, affine=True, staged=True, grad=False, stats=False):
    def make(seed):
        t = {"x": _randn(seed, *shape, dtype=dtype, scale=2.0)}
        if affine:
            t["weight"] = (0.5 + torch.rand(norm, generator=torch.Generator().manual_seed(seed), dtype=F64)).to(dtype).to(DEVICE)
            t["bias"] = _randn(seed + 2, *norm, dtype=dtype)
        if grad:
            for v in t.values():
                v.requires_grad_()
        return t

    def run(t):
        x = t["x"] * 1.0 if grad else t["x"]
        if stats:
            mean, rstd = op.layer_norm_stats_(x, list(norm), t.get("weight"), t.get("bias"), 1e-5)
            return [x, mean, rstd]
        return [make_inplace.layer_norm_(x, norm, t.get("weight"), t.get("bias"), 1e-5)]

    def reference(t):
        x = t["x"].double()
        y = F.layer_norm(x, norm, _d(t.get("weight")), _d(t.get("bias")), 1e-5)
        if not stats:
            return [y]
        dims = tuple(range(-len(norm), 0))
        var = x.var(dims, unbiased=False)
        return [y, x.mean(dims), (var + 1e-5).rsqrt()]

    grads = ("x", "weight", "bias") if grad and affine else (("x",) if grad else ())
    return Case(name, make, run, reference, TOL[dtype] * 2, staged_rows=staged, grads=grads)


def _layer_norm_backward_case(name, shape, norm, dtype):
    def make(seed):
        x = _randn(seed, *shape, dtype=F64)
        w = 0.5 + torch.rand(norm, generator=torch.Generator().manual_seed(seed), dtype=F64).to(DEVICE)
        b = _randn(seed + 1, *norm, dtype=F64)
        dims = tuple(range(-len(norm), 0))
        rstd = (x.var(dims, unbiased=False) + 1e-5).rsqrt()
        y = F.layer_norm(x, norm, w, b, 1e-5)
        stat = F64 if dtype == F64 else F32
        return {"grad": _randn(seed + 2, *shape, dtype=dtype), "y": y.to(dtype), "weight": w.to(dtype),
                "bias": b.to(dtype), "rstd": rstd.reshape(-1).to(stat)}

    def run(t):
        return list(op.layer_norm_backward(t["grad"], t["y"], list(norm), t["weight"], t["bias"], t["rstd"],
                                           [True, True, True]))

    def reference(t):
        # The gradients from x_hat rebuilt from y, as the kernels do, in float64.
        y, w, b, g = t["y"].double(), t["weight"].double(), t["bias"].double(), t["grad"].double()
        dims = tuple(range(-len(norm), 0))
        batch = tuple(range(y.dim() - len(norm)))
        x_hat = (y - b) / w
        rstd = t["rstd"].double().reshape(y.shape[: y.dim() - len(norm)] + (1,) * len(norm))
        gx_hat = g * w
        grad_x = rstd * (gx_hat - gx_hat.mean(dims, keepdim=True) - x_hat * (gx_hat * x_hat).mean(dims, keepdim=True))
        return [grad_x, (g * x_hat).sum(batch), g.sum(batch)]

    return Case(name, make, run, reference, TOL[dtype] * 8)


def _square_matmul_case(name, rows, n, dtype, *, bias=True, transpose=False, workspace=None, route=None, grad=False):
    def make(seed):
        t = {"x": _randn(seed, rows, n, dtype=dtype), "weight": _randn(seed + 1, n, n, dtype=dtype, scale=n**-0.5)}
        if bias:
            t["bias"] = _randn(seed + 2, n, dtype=dtype)
        if grad:
            t["x"].requires_grad_()
            if bias:
                t["bias"].requires_grad_()
        return t

    def run(t):
        x = t["x"] * 1.0 if grad else t["x"]
        return [make_inplace.square_matmul_(x, t["weight"], t.get("bias"), transpose=transpose, workspace_bytes=workspace)]

    def reference(t):
        w = t["weight"].double()
        out = t["x"].double() @ (w.t() if transpose else w)
        return [out if "bias" not in t else out + t["bias"].double()]

    tol = {F16: 2e-3, BF16: 1.2e-2, F32: 2e-5, F64: 1e-12}[dtype]
    grads = (("x", "bias") if bias else ("x",)) if grad else ()
    return Case(name, make, run, reference, tol, route=route, grads=grads)



def _trilinear_case(name, n, f, dtype, strided=False, grad=False):
    def make(seed):
        feats = _randn(seed, n, f, 8, dtype=dtype).transpose(1, 2) if strided else _randn(seed, n, 8, f, dtype=dtype)
        points = (torch.rand(n, 3, generator=torch.Generator().manual_seed(seed), dtype=F64) * 2.4 - 1.2).to(dtype).to(DEVICE)
        if grad:
            feats.requires_grad_(), points.requires_grad_()
        return {"feats": feats, "points": points}

    def run(t):
        return [make_inplace.trilinear_interpolation(t["feats"], t["points"])]

    def reference(t):
        return [trilinear_reference(t["feats"].double(), t["points"].double())]

    return Case(name, make, run, reference, TOL[dtype] * 2, grads=("feats", "points") if grad else ())


def _trilinear_backward_case(name, n, f, dtype, with_feats=True, accumulate=False):
    def make(seed):
        t = {"grad_out": _randn(seed, n, f, dtype=dtype),
             "points": (torch.rand(n, 3, generator=torch.Generator().manual_seed(seed), dtype=F64) * 2 - 1).to(dtype).to(DEVICE),
             "grad_feats": _randn(seed + 3, n, 8, f, dtype=dtype)}
        if with_feats:
            t["feats"] = _randn(seed + 1, n, 8, f, dtype=dtype)
            t["grad_points"] = _randn(seed + 4, n, 3, dtype=dtype)
        return t

    def run(t):
        gf, gp = make_inplace.trilinear_interpolation_backward(
            t["grad_out"], t["points"], t.get("feats"), grad_feats=t["grad_feats"], grad_points=t.get("grad_points"),
            accumulate=accumulate)
        return [gf] + ([gp] if with_feats else [])

    def reference(t):
        feats = (t["feats"] if with_feats else torch.zeros(n, 8, f, device=DEVICE)).double().requires_grad_()
        points = t["points"].double().requires_grad_()
        with torch.enable_grad():  # the gradients through the formula are the reference
            trilinear_reference(feats, points).backward(t["grad_out"].double())
        out = [feats.grad + (t["grad_feats"].double() if accumulate else 0)]
        if with_feats:
            out.append(points.grad + (t["grad_points"].double() if accumulate else 0))
        return out

    return Case(name, make, run, reference, TOL[dtype] * 4)


def _outer_case(name, lead, n, m, dtype, strided=False, grad=False):
    def make(seed):
        a = _randn(seed, *lead, n, dtype=dtype)
        b = _randn(seed + 1, *lead, 2 * m, dtype=dtype)[..., ::2] if strided else _randn(seed + 1, *lead, m, dtype=dtype)
        if grad:
            a.requires_grad_(), b.requires_grad_()
        return {"a": a, "b": b}

    def run(t):
        return [make_inplace.outer_product(t["a"], t["b"])]

    def reference(t):
        return [t["a"].double()[..., :, None] * t["b"].double()[..., None, :]]

    return Case(name, make, run, reference, TOL[dtype], grads=("a", "b") if grad else ())


def _outer_backward_case(name, lead, n, m, dtype, accumulate=False):
    def make(seed):
        return {"grad_out": _randn(seed, *lead, n, m, dtype=dtype), "a": _randn(seed + 1, *lead, n, dtype=dtype),
                "b": _randn(seed + 2, *lead, m, dtype=dtype), "grad_a": _randn(seed + 3, *lead, n, dtype=dtype),
                "grad_b": _randn(seed + 4, *lead, m, dtype=dtype)}

    def run(t):
        return list(make_inplace.outer_product_backward(t["grad_out"], t["a"], t["b"], grad_a=t["grad_a"],
                                                        grad_b=t["grad_b"], accumulate=accumulate))

    def reference(t):
        g = t["grad_out"].double()
        ga = (g * t["b"].double()[..., None, :]).sum(-1)
        gb = (g * t["a"].double()[..., :, None]).sum(-2)
        if accumulate:
            ga, gb = ga + t["grad_a"].double(), gb + t["grad_b"].double()
        return [ga, gb]

    return Case(name, make, run, reference, TOL[dtype] * 8)


# -------------------------------------------------------------- module cases


def _module_case(name, build, shape, dtype, *, grad=False, call=None, capturable=True):
    """ours and truth = build(); truth runs in float64 as the reference and, cast to
    the case's dtype, as the yardstick (torch's own error in that dtype). torch's
    modules stay in train mode (dropout 0): their standard path, not the eval fast path."""

    def make(seed):
        return {"x": _randn(seed, *shape, dtype=dtype).requires_grad_(grad)}

    modules = {}

    def built():
        if not modules:
            torch.manual_seed(0)
            ours, truth = build()
            modules["ours"] = ours.to(DEVICE, dtype).train(grad)
            modules["truth"] = truth.to(DEVICE, F64)
            modules["theirs"] = copy.deepcopy(truth).to(DEVICE, dtype)
        return modules

    invoke = call or (lambda m, x: m(x))

    def first(out):
        return [out[0] if isinstance(out, tuple) else out]

    def run(t):
        with torch.set_grad_enabled(grad):
            return first(invoke(built()["ours"], t["x"] * 1.0 if grad else t["x"]))

    def reference(t):
        return first(invoke(built()["truth"], t["x"].double()))

    def yardstick(t):
        with torch.no_grad():
            return first(invoke(built()["theirs"], t["x"].detach().to(dtype)))

    return Case(name, make, run, reference, TOL[dtype], grads=("x",) if grad else (), capturable=capturable,
                yardstick=yardstick)


def _linear_pair(n):
    ours = InplaceLinear(n)
    truth = nn.Linear(n, n)
    truth.load_state_dict(ours.state_dict())
    ours.weight.requires_grad_(False)  # frozen: in place even under autograd
    return ours, truth


def _layer_norm_pair(n):
    ours = InplaceLayerNorm(n)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5), ours.bias.normal_()
    truth = nn.LayerNorm(n)
    truth.load_state_dict(ours.state_dict())
    return ours, truth


def _mha_pair(e, heads, core):
    truth = nn.MultiheadAttention(e, heads, batch_first=True)
    ours = InplaceMultiheadAttention(e, heads, core=core)
    ours.load_state_dict(truth.state_dict())
    return ours, truth


def _encoder_pair(d, heads, ff, norm_first):
    truth = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=norm_first)
    with torch.no_grad():
        truth.norm1.weight.uniform_(0.5, 1.5), truth.norm2.weight.uniform_(0.5, 1.5)
    ours = InplaceTransformerEncoderLayer(d, heads, ff, dropout=0.0, norm_first=norm_first)
    ours.load_state_dict(truth.state_dict())
    return ours, truth


def _self_attention(need):
    return lambda m, x: m(x, x, x, need_weights=need)


def build_cases() -> list[Case]:
    """The case table. Each call builds new cases, whose modules are built on first use
    on the DEVICE of that moment (tests/test_multi_gpu.py builds its own on cuda:1)."""
    return [
        # softmax_: register rows (plain and general), staged rows, long rows, columns, fp64, masks, causal.
        _softmax_case("softmax-register-plain", (64, 1024), BF16),
        _softmax_case("softmax-register-mask-causal", (2, 33, 1000), F32, mask_shape=(33, 1000), causal=True, scale=0.5),
        _softmax_case("softmax-unaligned", (37, 1001), F16, scale=0.3),
        _softmax_case("softmax-staged", (8, 65536), BF16),
        _softmax_case("softmax-staged-causal", (2, 3, 40000), F32, causal=True, scale=0.7),
        _softmax_case("softmax-staged-split", (3, 262144), F32),
        _softmax_case("softmax-long", (2, 1048576), BF16),
        _softmax_case("softmax-long-no-staging", (8, 65536), BF16, staged=False),
        _softmax_case("softmax-columns", (7, 33, 5), F32, dim=1, mask_shape=(33, 1)),
        _softmax_case("softmax-fp64", (5, 333), F64, mask_shape=(333,)),
        _softmax_case("softmax-autograd", (64, 1024), F32, mask_shape=(1024,), grad=True),
        _softmax_backward_case("softmax_backward-rows", (64, 1024), BF16),
        _softmax_backward_case("softmax_backward-unaligned", (9, 1001), F32),
        _softmax_backward_case("softmax_backward-columns", (6, 33, 5), F32, dim=1),
        _softmax_backward_case("softmax_backward_-in-place", (64, 1024), F16, in_place=True),
        # layer_norm_: register rows (plain and general), staged, long, fp64, stats (staged moments), autograd.
        _layer_norm_case("layer_norm-register-plain", (64, 1024), (1024,), BF16),
        _layer_norm_case("layer_norm-register-no-affine", (33, 1000), (1000,), F32, affine=False),
        _layer_norm_case("layer_norm-2d-normalized", (5, 4, 33), (4, 33), F16),
        _layer_norm_case("layer_norm-staged", (8, 65536), (65536,), BF16),
        _layer_norm_case("layer_norm-staged-split", (3, 262144), (262144,), BF16),
        _layer_norm_case("layer_norm-long", (2, 1048576), (1048576,), BF16),
        _layer_norm_case("layer_norm-long-no-staging", (8, 65536), (65536,), F32, staged=False),
        _layer_norm_case("layer_norm-fp64", (5, 333), (333,), F64),
        _layer_norm_case("layer_norm_stats-register", (64, 1024), (1024,), BF16, stats=True),
        _layer_norm_case("layer_norm_stats-staged", (8, 65536), (65536,), BF16, stats=True),
        _layer_norm_case("layer_norm_stats-staged-split", (3, 262144), (262144,), F32, stats=True),
        _layer_norm_case("layer_norm_stats-long", (2, 1048576), (1048576,), F32, stats=True),
        _layer_norm_case("layer_norm-autograd", (64, 1024), (1024,), F32, grad=True),
        _layer_norm_backward_case("layer_norm_backward-rows", (64, 1024), (1024,), F32),
        _layer_norm_backward_case("layer_norm_backward-many-rows", (4096, 96), (96,), BF16),
        _layer_norm_backward_case("layer_norm_backward-wide", (3, 65536), (65536,), F32),
        # square_matmul_: each route forced (where it cannot run the call, the policy picks).
        _square_matmul_case("square_matmul-default-bf16", 4096, 1024, BF16),
        _square_matmul_case("square_matmul-wgmma-counted", 4096, 1024, BF16, route="wgmma_counted", workspace=4 << 20),
        _square_matmul_case("square_matmul-wgmma-clusters", 4096, 1024, BF16, route="wgmma_clusters", workspace=0,
                            transpose=True),
        _square_matmul_case("square_matmul-wgmma-grid", 4096, 2048, F16, route="wgmma_grid", workspace=0),
        _square_matmul_case("square_matmul-wgmma-rows", 1000, 504, F16, route="wgmma_rows", workspace=0),
        _square_matmul_case("square_matmul-wgmma-rows-default", 16384, 512, BF16, transpose=True),
        _square_matmul_case("square_matmul-ffma-counted", 4096, 1024, F32, route="ffma_counted", workspace=4 << 20),
        _square_matmul_case("square_matmul-ffma-grid", 1000, 512, F32, route="ffma_grid", workspace=0,
                            transpose=True),
        _square_matmul_case("square_matmul-panels", 3000, 640, F16, route="panels", workspace=4 << 20, transpose=True),
        _square_matmul_case("square_matmul-panels-one-buffer", 3000, 640, F32, route="panels", workspace=64 << 20),
        _square_matmul_case("square_matmul-waves-bf16", 1000, 256, BF16, route="waves", workspace=0),
        _square_matmul_case("square_matmul-waves-fp32", 257, 96, F32, route="waves", workspace=0, bias=False),
        _square_matmul_case("square_matmul-fp64", 100, 64, F64),
        _square_matmul_case("square_matmul-autograd", 512, 256, F32, grad=True),
        # trilinear_interpolation (+ backward).
        _trilinear_case("trilinear", 4096, 64, BF16),
        _trilinear_case("trilinear-strided-feats", 1000, 33, F32, strided=True),
        _trilinear_case("trilinear-autograd", 777, 32, F32, grad=True),
        _trilinear_backward_case("trilinear_backward", 4096, 64, F16),
        _trilinear_backward_case("trilinear_backward-no-feats", 1000, 33, F32, with_feats=False),
        _trilinear_backward_case("trilinear_backward-accumulate", 1000, 33, F32, accumulate=True),
        # outer_product (+ backward).
        _outer_case("outer_product", (8,), 300, 200, BF16),
        _outer_case("outer_product-strided", (2, 3), 65, 33, F32, strided=True),
        _outer_case("outer_product-autograd", (4,), 100, 70, F32, grad=True),
        _outer_backward_case("outer_product_backward", (8,), 300, 200, F32),
        _outer_backward_case("outer_product_backward-accumulate", (3,), 1025, 7, BF16, accumulate=True),
        # Few items, wide rows: on sm_90 a cluster of CTAs per item.
        _outer_backward_case("outer_product_backward-clusters", (70,), 101, 1288, BF16),
        # Modules, inference and training.
        _module_case("InplaceSoftmax", lambda: (InplaceSoftmax(-1), nn.Softmax(-1)), (64, 1024), BF16),
        _module_case("InplaceLayerNorm", lambda: _layer_norm_pair(1024), (64, 1024), BF16),
        _module_case("InplaceLayerNorm-train", lambda: _layer_norm_pair(1024), (64, 1024), F32, grad=True, capturable=False),
        _module_case("InplaceLinear", lambda: _linear_pair(1024), (4096, 1024), BF16),
        _module_case("InplaceLinear-frozen-train", lambda: _linear_pair(256), (512, 256), F32, grad=True, capturable=False),
        _module_case("InplaceMultiheadAttention-sdpa", lambda: _mha_pair(64, 4, "auto"), (2, 65, 64), F32,
                     call=_self_attention(False)),
        _module_case("InplaceMultiheadAttention-weights", lambda: _mha_pair(64, 4, "auto"), (2, 65, 64), BF16,
                     call=_self_attention(True)),
        _module_case("InplaceMultiheadAttention-head-dim-1", lambda: _mha_pair(4, 4, "materialized"), (2, 9, 4), F32,
                     call=_self_attention(False)),
        _module_case("InplaceMultiheadAttention-train", lambda: _mha_pair(64, 4, "materialized"), (2, 33, 64), F32,
                     call=_self_attention(True), grad=True, capturable=False),
        _module_case("InplaceTransformerEncoderLayer", lambda: _encoder_pair(64, 4, 128, False), (2, 65, 64), F32),
        _module_case("InplaceTransformerEncoderLayer-norm-first", lambda: _encoder_pair(64, 4, 128, True), (2, 65, 64),
                     BF16),
        _module_case("InplaceTransformerEncoderLayer-train", lambda: _encoder_pair(64, 4, 128, False), (2, 33, 64), F32,
                     grad=True, capturable=False),
    ]


CASES = build_cases()
IDS = [c.name for c in CASES]


# ------------------------------------------------------------------ helpers


def _fresh(case: Case, seed: int = 0) -> Tensors:
    return case.make(seed)


def _detached_copy(t: Tensors) -> Tensors:
    return {k: v.detach().clone() for k, v in t.items()}


def _max_error(a, b):
    return (a.detach().double() - b.detach().double().to(a.device)).abs().max().item() if a.numel() else 0.0


def _check(results, expected, tol, what, theirs=None):
    assert len(results) == len(expected), what
    for k, (r, e) in enumerate(zip(results, expected)):
        scale = max(1.0, e.detach().abs().max().item()) if e.numel() else 1.0
        if theirs is not None:
            bound = max(tol * scale, 2 * _max_error(theirs[k], e))
            assert _max_error(r, e) <= bound, f"{what}: result {k}: error {_max_error(r, e):.3g} > {bound:.3g}"
            continue
        torch.testing.assert_close(r.detach().double(), e.detach().double().to(r.device), rtol=tol,
                                   atol=tol * scale, equal_nan=True, msg=f"{what}: result {k}")


def _expected(case: Case, values: Tensors):
    """(reference results, torch's results in the case's dtype or None)."""
    with torch.no_grad():
        expected = case.reference(_detached_copy(values))
        theirs = None if case.yardstick is None else case.yardstick(_detached_copy(values))
    return expected, theirs


def _backward(results, inputs, names):
    loss = sum(r.double().square().sum() for r in results)
    loss.backward()
    return [inputs[n].grad.detach().clone() for n in names]


def _reference_grads(case: Case, values: Tensors):
    """Gradients of sum(result**2) through the float64 reference."""
    leaves = {k: v.detach().double().requires_grad_(k in case.grads) for k, v in values.items()}
    with torch.enable_grad():
        return _backward(case.reference(leaves), leaves, case.grads)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().contiguous().reshape(-1), b.detach().contiguous().reshape(-1)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


# -------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_side_stream_without_synchronization(case):
    values = _fresh(case)
    expected, theirs = _expected(case, values)
    # Placeholders of the same layout hold NaN until the side stream writes the values.
    inputs = {}
    for k, v in values.items():
        holder = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device).fill_(float("nan"))
        inputs[k] = holder
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with case.forcing(), torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # a slow kernel first: a launch elsewhere would overtake it
        for k, v in values.items():
            inputs[k].copy_(v.detach())
            inputs[k].requires_grad_(v.requires_grad)
        results = case.run(inputs)
        grads = _backward(results, inputs, case.grads) if case.grads else []
    torch.cuda.current_stream().wait_stream(side)
    _check(results, expected, case.tol, case.name, theirs)
    if case.grads:
        # Against the same computation on the default stream (the values are
        # checked above): the side stream must change nothing.
        eager = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in values.items()}
        with case.forcing():
            eager_grads = _backward(case.run(eager), eager, case.grads)
        _check(grads, eager_grads, case.tol, f"{case.name} grads vs the default stream")
        if case.yardstick is None:
            _check(eager_grads, _reference_grads(case, values), case.tol * 4, f"{case.name} grads vs reference")


@pytest.mark.parametrize("case", [c for c in CASES if c.capturable], ids=[c.name for c in CASES if c.capturable])
def test_cuda_graph_capture_and_replay(case):
    static = {k: v.detach() for k, v in _fresh(case, 0).items()}
    later = [{k: v.detach() for k, v in _fresh(case, seed).items()} for seed in (1, 2)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with case.forcing(), torch.no_grad():
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: plans, cached launch settings, cuBLAS handles
                for k, v in later[0].items():
                    static[k].copy_(v)
                case.run(static)
        torch.cuda.current_stream().wait_stream(side)
        for k, v in later[0].items():
            static[k].copy_(v)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            results = case.run(static)
        for values in later:
            for k, v in values.items():
                static[k].copy_(v)
            graph.replay()
            expected, theirs = _expected(case, values)
            _check(results, expected, case.tol, f"{case.name} replay", theirs)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compile_fullgraph_inductor(case):
    torch._dynamo.reset()
    compiled = torch.compile(case.run, backend="inductor", fullgraph=True)
    values = _fresh(case)
    expected, theirs = _expected(case, values)  # also builds a module case's modules, outside the trace
    inputs = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in values.items()}
    with case.forcing():
        results = compiled(inputs)
        grads = _backward(results, inputs, case.grads) if case.grads else []
    _check(results, expected, case.tol, f"{case.name} compiled", theirs)
    if case.grads:
        eager = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in values.items()}
        with case.forcing():
            eager_grads = _backward(case.run(eager), eager, case.grads)
        _check(grads, eager_grads, case.tol * 4, f"{case.name} compiled grads vs eager")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bitwise_identical_on_rerun(case):
    runs = []
    for _ in range(2):
        inputs = _fresh(case)
        with case.forcing():
            results = case.run(inputs)
            grads = _backward(results, inputs, case.grads) if case.grads else []
        torch.cuda.synchronize()
        runs.append([r.detach().clone() for r in results] + grads)
    for k, (a, b) in enumerate(zip(*runs)):
        assert _same_bits(a, b), f"{case.name}: result {k} differs between two identical runs"


# ------------------------------------------- tensors of more than 2**31 elements
#
# Each input is drawn on the GPU from a seeded generator, so after the call the
# original values are drawn again instead of kept; results are then checked in
# full, a slice at a time, against float64 (at most ~13 GB at once).

BIG = 2**31


def _big(shape, dtype, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(shape, generator=g, device=DEVICE, dtype=dtype)


def _slices(total: int, per_row: int):
    step = max(1, (1 << 25) // max(per_row, 1))  # 32M elements a slice
    return [slice(i, min(i + step, total)) for i in range(0, total, step)]


def _close(result, expected, tol, what):
    scale = max(1.0, expected.abs().max().item())
    torch.testing.assert_close(result.double(), expected, rtol=tol, atol=tol * scale, msg=what)


@pytest.fixture(autouse=True)
def _free_cached_blocks():
    yield
    torch.cuda.empty_cache()


@pytest.mark.parametrize("n,staged,via", [(128, True, "op"), (4096, True, "op"), (65536, True, "op"),
                                          (65536, False, "op"), (4096, True, "InplaceSoftmax")],
                         ids=["walked-rows", "register-rows", "staged-rows", "long-rows", "module"])
def test_more_than_2_31_elements_softmax(n, staged, via):
    rows = BIG // n + 1
    x = _big((rows, n), BF16, 1)
    with forced_route(staged_rows=staged):
        if via == "op":
            make_inplace.softmax_(x, -1, scale=0.5)
        else:
            InplaceSoftmax(-1)(x.mul_(0.5))
    x0 = _big((rows, n), BF16, 1)
    for s in _slices(rows, n):
        v = x0[s].double() * 0.5 if via == "op" else x0[s].mul(0.5).double()
        _close(x[s], torch.softmax(v, -1), TOL[BF16], f"rows {s}")


def test_more_than_2_31_elements_softmax_columns_and_backward():
    x = _big((2, 2**30 + 8), BF16, 2)  # dim 0: the columns kernel, offsets past 2**31
    make_inplace.softmax_(x, 0)
    x0 = _big((2, 2**30 + 8), BF16, 2)
    for s in _slices(x.shape[1], 2):
        _close(x[:, s], torch.softmax(x0[:, s].double(), 0), TOL[BF16], f"columns {s}")
    del x, x0
    rows, n = BIG // 4096 + 1, 4096
    y = torch.softmax(_big((rows, n), BF16, 3), -1)
    grad = _big((rows, n), BF16, 4)
    dx = op.softmax_backward(grad, y, -1, 0.5)
    for s in _slices(rows, n):
        g, yy = grad[s].double(), y[s].double()
        _close(dx[s], 0.5 * yy * (g - (g * yy).sum(-1, keepdim=True)), TOL[BF16] * 4, f"backward rows {s}")


@pytest.mark.parametrize("n,staged,via", [(128, True, "op"), (4096, True, "op"), (65536, True, "op"),
                                          (65536, False, "op"), (4096, True, "InplaceLayerNorm")],
                         ids=["walked-rows", "register-rows", "staged-rows", "long-rows", "module"])
def test_more_than_2_31_elements_layer_norm(n, staged, via):
    rows = BIG // n + 1
    w = (0.5 + torch.rand(n, device=DEVICE)).to(BF16)
    b = torch.randn(n, device=DEVICE).to(BF16)
    x = _big((rows, n), BF16, 5)
    with forced_route(staged_rows=staged), torch.no_grad():
        if via == "op":
            make_inplace.layer_norm_(x, n, w, b)
        else:
            module = InplaceLayerNorm(n, device=DEVICE, dtype=BF16)
            module.weight.copy_(w), module.bias.copy_(b)
            module(x)
    x0 = _big((rows, n), BF16, 5)
    for s in _slices(rows, n):
        _close(x[s], F.layer_norm(x0[s].double(), (n,), w.double(), b.double()), 2 * TOL[BF16], f"rows {s}")


def test_more_than_2_31_elements_layer_norm_backward():
    rows, n = BIG // 4096 + 1, 4096
    w = (0.5 + torch.rand(n, device=DEVICE)).to(BF16)
    b = torch.randn(n, device=DEVICE).to(BF16)
    y = _big((rows, n), BF16, 6)
    mean, rstd = op.layer_norm_stats_(y, [n], w, b, 1e-5)  # y now holds the output
    grad = _big((rows, n), BF16, 7)
    grad_x, grad_w, grad_b = op.layer_norm_backward(grad, y, [n], w, b, rstd, [True, True, True])
    gw, gb = torch.zeros(n, dtype=F64, device=DEVICE), torch.zeros(n, dtype=F64, device=DEVICE)
    for s in _slices(rows, n):
        g, x_hat = grad[s].double(), (y[s].double() - b.double()) / w.double()
        gx_hat = g * w.double()
        r = rstd[s].double()[:, None]
        expected = r * (gx_hat - gx_hat.mean(-1, keepdim=True) - x_hat * (gx_hat * x_hat).mean(-1, keepdim=True))
        _close(grad_x[s], expected, 8 * TOL[BF16], f"grad_input rows {s}")
        gw += (g * x_hat).sum(0)
        gb += g.sum(0)
    _close(grad_w, gw, 8 * TOL[BF16], "grad_weight")
    _close(grad_b, gb, 8 * TOL[BF16], "grad_bias")


@pytest.mark.parametrize("dtype,route,workspace", [
    (BF16, None, None), (BF16, None, 0), (BF16, "waves", 0), (BF16, "panels", 64 << 20), (F32, None, None),
    (F32, "ffma_grid", 0)], ids=["bf16-default", "bf16-no-workspace", "bf16-waves", "bf16-panels",
                                 "fp32-default", "fp32-ffma-grid"])
def test_more_than_2_31_elements_square_matmul(dtype, route, workspace):
    rows, n = BIG // 1024 + 1, 1024
    w = (torch.randn(n, n, device=DEVICE) / n**0.5).to(dtype)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    x = _big((rows, n), dtype, 8)
    with forced_route(route):
        make_inplace.square_matmul_(x, w, bias, transpose=True, workspace_bytes=workspace)
    x0 = _big((rows, n), dtype, 8)
    tol = {BF16: 1.2e-2, F32: 2e-5}[dtype]
    for s in _slices(rows, n):
        expected = x0[s].double() @ w.double().t() + bias.double()
        err = (x[s].double() - expected).norm() / expected.norm()
        assert err < tol, (s, err.item())


def test_more_than_2_31_elements_inplace_linear():
    rows, n = BIG // 1024 + 1, 1024
    layer = InplaceLinear(n, device=DEVICE, dtype=BF16).requires_grad_(False)
    x = _big((rows, n), BF16, 9)
    assert layer(x) is x
    x0 = _big((rows, n), BF16, 9)
    for s in _slices(rows, n):
        expected = F.linear(x0[s].double(), layer.weight.double(), layer.bias.double())
        assert (x[s].double() - expected).norm() / expected.norm() < 1.2e-2


def test_more_than_2_31_elements_trilinear():
    # feats past 2**31 elements
    n, f = BIG // (8 * 16) + 1, 16
    feats = _big((n, 8, f), BF16, 10)
    points = (torch.rand(n, 3, device=DEVICE) * 2 - 1).to(BF16)
    out = make_inplace.trilinear_interpolation(feats, points)
    for s in _slices(n, 8 * f):
        _close(out[s], trilinear_reference(feats[s].double(), points[s].double()), 2 * TOL[BF16], f"points {s}")
    # and its gradients: grad_feats past 2**31 elements
    grad_out = _big((n, f), BF16, 11)
    grad_feats, grad_points = make_inplace.trilinear_interpolation_backward(grad_out, points, feats)
    for s in _slices(n, 8 * f):
        fs, ps = feats[s].double().requires_grad_(), points[s].double().requires_grad_()
        trilinear_reference(fs, ps).backward(grad_out[s].double())
        _close(grad_feats[s], fs.grad, 4 * TOL[BF16], f"grad_feats {s}")
        _close(grad_points[s], ps.grad, 4 * TOL[BF16], f"grad_points {s}")
    del feats, grad_feats, out
    # out past 2**31 elements (feats broadcast over points: stride 0)
    n, f = BIG // 1024 + 1, 1024
    feats = _big((1, 8, f), BF16, 12).expand(n, 8, f)
    points = (torch.rand(n, 3, device=DEVICE) * 2 - 1).to(BF16)
    out = make_inplace.trilinear_interpolation(feats, points)
    for s in _slices(n, f):
        _close(out[s], trilinear_reference(feats[s].double(), points[s].double()), 2 * TOL[BF16], f"points {s}")


def test_more_than_2_31_elements_outer_product():
    n = m = 32769  # 2 * 32769**2 > 2**31
    a, b = _big((2, n), BF16, 13), _big((2, m), BF16, 14)
    out = make_inplace.outer_product(a, b)
    for i in range(2):
        for s in _slices(n, m):
            _close(out[i, s], a[i, s].double()[:, None] * b[i].double()[None, :], TOL[BF16], f"batch {i} rows {s}")
    del out
    grad_out = _big((2, n, m), BF16, 15)
    grad_a, grad_b = make_inplace.outer_product_backward(grad_out, a, b)
    for i in range(2):
        gb = torch.zeros(m, dtype=F64, device=DEVICE)
        for s in _slices(n, m):
            g = grad_out[i, s].double()
            _close(grad_a[i, s], g @ b[i].double(), 8 * TOL[BF16], f"grad_a batch {i} rows {s}")
            gb += a[i, s].double() @ g
        _close(grad_b[i], gb, 8 * TOL[BF16], f"grad_b batch {i}")


def test_more_than_2_31_elements_attention_scores():
    # The materialized core's one (N, H, L, S) scores buffer holds 2 * 32769**2 elements.
    e, heads, length = 16, 2, 32769
    torch.manual_seed(0)
    ours = InplaceMultiheadAttention(e, heads, core="materialized", device=DEVICE, dtype=BF16).eval()
    x = _big((1, length, e), BF16, 16)
    with torch.no_grad():
        out, _ = ours(x, x, x, need_weights=False)
    # float64 reference for a few query rows, among them the last ones.
    rows = torch.tensor([0, 1, length // 2, length - 2, length - 1], device=DEVICE)
    w, bias = ours.in_proj_weight.double(), ours.in_proj_bias.double()
    q, k, v = F.linear(x.double()[0], w, bias).split(e, -1)
    head = lambda t: t.view(-1, heads, e // heads).transpose(0, 1)  # noqa: E731
    scores = head(q[rows]) @ head(k).transpose(-1, -2) / math.sqrt(e // heads)
    attn = (torch.softmax(scores, -1) @ head(v)).transpose(0, 1).reshape(len(rows), e)
    expected = F.linear(attn, ours.out_proj.weight.double(), ours.out_proj.bias.double())
    _close(out[0, rows], expected, 4 * TOL[BF16], "attention rows")
