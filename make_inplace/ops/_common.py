"""The one argument-validation step every op runs before it writes anything.

``validate_call`` runs in each op's Python wrapper before dispatch (unless
the library's eager entry point took the call: plain tensors, nothing that
any check here could refuse; ``csrc/python/eager_calls.cpp``), and
``check_devices`` again in each fake kernel: a real tensor mixed with a
``meta`` one dispatches to the fake kernel, which writes nothing, so without
that check the call would silently do nothing. The C++ kernels then check
shapes, dtypes, layouts and aliasing before their first write. Every error
starts with ``make_inplace.<op>:``, names the argument, and says what to do.
"""

from __future__ import annotations

from typing import Iterable, NoReturn, Optional, Sequence, Tuple

import torch

Arg = Tuple[str, Optional[torch.Tensor]]

is_compiling = torch.compiler.is_compiling

_CreationMeta = torch._C._autograd.CreationMeta
# Views torch itself refuses to modify in place with grad mode on, and why.
_FORBIDDEN_VIEWS = {
    _CreationMeta.NO_GRAD_MODE: "a view created under torch.no_grad() of a tensor that requires grad",
    _CreationMeta.INFERENCE_MODE: "a view created under torch.inference_mode() of a tensor that requires grad",
    _CreationMeta.MULTI_OUTPUT_NODE: "one of several views returned by one op (unbind, split, chunk, ...)",
    _CreationMeta.IN_CUSTOM_FUNCTION: "a view returned by a custom autograd.Function",
}


def fail(op: str, message: str, error: type[Exception] = RuntimeError) -> NoReturn:
    raise error(f"make_inplace.{op}: {message}")


def _defined(args: Iterable[Arg]) -> list[tuple[str, torch.Tensor]]:
    return [(name, t) for name, t in args if t is not None]


def check_devices(op: str, *args: Arg) -> None:
    """All tensor arguments on one device (the fake kernels run this too)."""
    tensors = _defined(args)
    if not tensors:
        return
    ref_name, ref = tensors[0]
    for name, t in tensors[1:]:
        if t.device != ref.device:
            fail(op, f"{name} is on {t.device}, but {ref_name} is on {ref.device}; all tensor "
                     f"arguments must be on one device: move {name} with .to({ref_name}.device)")


def _dtensor_type() -> type | None:
    global _DTENSOR
    if _DTENSOR is None:
        _DTENSOR = type(None)
        if torch.distributed.is_available():
            from torch.distributed.tensor import DTensor

            _DTENSOR = DTensor
    return _DTENSOR


_DTENSOR: type | None = None


def _check_not_sharded(op: str, tensors: list[tuple[str, torch.Tensor]]) -> None:
    # A DTensor (FSDP2's sharded parameters) holds only this rank's shard.
    dtensor = _dtensor_type()
    for name, t in tensors:
        if isinstance(t, dtensor):
            fail(op, f"{name} is a DTensor (sharded, e.g. an FSDP parameter outside its module's "
                     f"forward), but the op needs the whole tensor on this device: call it inside "
                     f"the FSDP module's forward, where parameters are unsharded, or pass "
                     f"{name}.full_tensor()")


def _check_not_inference(op: str, written: list[tuple[str, torch.Tensor]]) -> None:
    if torch.is_inference_mode_enabled():
        return
    for name, t in written:
        if t.is_inference():
            fail(op, f"{name} is an inference tensor (made under torch.inference_mode()) and cannot "
                     f"be written outside inference mode, as in torch; call the op inside "
                     f"torch.inference_mode() or pass {name}.clone()")


def _check_in_place(op: str, name: str, x: torch.Tensor) -> None:
    """torch's rules for an in-place write with grad mode on and an input requiring grad."""
    if x._is_view():
        reason = _FORBIDDEN_VIEWS.get(torch._C._autograd._get_creation_meta(x))
        if reason is not None:
            fail(op, f"{name} is {reason}; torch forbids writing such a view in place while grad "
                     f"mode is on. Pass {name}.clone(), or make the view and call the op both "
                     f"inside or both outside torch.no_grad()")
        if x.requires_grad and x._base.is_leaf:
            fail(op, f"{name} is a view of a leaf Variable that requires grad; writing it in place "
                     f"would change the leaf behind autograd. Pass {name}.clone(), or call the op "
                     f"under torch.no_grad() if autograd must not track it")
    elif x.requires_grad and x.is_leaf:
        fail(op, f"{name} is a leaf Variable that requires grad; writing it in place would change it "
                 f"behind autograd. Pass {name}.clone(), or call the op under torch.no_grad() if "
                 f"autograd must not track it")


def _check_buffers(op: str, buffers, inputs, differentiable: bool) -> None:
    """Buffers (out=, grad_*=) are written untracked: refused under autograd, as torch's out=."""
    for name, t in buffers:
        if t.requires_grad:
            fail(op, f"{name}= arguments don't support automatic differentiation, but {name} itself "
                     f"requires grad (the op would write it behind autograd); pass a buffer that "
                     f"does not require grad"
                     + (f", drop {name}= to get a differentiable result" if differentiable else "")
                     + ", or call the op under torch.no_grad()")
    for name, t in inputs:
        if t.requires_grad:
            if differentiable:
                what = f"{'/'.join(n + '=' for n, _ in buffers)} arguments don't support automatic differentiation"
            else:
                what = "its results are not differentiable (no double backward)"
            fail(op, f"{what}, but {name} requires grad; pass {name}.detach()"
                     + (", drop the buffer to get a differentiable result," if differentiable else "")
                     + " or call the op under torch.no_grad()")


def validate_call(
    op: str,
    *,
    inputs: Sequence[Arg] = (),
    in_place: Sequence[Arg] = (),
    buffers: Sequence[Arg] = (),
    differentiable: bool = True,
) -> None:
    """Every check that needs Python, before anything is written.

    ``in_place``: tensors overwritten with a result computed from them (x).
    ``buffers``: caller buffers that receive results (out=, grad_feats=, ...).
    ``differentiable``: whether the op has a backward (without buffers).
    One pass over the arguments: this runs on every call, so it stays cheap.
    """
    compiling = torch.compiler.is_compiling()
    inference_mode = compiling or torch.is_inference_mode_enabled()
    dtensor = _DTENSOR if _DTENSOR is not None else _dtensor_type()
    ref_device = None
    requires_grad = False
    for group, written in ((in_place, True), (inputs, False), (buffers, True)):
        for name, t in group:
            if t is None:
                continue
            if ref_device is None:
                ref_device = t.device
            elif t.device != ref_device:
                check_devices(op, *in_place, *inputs, *buffers)  # raises, naming both
            if not compiling and type(t) is not torch.Tensor and isinstance(t, dtensor):
                _check_not_sharded(op, [(name, t)])
            if written and not inference_mode and t.is_inference():
                _check_not_inference(op, [(name, t)])
            requires_grad = requires_grad or t.requires_grad
    if not (requires_grad and torch.is_grad_enabled()):
        return
    given = _defined(buffers)
    if given or not differentiable:
        _check_buffers(op, given, _defined((*in_place, *inputs)), differentiable)
    if not compiling:
        # Dynamo traces none of these view checks.
        for name, t in in_place:
            if t is not None:
                _check_in_place(op, name, t)

