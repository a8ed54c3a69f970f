"""Host time of one eager call per op: through the eager entry points and
through torch.ops (the entry switched off), against torch's own call.

    python lab/host_time.py --device cuda

On CUDA this is the launch-side time (no synchronize inside the loop), which
is what a small model's step is made of. Medians of alternated rounds, in us.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch
import torch.nn.functional as F

import make_inplace

# The op modules (make_inplace.ops re-exports functions of the same names).
layer_norm, outer_product, rms_norm, softmax, square_matmul, trilinear = (
    importlib.import_module(f"make_inplace.ops.{name}")
    for name in ("layer_norm", "outer_product", "rms_norm", "softmax", "square_matmul", "trilinear")
)


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def cases(device: str):
    x = torch.randn(8, 64, device=device)
    w = torch.linalg.qr(torch.randn(64, 64))[0].to(device)
    g, b = torch.randn(64, device=device), torch.randn(64, device=device)
    a, c = torch.randn(4, 16, device=device), torch.randn(4, 16, device=device)
    out = torch.empty(4, 16, 16, device=device)
    feats, points, tri_out = torch.randn(32, 8, 4, device=device), torch.rand(32, 3, device=device), torch.empty(32, 4, device=device)
    return [
        ("square_matmul_ (8, 64)", square_matmul, lambda: make_inplace.square_matmul_(x, w), lambda: torch.matmul(x, w)),
        ("softmax_ (8, 64)", softmax, lambda: make_inplace.softmax_(x, -1), lambda: torch.softmax(x, -1)),
        ("layer_norm_ (8, 64)", layer_norm, lambda: make_inplace.layer_norm_(x, 64, g, b), lambda: F.layer_norm(x, (64,), g, b)),
        ("rms_norm_ (8, 64)", rms_norm, lambda: make_inplace.rms_norm_(x, 64, g), lambda: F.rms_norm(x, (64,), g)),
        ("outer_product out= (4, 16, 16)", outer_product, lambda: make_inplace.outer_product(a, c, out=out),
         lambda: torch.mul(a[..., :, None], c[..., None, :], out=out)),
        ("trilinear out= (32, 4)", trilinear, lambda: make_inplace.trilinear_interpolation(feats, points, out=tri_out),
         None),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, device {args.device}, us per call (median of {args.rounds} rounds)")
    print(f"{'op':34s} {'entry':>7s} {'torch.ops':>10s} {'torch':>7s}")
    for name, module, ours, theirs in cases(args.device):
        entry = module._eager
        times = {"entry": [], "ops": [], "torch": []}
        for _ in range(args.rounds):
            module._eager = entry
            times["entry"].append(per_call_us(ours, args.calls))
            module._eager = None
            times["ops"].append(per_call_us(ours, args.calls))
            if theirs is not None:
                times["torch"].append(per_call_us(theirs, args.calls))
            if args.device == "cuda":
                torch.cuda.synchronize()
        module._eager = entry
        med = {k: statistics.median(v) if v else float("nan") for k, v in times.items()}
        print(f"{name:34s} {med['entry']:7.2f} {med['ops']:10.2f} {med['torch']:7.2f}")


if __name__ == "__main__":
    main()
