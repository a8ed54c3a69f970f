"""make_inplace's CPU kernels against torch eager at the main job's and the
CPU benchmarks' shapes, timed in one process (lab: one machine's sweep).

    python lab/cpu_sweep.py [--threads N] [--only SUBSTR] [--reps R] [--json PATH]

Each case alternates rounds of ours and torch (ROUNDS rounds of --reps calls
each, every call timed on its own) and reports the medians over all calls, so
a burst of load from another process hits both sides alike, and the 20th
percentiles: on a loaded 2-core machine a call whose threads wait for a core
takes a whole scheduler slice (4 or 8 ms), so when such calls are more than
half, the median shows the slice and only the low percentile the kernel. The
load average before and after is printed: on a shared machine, rerun when it
is high.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

import make_inplace as mi
from make_inplace.nn import InplaceLinear

ROUNDS = 8
Case = tuple[str, Callable[[], tuple[Callable[[], object], Callable[[], object]]]]


def _softmax(shape, dtype=torch.float32, scale=None, causal=False, masked=False, dim=-1):
    def make():
        x = torch.randn(shape, dtype=dtype)
        mask = None
        if masked:
            mask = torch.zeros(shape[-2], shape[-1], dtype=dtype)
            mask[torch.rand(shape[-2], shape[-1]) < 0.3] = float("-inf")
            mask[:, 0] = 0  # no all-masked rows

        def reference():
            v = x * scale if scale is not None else x
            if causal:
                cut = torch.ones(shape[-2], shape[-1], dtype=torch.bool).triu(1)
                v = v.masked_fill(cut, float("-inf"))
            if mask is not None:
                v = v + mask
            return torch.softmax(v, dim)

        return (lambda: mi.softmax_(x, dim, scale=scale, causal=causal, mask=mask)), reference

    extras = (f" scale={scale}" if scale else "") + (" causal" if causal else "") + (" mask" if masked else "")
    extras += f" dim={dim}" if dim != -1 else ""
    return (f"softmax_ {tuple(shape)} {str(dtype)[6:]}{extras}", make)


def _layer_norm(rows, n, dtype=torch.float32):
    def make():
        x = torch.randn(rows, n, dtype=dtype) * 2 + 1
        w, b = torch.randn(n, dtype=dtype), torch.randn(n, dtype=dtype)
        return (lambda: mi.layer_norm_(x, n, w, b)), (lambda: F.layer_norm(x, (n,), w, b))

    return (f"layer_norm_ ({rows}, {n}) {str(dtype)[6:]}", make)


def _rms_norm(rows, n, dtype=torch.float32):
    def make():
        x = torch.randn(rows, n, dtype=dtype) * 2 + 1
        w = 1 + 0.1 * torch.randn(n, dtype=dtype)
        return (lambda: mi.rms_norm_(x, n, w)), (lambda: F.rms_norm(x, (n,), w))

    return (f"rms_norm_ ({rows}, {n}) {str(dtype)[6:]}", make)


def _square_matmul(rows, n, dtype=torch.float32, workspace=None):
    def make():
        x = torch.randn(rows, n, dtype=dtype)
        w = (torch.randn(n, n, dtype=dtype) / n**0.5).to(dtype)
        return (lambda: mi.square_matmul_(x, w, workspace_bytes=workspace)), (lambda: torch.matmul(x, w))

    label = "" if workspace is None else f" ws={workspace}"
    return (f"square_matmul_ ({rows}, {n}) {str(dtype)[6:]}{label}", make)


def _linear(n, length, d, dtype=torch.float32):
    def make():
        torch.manual_seed(0)
        linear = nn.Linear(d, d, dtype=dtype).requires_grad_(False)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(d, d, dtype=dtype) / d**0.5)
        ours = InplaceLinear(d, dtype=dtype).requires_grad_(False)
        ours.load_state_dict(linear.state_dict())
        x = torch.randn(n, length, d, dtype=dtype)
        return (lambda: ours(x)), (lambda: linear(x))

    return (f"InplaceLinear ({n}, {length}, {d}) {str(dtype)[6:]}", make)


def _outer(batch, n, m, dtype=torch.float32, backward=False):
    def make():
        a, b = torch.randn(batch, n, dtype=dtype), torch.randn(batch, m, dtype=dtype)
        if not backward:
            out = torch.empty(batch, n, m, dtype=dtype)
            return (lambda: mi.outer_product(a, b, out=out)), (lambda: a[..., :, None] * b[..., None, :])
        g = torch.randn(batch, n, m, dtype=dtype)
        ga, gb = torch.empty_like(a), torch.empty_like(b)

        def reference():  # the main job's two bmm; the benchmark's broadcast-sum is timed as a second case
            return torch.bmm(g, b[..., None]).squeeze(-1), torch.bmm(a[:, None, :], g).squeeze(1)

        return (lambda: mi.outer_product_backward(g, a, b, grad_a=ga, grad_b=gb)), reference

    return (f"outer_product{'_backward' if backward else ''} B={batch} n={n} m={m} {str(dtype)[6:]}", make)


def _outer_backward_sum(batch, n, m, dtype=torch.float32):
    def make():
        a, b = torch.randn(batch, n, dtype=dtype), torch.randn(batch, m, dtype=dtype)
        g = torch.randn(batch, n, m, dtype=dtype)
        ga, gb = torch.empty_like(a), torch.empty_like(b)
        return (lambda: mi.outer_product_backward(g, a, b, grad_a=ga, grad_b=gb)), (
            lambda: ((g * b[..., None, :]).sum(-1), (g * a[..., :, None]).sum(-2))
        )

    return (f"outer_product_backward B={batch} n={n} m={m} {str(dtype)[6:]} vs broadcast-sum", make)


def _weights(points):
    u = (points + 1) / 2
    wu = torch.stack([1 - u, u], dim=-1)
    return (wu[:, 0, :, None, None] * wu[:, 1, None, :, None] * wu[:, 2, None, None, :]).reshape(-1, 8)


def _trilinear(n, f, dtype=torch.float32, backward=False, closed_form=False):
    def make():
        feats = torch.randn(n, 8, f, dtype=dtype)
        points = (torch.rand(n, 3) * 2 - 1).to(dtype)
        if not backward:
            out = torch.empty(n, f, dtype=dtype)
            return (lambda: mi.trilinear_interpolation(feats, points, out=out)), (
                lambda: (_weights(points)[:, :, None] * feats).sum(1)
            )
        g = torch.randn(n, f, dtype=dtype)
        gf, gp = torch.empty_like(feats), torch.empty(n, 3, dtype=dtype)

        @torch.enable_grad()
        def autograd_reference():
            fr, pr = feats.detach().requires_grad_(), points.detach().requires_grad_()
            return torch.autograd.grad((_weights(pr)[:, :, None] * fr).sum(1), (fr, pr), g)

        def closed_form_reference():  # benchmarks/bench_trilinear.py's torch row
            u = (points + 1) / 2
            wu = torch.stack([1 - u, u], dim=-1)
            du = torch.tensor([-0.5, 0.5], dtype=points.dtype).expand_as(wu)
            grad_feats = _weights(points)[:, :, None] * g[:, None, :]
            per_point = (feats * g[:, None, :]).sum(-1)
            grads = []
            for axis in range(3):
                fs = [du[:, a] if a == axis else wu[:, a] for a in range(3)]
                dw = (fs[0][:, :, None, None] * fs[1][:, None, :, None] * fs[2][:, None, None, :]).reshape(-1, 8)
                grads.append((dw * per_point).sum(-1))
            return grad_feats, torch.stack(grads, dim=-1)

        ours = lambda: mi.trilinear_interpolation_backward(g, points, feats, grad_feats=gf, grad_points=gp)  # noqa: E731
        return ours, closed_form_reference if closed_form else autograd_reference

    what = "_backward" + (" vs closed form" if closed_form else " vs autograd") if backward else ""
    return (f"trilinear_interpolation{what} N={n} F={f} {str(dtype)[6:]}", make)


def cases() -> list[Case]:
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    main = [
        _softmax((512, 1024)),
        _softmax((4, 4, 128, 128), scale=0.125, causal=True),
        _layer_norm(512, 1024),
        _rms_norm(512, 1024),
        _square_matmul(4096, 512),
        _square_matmul(4096, 512, workspace=0),
        _linear(2, 128, 128),
        _outer(16, 256, 256),
        _outer(16, 256, 256, backward=True),
        _trilinear(4096, 32),
        _trilinear(4096, 32, backward=True),
    ]
    bench = []
    for rows, cols in [(256, 1024), (64, 4097), (4096, 32)]:
        bench += [_softmax((rows, cols)), _layer_norm(rows, cols), _rms_norm(rows, cols)]
    for dtype in (f32, bf16):
        for rows, n in [(256, 64), (100, 33)]:
            bench += [_square_matmul(rows, n, dtype), _square_matmul(rows, n, dtype, workspace=0)]
    bench.append(_linear(2, 64, 64))
    for dtype in (bf16, f16, f32):
        bench += [_outer(8, 64, 64, dtype), _outer(8, 64, 64, dtype, backward=True), _outer_backward_sum(8, 64, 64, dtype)]
        bench += [_trilinear(4096, 32, dtype), _trilinear(4096, 32, dtype, backward=True),
                  _trilinear(4096, 32, dtype, backward=True, closed_form=True)]
    extra = [
        _softmax((4, 4, 128, 128), scale=0.125, masked=True),
        _softmax((64, 128, 64), dim=1),
        _softmax((512, 1024), bf16),
        _softmax((512, 1024), f16),
        _softmax((4, 4, 128, 128), bf16, scale=0.125, causal=True),
        _layer_norm(512, 1024, bf16),
        _rms_norm(512, 1024, bf16),
        _square_matmul(4096, 512, bf16),
        _square_matmul(4096, 512, bf16, workspace=0),
        _linear(2, 128, 128, bf16),
    ]
    return [(f"main | {n}", m) for n, m in main] + [(f"bench | {n}", m) for n, m in bench] + [(f"extra | {n}", m) for n, m in extra]


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _p20(values: list[float]) -> float:
    return sorted(values)[len(values) // 5]


def measure(make, reps: int) -> tuple[float, float, float, float]:
    with torch.no_grad():
        ours, ref = make()
        for _ in range(3):
            ours(), ref()
        ours_t, ref_t = [], []
        for _ in range(ROUNDS):
            ours_t += timed(ours, reps)
            ref_t += timed(ref, reps)
    return statistics.median(ours_t), statistics.median(ref_t), _p20(ours_t), _p20(ref_t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--only", default=None, help="substring of the case name")
    parser.add_argument("--reps", type=int, default=25, help="calls per round (8 rounds per side)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {load0:.2f}")
    print(f"{'case':<78} {'ours ms':>9} {'torch ms':>9} {'speed':>7} {'ours p20':>9} {'torch p20':>9} {'speed':>7}")
    results = []
    for name, make in cases():
        if args.only and args.only not in name:
            continue
        torch.manual_seed(0)
        ours, ref, ours20, ref20 = measure(make, args.reps)
        results.append({"case": name, "ours_ms": ours, "torch_ms": ref, "ours_p20_ms": ours20, "torch_p20_ms": ref20,
                        "threads": torch.get_num_threads()})
        print(f"{name:<78} {ours:9.4f} {ref:9.4f} {ref / ours:6.2f}x {ours20:9.4f} {ref20:9.4f} {ref20 / ours20:6.2f}x",
              flush=True)
    load1 = os.getloadavg()[0]
    print(f"load average before {load0:.2f}, after {load1:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "load": [load0, load1], "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
