"""The shared argument validation: every op refuses, before it writes anything,
what would otherwise go wrong silently, and names itself and the argument.

Classes covered (each for every op that can meet it):
  1. a tensor on the ``meta`` device mixed with real ones (dispatch would run
     the fake kernel, which writes nothing);
  2. ``out=`` / gradient buffers that require grad under grad mode;
  3. in-place writes over views of leaves requiring grad (and the other views
     torch forbids to modify in place);
  4. inference tensors written outside ``torch.inference_mode()``;
  5. InplaceMultiheadAttention with head_dim 1;
  6. ``torch.compile(fullgraph=True)`` of softmax_ with a mask requiring grad;
plus aliasing between written buffers and inputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch import nn

import make_inplace
from make_inplace.nn import (
    InplaceLayerNorm,
    InplaceLinear,
    InplaceMultiheadAttention,
    InplaceSoftmax,
    InplaceTransformerEncoderLayer,
)

op = torch.ops.make_inplace


@dataclass
class Case:
    """One call: the op's public name, its tensor arguments, how to call it, what it writes."""

    op: str
    build: Callable[[], dict[str, torch.Tensor]]
    run: Callable[[dict[str, torch.Tensor]], object]
    written: tuple[str, ...]
    in_place: bool = False  # written over its input (x), rather than into a buffer


def _rand(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype)


def _layer_norm_saved():
    y = torch.nn.functional.layer_norm(_rand(3, 6), (6,))
    return {"grad_output": _rand(3, 6), "output": y, "weight": _rand(6), "bias": _rand(6),
            "rstd": torch.rand(3, dtype=torch.float64) + 0.5}


def _rms_norm_saved():
    y = torch.nn.functional.rms_norm(_rand(3, 6), (6,))
    return {"grad_output": _rand(3, 6), "output": y, "weight": _rand(6),
            "rstd": torch.rand(3, dtype=torch.float64) + 0.5}


# The public functions, then the torch.ops entry points (which reach the fake
# kernel directly, without the Python wrapper).
PUBLIC = [
    Case("square_matmul_", lambda: {"x": _rand(5, 4), "weight": _rand(4, 4), "bias": _rand(4)},
         lambda t: make_inplace.square_matmul_(t["x"], t["weight"], t["bias"]), ("x",), True),
    Case("softmax_", lambda: {"x": _rand(4, 6), "mask": _rand(6)},
         lambda t: make_inplace.softmax_(t["x"], -1, mask=t["mask"]), ("x",), True),
    Case("layer_norm_", lambda: {"x": _rand(3, 6), "weight": _rand(6), "bias": _rand(6)},
         lambda t: make_inplace.layer_norm_(t["x"], 6, t["weight"], t["bias"]), ("x",), True),
    Case("trilinear_interpolation", lambda: {"feats": _rand(5, 8, 3), "points": _rand(5, 3), "out": _rand(5, 3)},
         lambda t: make_inplace.trilinear_interpolation(t["feats"], t["points"], out=t["out"]), ("out",)),
    Case("trilinear_interpolation_backward",
         lambda: {"grad_out": _rand(5, 3), "points": _rand(5, 3), "feats": _rand(5, 8, 3),
                  "grad_feats": _rand(5, 8, 3), "grad_points": _rand(5, 3)},
         lambda t: make_inplace.trilinear_interpolation_backward(
             t["grad_out"], t["points"], t["feats"], grad_feats=t["grad_feats"], grad_points=t["grad_points"]),
         ("grad_feats", "grad_points")),
    Case("outer_product", lambda: {"a": _rand(2, 3), "b": _rand(2, 5), "out": _rand(2, 3, 5)},
         lambda t: make_inplace.outer_product(t["a"], t["b"], out=t["out"]), ("out",)),
    Case("outer_product_backward",
         lambda: {"grad_out": _rand(2, 3, 5), "a": _rand(2, 3), "b": _rand(2, 5),
                  "grad_a": _rand(2, 3), "grad_b": _rand(2, 5)},
         lambda t: make_inplace.outer_product_backward(t["grad_out"], t["a"], t["b"], grad_a=t["grad_a"], grad_b=t["grad_b"]),
         ("grad_a", "grad_b")),
    Case("rms_norm_", lambda: {"x": _rand(3, 6), "weight": _rand(6)},
         lambda t: make_inplace.rms_norm_(t["x"], 6, t["weight"]), ("x",), True),
]

RAW = [
    Case("square_matmul_", PUBLIC[0].build, lambda t: op.square_matmul_(t["x"], t["weight"], t["bias"]), ("x",), True),
    Case("softmax_", PUBLIC[1].build, lambda t: op.softmax_(t["x"], -1, mask=t["mask"]), ("x",), True),
    Case("softmax_backward", lambda: {"grad_output": _rand(4, 6), "output": torch.softmax(_rand(4, 6), -1)},
         lambda t: op.softmax_backward(t["grad_output"], t["output"], -1, 1.0), ()),
    Case("softmax_backward_", lambda: {"grad": _rand(4, 6), "output": torch.softmax(_rand(4, 6), -1)},
         lambda t: op.softmax_backward_(t["grad"], t["output"], -1, 1.0), ("grad",), True),
    Case("layer_norm_", PUBLIC[2].build, lambda t: op.layer_norm_(t["x"], [6], t["weight"], t["bias"]), ("x",), True),
    Case("layer_norm_stats_", PUBLIC[2].build, lambda t: op.layer_norm_stats_(t["x"], [6], t["weight"], t["bias"]), ("x",), True),
    Case("layer_norm_backward", _layer_norm_saved,
         lambda t: op.layer_norm_backward(t["grad_output"], t["output"], [6], t["weight"], t["bias"], t["rstd"],
                                          [True, True, True]), ()),
    Case("trilinear_interpolation", PUBLIC[3].build,
         lambda t: op.trilinear_interpolation(t["feats"], t["points"], out=t["out"]), ("out",)),
    Case("trilinear_interpolation_backward", PUBLIC[4].build,
         lambda t: op.trilinear_interpolation_backward(t["grad_out"], t["points"], t["feats"], False,
                                                       grad_feats=t["grad_feats"], grad_points=t["grad_points"]),
         ("grad_feats", "grad_points")),
    Case("outer_product", PUBLIC[5].build, lambda t: op.outer_product(t["a"], t["b"], out=t["out"]), ("out",)),
    Case("outer_product_backward", PUBLIC[6].build,
         lambda t: op.outer_product_backward(t["grad_out"], t["a"], t["b"], False, grad_a=t["grad_a"], grad_b=t["grad_b"]),
         ("grad_a", "grad_b")),
    Case("rms_norm_", PUBLIC[7].build, lambda t: op.rms_norm_(t["x"], [6], t["weight"]), ("x",), True),
    Case("rms_norm_stats_", PUBLIC[7].build, lambda t: op.rms_norm_stats_(t["x"], [6], t["weight"]), ("x",), True),
    Case("rms_norm_backward", _rms_norm_saved,
         lambda t: op.rms_norm_backward(t["grad_output"], t["output"], [6], t["weight"], t["rstd"], [True, True]), ()),
]


def _ids(cases):
    return [c.op for c in cases]


def _snapshot(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: t.detach().clone() for k, t in tensors.items() if t.device.type != "meta"}


def _assert_unchanged(tensors: dict[str, torch.Tensor], before: dict[str, torch.Tensor], what: str) -> None:
    for name, snap in before.items():
        now = tensors[name].detach()
        # Bytes, not values: the buffers may hold NaN patterns that torch.equal calls unequal.
        same = torch.equal(now.flatten().view(torch.uint8), snap.flatten().view(torch.uint8))
        assert same, f"{what}: {name} was written although the call was refused"


def _raises(case: Case, tensors, *patterns: str) -> str:
    """Calls case.run(tensors), expecting an error naming the op; returns the message."""
    with pytest.raises((RuntimeError, ValueError, TypeError)) as info:
        case.run(tensors)
    message = str(info.value)
    assert f"make_inplace.{case.op}:" in message, message
    for pattern in patterns:
        assert re.search(pattern, message), (pattern, message)
    return message


# ---------------------------------------------------------------- 1. meta mixes


def _meta_variants(cases):
    for case in cases:
        for name in case.build():
            yield pytest.param(case, name, id=f"{case.op}-{name}")


@pytest.mark.parametrize("case,meta_arg", list(_meta_variants(PUBLIC)))
def test_meta_mixed_with_cpu_raises_and_writes_nothing(case, meta_arg):
    tensors = case.build()
    tensors[meta_arg] = tensors[meta_arg].to("meta")
    before = _snapshot(tensors)
    _raises(case, tensors, re.escape(meta_arg), "device", r"\.to\(")
    _assert_unchanged(tensors, before, f"{case.op} with {meta_arg} on meta")


@pytest.mark.parametrize("case,meta_arg", list(_meta_variants(RAW)))
def test_meta_mixed_with_cpu_through_torch_ops_raises(case, meta_arg):
    # torch.ops skips the Python wrapper: the fake kernel that dispatch picks
    # for the mix must check devices itself.
    tensors = case.build()
    tensors[meta_arg] = tensors[meta_arg].to("meta")
    before = _snapshot(tensors)
    _raises(case, tensors, re.escape(meta_arg), "device")
    _assert_unchanged(tensors, before, f"torch.ops {case.op} with {meta_arg} on meta")


@pytest.mark.parametrize("case", PUBLIC, ids=_ids(PUBLIC))
def test_all_meta_is_accepted(case):
    # Meta tensors alone are fine (shape propagation, e.g. building on meta).
    tensors = {k: t.to("meta") for k, t in case.build().items()}
    case.run(tensors)


def test_trilinear_and_outer_product_without_out_refuse_a_meta_mix():
    with pytest.raises(RuntimeError, match=r"make_inplace\.trilinear_interpolation: .*points.*device"):
        make_inplace.trilinear_interpolation(_rand(5, 8, 3), _rand(5, 3).to("meta"))
    with pytest.raises(RuntimeError, match=r"make_inplace\.outer_product: .*b.*device"):
        make_inplace.outer_product(_rand(2, 3), _rand(2, 5).to("meta"))


# --------------------------------------------------- 2. buffers requiring grad

BUFFER_CASES = [c for c in PUBLIC if not c.in_place]


def _buffer_variants():
    for case in BUFFER_CASES:
        for name in case.written:
            for kind in ("leaf", "non-leaf"):
                yield pytest.param(case, name, kind, id=f"{case.op}-{name}-{kind}")


@pytest.mark.parametrize("case,buffer,kind", list(_buffer_variants()))
def test_buffer_requiring_grad_is_refused(case, buffer, kind):
    tensors = case.build()
    if kind == "leaf":
        tensors[buffer].requires_grad_()
        watched = tensors
    else:
        source = tensors[buffer].clone().requires_grad_()
        tensors[buffer] = source * 1.0
        watched = {**tensors, "source": source}
    before = _snapshot(watched)
    _raises(case, tensors, re.escape(buffer), "requires grad", r"no_grad\(\)")
    _assert_unchanged(watched, before, f"{case.op} with {buffer} requiring grad")


@pytest.mark.parametrize("case", BUFFER_CASES, ids=_ids(BUFFER_CASES))
def test_buffer_requiring_grad_is_allowed_under_no_grad(case):
    # As torch: out= into a tensor requiring grad is an untracked write under no_grad.
    tensors = case.build()
    for name in case.written:
        tensors[name].requires_grad_()
    with torch.no_grad():
        case.run(tensors)


def test_non_leaf_out_buffer_no_longer_gives_a_wrong_gradient():
    a = torch.randn(2, 3, 5, requires_grad=True)
    buf = a * 2
    u, v = torch.randn(2, 3), torch.randn(2, 5)
    with pytest.raises(RuntimeError, match=r"make_inplace\.outer_product: out"):
        make_inplace.outer_product(u, v, out=buf)
    buf.sum().backward()
    torch.testing.assert_close(a.grad, torch.full_like(a, 2.0))


# ------------------------------------------------------ 3. views of leaves etc.

IN_PLACE = [c for c in PUBLIC if c.in_place]


def _leaf(t: torch.Tensor):
    leaf = t.clone().requires_grad_()
    return leaf, leaf


def _view_of_leaf(t: torch.Tensor):
    leaf = torch.cat([torch.randn(2, *t.shape[1:], dtype=t.dtype), t]).requires_grad_()
    return leaf, leaf[2:]


def _no_grad_view(t: torch.Tensor):
    leaf = t.clone().requires_grad_()
    with torch.no_grad():
        view = leaf[:]
    return leaf, view


def _no_grad_view_of_non_leaf(t: torch.Tensor):
    leaf = t.clone().requires_grad_()
    h = leaf * 1.0
    with torch.no_grad():
        view = h[:]
    return leaf, view


def _multi_output_view(t: torch.Tensor):
    leaf = torch.stack([t, t]).requires_grad_()
    return leaf, (leaf * 1.0).unbind(0)[0]


VIEW_KINDS = {
    "leaf": (_leaf, r"x is a leaf"),
    "view-of-leaf": (_view_of_leaf, r"view of a leaf"),
    "no_grad-view": (_no_grad_view, r"no_grad"),
    "no_grad-view-of-non-leaf": (_no_grad_view_of_non_leaf, r"no_grad"),
    "multi-output-view": (_multi_output_view, r"views"),
}


@pytest.mark.parametrize("kind", list(VIEW_KINDS))
@pytest.mark.parametrize("case", IN_PLACE, ids=_ids(IN_PLACE))
def test_in_place_over_views_torch_forbids_is_refused_before_writing(case, kind):
    make, pattern = VIEW_KINDS[kind]
    tensors = case.build()
    leaf, x = make(tensors["x"])
    tensors["x"] = x
    before = _snapshot({**tensors, "leaf": leaf})
    _raises(case, tensors, r"\bx\b", pattern, r"clone\(\)")
    _assert_unchanged({**tensors, "leaf": leaf}, before, f"{case.op} over a {kind}")


# torch's out-of-place formula for each in-place op, as the gradient reference.
REFERENCE = {
    "square_matmul_": lambda t: t["x"] @ t["weight"] + t["bias"],
    "softmax_": lambda t: torch.softmax(t["x"] + t["mask"], -1),
    "layer_norm_": lambda t: torch.nn.functional.layer_norm(t["x"], (6,), t["weight"], t["bias"]),
    "rms_norm_": lambda t: torch.nn.functional.rms_norm(t["x"], (6,), t["weight"]),
}


@pytest.mark.parametrize("case", IN_PLACE, ids=_ids(IN_PLACE))
def test_in_place_over_a_view_of_a_non_leaf_is_allowed_and_differentiable(case):
    # What torch allows (a view of a non-leaf) must keep working, with torch's grads.
    tensors = case.build()
    rows = slice(2, 2 + tensors["x"].shape[0])
    base = torch.randn(rows.stop + 2, *tensors["x"].shape[1:], dtype=torch.float64)
    weights = torch.randn(base.shape, dtype=torch.float64)

    leaf = base.clone().requires_grad_()
    h = leaf * 1.0
    case.run({**tensors, "x": h[rows]})
    (h * weights).sum().backward()

    ref_leaf = base.clone().requires_grad_()
    ref_h = ref_leaf * 1.0
    ref_h = torch.cat([ref_h[: rows.start], REFERENCE[case.op]({**tensors, "x": ref_h[rows]}), ref_h[rows.stop :]])
    (ref_h * weights).sum().backward()
    torch.testing.assert_close(h.detach(), ref_h.detach())
    torch.testing.assert_close(leaf.grad, ref_leaf.grad)


MODULES = {
    "InplaceSoftmax": (lambda: InplaceSoftmax(-1).double(), (4, 6)),
    "InplaceLayerNorm": (lambda: InplaceLayerNorm(6).double(), (4, 6)),
    "InplaceLinear": (lambda: InplaceLinear(6).double().requires_grad_(False), (4, 6)),
}
MODULE_OPS = {"InplaceSoftmax": "softmax_", "InplaceLayerNorm": "layer_norm_", "InplaceLinear": "square_matmul_"}


@pytest.mark.parametrize("name", list(MODULES))
def test_modules_refuse_a_view_of_a_leaf_before_writing(name):
    make, shape = MODULES[name]
    module = make()
    leaf = torch.randn(6, *shape[1:], dtype=torch.float64, requires_grad=True)
    before = leaf.detach().clone()
    with pytest.raises(RuntimeError, match=rf"make_inplace\.{MODULE_OPS[name]}: x is a view of a leaf"):
        module(leaf[1:5])
    assert torch.equal(leaf.detach(), before)


def test_square_matmul_names_itself_when_the_weight_requires_grad():
    x, w = _rand(3, 4), _rand(4, 4).requires_grad_()
    before = x.clone()
    with pytest.raises(RuntimeError, match=r"make_inplace\.square_matmul_: weight requires grad"):
        make_inplace.square_matmul_(x, w)
    assert torch.equal(x, before)


# ------------------------------------------------------- 4. inference tensors


def _written_variants(cases):
    for case in cases:
        for name in case.written:
            yield pytest.param(case, name, id=f"{case.op}-{name}")


def _inference_copy(t: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return t.clone()


@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("case,written", list(_written_variants(PUBLIC)))
def test_inference_tensor_written_outside_inference_mode_is_refused(case, written, grad_mode):
    tensors = case.build()
    tensors[written] = _inference_copy(tensors[written])
    before = _snapshot(tensors)
    with torch.set_grad_enabled(grad_mode):
        _raises(case, tensors, re.escape(written), "inference", r"inference_mode\(\)", r"clone\(\)")
    _assert_unchanged(tensors, before, f"{case.op} with an inference {written}")


@pytest.mark.parametrize("case,written", list(_written_variants(RAW)))
def test_inference_tensor_written_through_torch_ops_is_refused(case, written):
    tensors = case.build()
    tensors[written] = _inference_copy(tensors[written])
    before = _snapshot(tensors)
    _raises(case, tensors, re.escape(written), "inference")
    _assert_unchanged(tensors, before, f"torch.ops {case.op} with an inference {written}")


@pytest.mark.parametrize("case", PUBLIC, ids=_ids(PUBLIC))
def test_inference_tensors_inside_inference_mode_and_as_inputs_are_fine(case):
    with torch.inference_mode():
        tensors = case.build()
        case.run(tensors)
    # Read-only inference inputs outside inference mode are fine too, as in torch.
    tensors = case.build()
    for name in tensors:
        if name not in case.written:
            tensors[name] = _inference_copy(tensors[name])
    case.run(tensors)


# ------------------------------------------------------------------ aliasing

ALIASES = {
    "square_matmul_": [("x", "weight"), ("x", "bias")],
    "softmax_": [("x", "mask")],
    "layer_norm_": [("x", "weight"), ("x", "bias")],
    "rms_norm_": [("x", "weight")],
    "trilinear_interpolation": [("out", "feats"), ("out", "points")],
    "trilinear_interpolation_backward": [("grad_feats", "grad_out"), ("grad_feats", "points"), ("grad_feats", "feats"),
                                         ("grad_points", "grad_out"), ("grad_points", "points"),
                                         ("grad_points", "feats"), ("grad_feats", "grad_points")],
    "outer_product": [("out", "a"), ("out", "b")],
    "outer_product_backward": [("grad_a", "grad_out"), ("grad_a", "a"), ("grad_a", "b"), ("grad_b", "grad_out"),
                               ("grad_b", "a"), ("grad_b", "b"), ("grad_a", "grad_b")],
}


def _alias_variants():
    for case in PUBLIC:
        for written, read in ALIASES[case.op]:
            yield pytest.param(case, written, read, id=f"{case.op}-{written}-{read}")


@pytest.mark.parametrize("case,written,read", list(_alias_variants()))
def test_written_tensor_sharing_memory_with_another_argument_is_refused(case, written, read):
    tensors = case.build()
    # One storage holds both: `read` at the front, `written` overlapping its last element.
    r, w = tensors[read], tensors[written]
    pool = torch.randn(r.numel() + w.numel(), dtype=r.dtype)
    tensors[read] = pool[: r.numel()].view(r.shape)
    tensors[written] = pool[r.numel() - 1 : r.numel() - 1 + w.numel()].view(w.shape)
    before = {"pool": pool.clone()}
    _raises(case, tensors, "share memory")
    _assert_unchanged({"pool": pool}, before, f"{case.op} with {written} over {read}")


# ---------------------------------------------------------- 5. head_dim == 1


@pytest.mark.parametrize("core", ["auto", "materialized"])
@pytest.mark.parametrize("grad", [False, True])
def test_attention_with_head_dim_one_matches_torch(core, grad):
    torch.manual_seed(0)
    e = heads = 4
    ref = nn.MultiheadAttention(e, heads, batch_first=True, dtype=torch.float64)
    ours = InplaceMultiheadAttention(e, heads, dtype=torch.float64, core=core)
    ours.load_state_dict(ref.state_dict())
    if not grad:
        for m in (ref, ours):
            m.requires_grad_(False)
    x = torch.randn(3, 5, e, dtype=torch.float64, requires_grad=grad)
    x_ref = x.detach().clone().requires_grad_(grad)
    out, _ = ours(x, x, x, need_weights=False)
    expected, _ = ref(x_ref, x_ref, x_ref, need_weights=False)
    torch.testing.assert_close(out, expected)
    if grad:
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)


def test_encoder_layer_with_head_dim_one_matches_torch():
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(4, 4, 8, dropout=0.0, batch_first=True, dtype=torch.float64).eval()
    ours = InplaceTransformerEncoderLayer(4, 4, 8, dropout=0.0, dtype=torch.float64).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x))


# ------------------------------------------------ 6. compile, mask with grad


@pytest.mark.parametrize("mask_shape", [(4, 6), (6,)], ids=["mask-of-x-shape", "broadcast-mask"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph_softmax_with_mask_requiring_grad(backend, mask_shape):
    torch._dynamo.reset()

    def f(x, mask):
        return make_inplace.softmax_(x * 1.0, -1, scale=0.5, mask=mask)

    compiled = torch.compile(f, backend=backend, fullgraph=True)
    x0, m0, g = torch.randn(4, 6), torch.randn(mask_shape), torch.randn(4, 6)
    x, m = x0.clone().requires_grad_(), m0.clone().requires_grad_()
    compiled(x, m).backward(g)
    x_ref, m_ref = x0.clone().requires_grad_(), m0.clone().requires_grad_()
    torch.softmax(x_ref * 0.5 + m_ref, -1).backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(m.grad, m_ref.grad)


# ------------------------------------------------- C++ errors name the op too


def _bad_cpp_calls():
    """(op, call, pattern): arguments only the C++ checks refuse."""
    x = _rand(4, 6)
    y = torch.softmax(_rand(4, 6), -1)
    saved = _layer_norm_saved()
    yield "square_matmul_", lambda: op.square_matmul_(torch.arange(8).view(2, 4), torch.eye(4)), "x must have dtype"
    yield "square_matmul_", lambda: op.square_matmul_(_rand(3, 4), _rand(3, 3)), "weight must have shape"
    yield "square_matmul_", lambda: op.square_matmul_(_rand(3, 4), _rand(4, 4), workspace_bytes=-1), "workspace_bytes"
    yield "softmax_", lambda: op.softmax_(x, 2), "dim must be in"
    yield "softmax_", lambda: op.softmax_(x, 0, causal=True), "causal=True"
    # The mask: x's dtype, at most x's dims, each trailing dim 1 or x's.
    yield "softmax_", lambda: op.softmax_(x, mask=_rand(6, dtype=torch.float32)), "mask must have the same dtype as x"
    yield "softmax_", lambda: op.softmax_(x, mask=_rand(5)), "mask must be broadcastable"
    yield "softmax_", lambda: op.softmax_(x, mask=_rand(2, 4, 6)), "mask must be broadcastable"
    yield "softmax_backward", lambda: op.softmax_backward(_rand(4, 5), y, -1, 1.0), "grad_output must have output's shape"
    yield "softmax_backward_", lambda: op.softmax_backward_(_rand(6, 4).t(), y, -1, 1.0), "grad must be contiguous"
    yield "layer_norm_", lambda: op.layer_norm_(x, [6], None, None, -1e-5), r"eps must be >= 0"
    yield "layer_norm_", lambda: op.layer_norm_(x, [6], None, None, float("nan")), r"eps must be >= 0 \(and not NaN\)"
    yield "layer_norm_", lambda: op.layer_norm_(x, [5]), "normalized_shape"
    yield "layer_norm_stats_", lambda: op.layer_norm_stats_(x, [6], None, None, -1.0), r"eps must be >= 0"
    yield "layer_norm_backward", lambda: op.layer_norm_backward(
        saved["grad_output"], saved["output"], [6], saved["weight"], saved["bias"], saved["rstd"].float(),
        [True, True, True]), "rstd must have dtype"
    yield "rms_norm_", lambda: op.rms_norm_(x, [6], None, -1e-5), r"eps must be >= 0"
    yield "rms_norm_", lambda: op.rms_norm_(x, [6], None, float("nan")), r"eps must be >= 0 \(and not NaN\)"
    yield "rms_norm_", lambda: op.rms_norm_(x, [5]), "normalized_shape"
    yield "rms_norm_", lambda: op.rms_norm_(x, [6], _rand(6, dtype=torch.float32)), "weight must have the same dtype"
    yield "rms_norm_stats_", lambda: op.rms_norm_stats_(x, [6], None, -1.0), r"eps must be >= 0"
    rms_saved = _rms_norm_saved()
    yield "rms_norm_backward", lambda: op.rms_norm_backward(
        rms_saved["grad_output"], rms_saved["output"], [6], rms_saved["weight"], rms_saved["rstd"].float(),
        [True, True]), "rstd must have dtype"
    yield "trilinear_interpolation", lambda: op.trilinear_interpolation(_rand(5, 7, 3), _rand(5, 3), out=_rand(5, 3)), "8 corners"
    yield "trilinear_interpolation_backward", lambda: op.trilinear_interpolation_backward(
        _rand(5, 3), _rand(5, 3), None, False, grad_feats=_rand(5, 8, 3), grad_points=_rand(5, 3)), "grad_points needs feats"
    yield "outer_product", lambda: op.outer_product(_rand(2, 3), _rand(3, 5), out=_rand(2, 3, 5)), "leading dimensions"
    yield "outer_product_backward", lambda: op.outer_product_backward(
        _rand(2, 3, 4), _rand(2, 3), _rand(2, 5), False, grad_a=None, grad_b=None), "grad_out must have shape"


@pytest.mark.parametrize("name,call,pattern", [pytest.param(*c, id=f"{c[0]}-{c[2][:30]}") for c in _bad_cpp_calls()])
def test_cpp_errors_name_the_op_and_argument(name, call, pattern):
    with pytest.raises((RuntimeError, ValueError, TypeError)) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"make_inplace.{name}: "), message
    assert re.search(pattern, message), (pattern, message)


@pytest.mark.parametrize("name", ["layer_norm_", "rms_norm_"])
def test_public_norms_refuse_negative_and_nan_eps_unchanged(name):
    for eps in (-1e-5, float("nan")):
        x = _rand(4, 6)
        before = x.clone()
        with pytest.raises(RuntimeError, match=rf"make_inplace\.{name}: eps must be >= 0"):
            getattr(make_inplace, name)(x, 6, eps=eps)
        assert torch.equal(x, before)


@pytest.mark.parametrize("case,written", list(_written_variants(RAW)))
def test_torch_ops_refuse_to_write_a_tensor_autograd_tracks(case, written):
    # torch.ops.make_inplace.* has no autograd formula (the Python functions add
    # it): a write into a tensor requiring grad would go unseen by autograd.
    tensors = case.build()
    source = tensors[written].clone().requires_grad_()
    tensors[written] = source * 1.0
    before = _snapshot({**tensors, "source": source})
    _raises(case, tensors, re.escape(written), "requires grad", r"no_grad\(\)")
    _assert_unchanged({**tensors, "source": source}, before, f"torch.ops {case.op} writing {written}")
    with torch.no_grad():
        case.run(tensors)
