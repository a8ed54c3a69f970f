"""Exercises the CUDA MindSpore bridge without MindSpore (no MindSpore build
for CUDA 13 exists): loads libmake_inplace_ms_cuda.so with ctypes, calls every
entry point with the AOT convention on a real, non-default CUDA stream, and
compares with the PyTorch ops (make_inplace) on the same inputs. Needs a GPU,
torch with CUDA, make_inplace built in place, and nvcc (to build the bridge
unless --lib is given).

    python scripts/mindspore_cuda_check.py            # builds the library into a temp dir
    python scripts/mindspore_cuda_check.py --lib make_inplace_mindspore/libmake_inplace_ms_cuda.so

Prints one line per case and ends with 'N passed, N failed'; exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "make_inplace_mindspore"))

import _build  # noqa: E402  (the bridge's build helper; importable without MindSpore)

import make_inplace  # noqa: E402

DT = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64", torch.uint8: "uint8"}
KIND = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


class Bridge:
    def __init__(self, path: str, stream: torch.cuda.Stream):
        self.lib = ctypes.CDLL(path)
        self.lib.MakeInplaceLastError.restype = ctypes.c_char_p
        self.lib.MakeInplaceLayerNormBackwardWorkspace.restype = ctypes.c_int64
        self.lib.MakeInplaceLayerNormBackwardWorkspace.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
        self.stream = stream

    def __call__(self, name: str, *tensors: torch.Tensor, dtypes: list[str] | None = None) -> int:
        """Calls entry point `name` with `tensors` (inputs, then outputs) on the stream."""
        n = len(tensors)
        params = (ctypes.c_void_p * n)(*[t.data_ptr() for t in tensors])
        ndims = (ctypes.c_int * n)(*[t.dim() for t in tensors])
        keep = [(ctypes.c_int64 * max(t.dim(), 1))(*t.shape) for t in tensors]
        shapes = (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in keep])
        types = (ctypes.c_char_p * n)(*[d.encode() for d in (dtypes or [DT[t.dtype] for t in tensors])])
        fn = getattr(self.lib, name)
        fn.restype = ctypes.c_int
        # MindSpore hands an op inputs that are ready on its stream; tensors made
        # on torch's current stream must be waited for to give the same promise.
        self.stream.wait_stream(torch.cuda.current_stream())
        return fn(n, params, ndims, shapes, types, ctypes.c_void_p(self.stream.cuda_stream), None)

    def last_error(self) -> str:
        return self.lib.MakeInplaceLastError().decode()


def close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all() or not torch.isfinite(expected).all(), f"{what}: non-finite (unwritten?)"
    a, e = actual.double(), expected.double()
    scale = max(e.abs().max().item() if e.numel() else 0.0, 1.0)
    err = (a - e).abs().max().item() / scale if e.numel() else 0.0
    tol = TOL.get(expected.dtype, 1e-5)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol} ({expected.dtype})"


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def ok(bridge: Bridge, rc: int, name: str) -> None:
    assert rc == 0, f"{name} returned {rc}: {bridge.last_error()}"


def case_square_matmul(b: Bridge) -> None:
    for dtype in FLOATS:
        for shape in [(1, 64), (1000, 64), (3, 5, 128), (257, 256)]:
            n = shape[-1]
            for transpose in (False, True):
                for has_bias in (False, True):
                    x = torch.randn(shape, dtype=dtype, device="cuda")
                    w = (torch.randn(n, n, device="cuda") / n**0.5).to(dtype)
                    bias = torch.randn(n, dtype=dtype, device="cuda")
                    y = poisoned(shape, dtype)
                    name = "MakeInplaceSquareMatmul" + ("T" if transpose else "") + ("Bias" if has_bias else "")
                    rc = b(name, x, w, *([bias] if has_bias else []), y)
                    ok(b, rc, name)
                    b.stream.synchronize()
                    ref = x.clone()
                    make_inplace.square_matmul_(ref, w, bias if has_bias else None, transpose=transpose)
                    close(y, ref, f"{name} {dtype} {shape}")


def case_square_matmul_wide(b: Bridge) -> None:
    """A width the fused kernel may not handle: either right, or refused with a message and nothing written."""
    x = torch.randn(4, 8192, dtype=torch.float64, device="cuda")
    w = torch.randn(8192, 8192, dtype=torch.float64, device="cuda") / 90.0
    y = poisoned((4, 8192), torch.float64)
    rc = b("MakeInplaceSquareMatmul", x, w, y)
    b.stream.synchronize()
    if rc == 0:
        close(y, x @ w, "wide square matmul")
    else:
        assert "wider than the zero-workspace square matmul" in b.last_error(), b.last_error()
        assert torch.isnan(y).all()


def case_softmax(b: Bridge) -> None:
    for dtype in FLOATS:
        for shape, causal, mask_shape in [
            ((4, 1000), False, None),
            ((2, 3, 4097), False, None),
            ((2, 64, 64), True, None),
            ((2, 64, 33), False, (1, 64, 33)),
            ((2, 4, 16, 16), True, (2, 1, 1, 16)),
            ((0, 7), False, None),
        ]:
            x = 3 * torch.randn(shape, dtype=dtype, device="cuda")
            mask = None if mask_shape is None else torch.randn(mask_shape, dtype=dtype, device="cuda")
            y = poisoned(shape, dtype)
            name = "MakeInplaceSoftmax" + ("Causal" if causal else "") + ("Mask" if mask is not None else "")
            ok(b, b(name, x, *([] if mask is None else [mask]), y), name)
            b.stream.synchronize()
            ref = make_inplace.softmax_(x.clone(), -1, causal=causal, mask=mask)
            close(y, ref, f"{name} {dtype} {shape}")
            g = torch.randn(shape, dtype=dtype, device="cuda")
            dx = poisoned(shape, dtype)
            ok(b, b("MakeInplaceSoftmaxBackward", g, ref, dx), "MakeInplaceSoftmaxBackward")
            b.stream.synchronize()
            close(dx, torch.ops.make_inplace.softmax_backward(g, ref, -1, 1.0), f"softmax backward {dtype} {shape}")


def case_layer_norm(b: Bridge) -> None:
    for dtype in FLOATS:
        stat = torch.float64 if dtype == torch.float64 else torch.float32
        for rows, n in [(1, 1), (100, 33), (7, 1025), (3, 8192), (0, 16)]:
            for has_w in (False, True):
                for has_b in (False, True):
                    x = 2 + 3 * torch.randn(rows, n, dtype=dtype, device="cuda")
                    w = (1 + 0.5 * torch.randn(n, device="cuda")).to(dtype) if has_w else None
                    bias = torch.randn(n, dtype=dtype, device="cuda") if has_b else None
                    affine = [t for t in (w, bias) if t is not None]
                    eps = torch.tensor([1e-3], dtype=torch.float64, device="cuda")
                    y, mean, rstd = poisoned((rows, n), dtype), poisoned((rows,), stat), poisoned((rows,), stat)
                    suffix = ("Weight" if has_w else "") + ("Bias" if has_b else "")
                    ok(b, b("MakeInplaceLayerNorm" + suffix, x, *affine, eps, y, mean, rstd), "layer norm " + suffix)
                    b.stream.synchronize()
                    ref = x.clone()
                    ref_mean, ref_rstd = torch.ops.make_inplace.layer_norm_stats_(ref, [n], w, bias, 1e-3)
                    what = f"layer norm{suffix} {dtype} ({rows}, {n})"
                    close(y, ref, what + " y")
                    close(mean, ref_mean, what + " mean")
                    close(rstd, ref_rstd, what + " rstd")
                    g = torch.randn(rows, n, dtype=dtype, device="cuda")
                    nbytes = b.lib.MakeInplaceLayerNormBackwardWorkspace(KIND[dtype], rows, n, int(has_w or has_b))
                    workspace = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                    grads = [poisoned((rows, n), dtype)] + [poisoned((n,), dtype) for _ in affine]
                    name = "MakeInplaceLayerNormBackward" + suffix
                    ok(b, b(name, g, ref, *affine, ref_rstd, *grads, workspace), name)
                    b.stream.synchronize()
                    expected = torch.ops.make_inplace.layer_norm_backward(g, ref, [n], w, bias, ref_rstd, [True, has_w, has_b])
                    close(grads[0], expected[0], what + " grad_input")
                    if has_w:
                        close(grads[1], expected[1], what + " grad_weight")
                    if has_b:
                        close(grads[-1], expected[2], what + " grad_bias")


def case_trilinear(b: Bridge) -> None:
    for dtype in FLOATS:
        for n, f in [(1, 1), (1000, 32), (33, 130), (0, 4)]:
            feats = torch.randn(n, 8, f, dtype=dtype, device="cuda")
            points = (torch.rand(n, 3, device="cuda") * 2.4 - 1.2).to(dtype)
            out = poisoned((n, f), dtype)
            ok(b, b("MakeInplaceTrilinear", feats, points, out), "MakeInplaceTrilinear")
            b.stream.synchronize()
            close(out, make_inplace.trilinear_interpolation(feats, points), f"trilinear {dtype} ({n}, {f})")
            g = torch.randn(n, f, dtype=dtype, device="cuda")
            gf, gp = poisoned((n, 8, f), dtype), poisoned((n, 3), dtype)
            ok(b, b("MakeInplaceTrilinearBackward", g, points, feats, gf, gp), "MakeInplaceTrilinearBackward")
            b.stream.synchronize()
            rf, rp = torch.empty_like(gf), torch.empty_like(gp)
            torch.ops.make_inplace.trilinear_interpolation_backward(g, points, feats, False, grad_feats=rf, grad_points=rp)
            close(gf, rf, f"trilinear grad_feats {dtype}")
            close(gp, rp, f"trilinear grad_points {dtype}")


def case_outer_product(b: Bridge) -> None:
    for dtype in FLOATS:
        for a_shape, m in [((1,), 1), ((64, 33), 17), ((2, 3, 256), 65), ((0, 3), 2)]:
            a = torch.randn(a_shape, dtype=dtype, device="cuda")
            bb = torch.randn(*a_shape[:-1], m, dtype=dtype, device="cuda")
            out = poisoned((*a_shape, m), dtype)
            ok(b, b("MakeInplaceOuterProduct", a, bb, out), "MakeInplaceOuterProduct")
            b.stream.synchronize()
            close(out, make_inplace.outer_product(a, bb), f"outer product {dtype} {a_shape} x {m}")
            g = torch.randn(*a_shape, m, dtype=dtype, device="cuda")
            ga, gb = poisoned(a.shape, dtype), poisoned(bb.shape, dtype)
            ok(b, b("MakeInplaceOuterProductBackward", g, a, bb, ga, gb), "MakeInplaceOuterProductBackward")
            b.stream.synchronize()
            ra, rb = torch.empty_like(ga), torch.empty_like(gb)
            torch.ops.make_inplace.outer_product_backward(g, a, bb, False, grad_a=ra, grad_b=rb)
            close(ga, ra, f"outer product grad_a {dtype}")
            close(gb, rb, f"outer product grad_b {dtype}")


def case_runs_on_the_given_stream(b: Bridge) -> None:
    """The input is written on the bridge's stream behind a long sleep; a
    kernel launched on any other stream would read the NaN poison first."""
    src = torch.randn(512, 1000, device="cuda")
    x = poisoned((512, 1000), torch.float32)
    y = poisoned((512, 1000), torch.float32)
    torch.cuda.synchronize()
    with torch.cuda.stream(b.stream):
        torch.cuda._sleep(200_000_000)
        x.copy_(src)
    ok(b, b("MakeInplaceSoftmax", x, y), "MakeInplaceSoftmax")
    b.stream.synchronize()
    close(y, torch.softmax(src, -1), "softmax after a write on the same stream")


def case_bad_arguments_refused(b: Bridge) -> None:
    x = torch.randn(4, 8, device="cuda")
    w = torch.randn(8, 7, device="cuda")
    y = poisoned((4, 8), torch.float32)
    assert b("MakeInplaceSquareMatmul", x, w, y) != 0
    assert "weight must have shape (8, 8) to match x's last dimension, got (8, 7)" in b.last_error(), b.last_error()
    a16 = torch.randn(4, 8, device="cuda", dtype=torch.float16)
    assert b("MakeInplaceSoftmax", a16, y) != 0
    assert "output must have the dtype of x (float16), got float32" in b.last_error(), b.last_error()
    torch.cuda.synchronize()
    assert torch.isnan(y).all(), "a refused call wrote its output"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="a built libmake_inplace_ms_cuda.so (default: build one now)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    lib = args.lib
    if lib is None:
        from torch.utils import cpp_extension

        out_dir = tempfile.mkdtemp(prefix="make_inplace_ms_")
        major, minor = torch.cuda.get_device_capability()
        lib = _build.build_cuda(
            cpp_extension.include_paths()[0],
            out_dir,
            os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc"),
            archs=(f"{major}{minor}",),
        )
    torch.manual_seed(0)
    bridge = Bridge(lib, torch.cuda.Stream())
    cases = [v for k, v in globals().items() if k.startswith("case_")]
    passed = failed = 0
    for case in cases:
        try:
            case(bridge)
            passed += 1
            print(f"PASS {case.__name__}")
        except Exception:  # noqa: BLE001  (report every case, then fail)
            failed += 1
            print(f"FAIL {case.__name__}\n{traceback.format_exc()}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
