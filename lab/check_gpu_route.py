"""Checks one build route's library on a Hopper GPU: the sm_90a kernels ran and are right.

    python lab/check_gpu_route.py              # the make_inplace package (setuptools or JIT)
    python lab/check_gpu_route.py LIBRARY.so   # a library loaded alone (the CMake route)

For the square matmul (bf16, default mode and workspace_bytes=0) and layer norm (bf16 rows
of 65536 and float32 rows of 65536, both split over 2-CTA clusters), it names the kernel that ran
(torch.profiler) and compares with float64. Exits non-zero on a wrong value or kernel.
"""

from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile


def kernels_of(fn) -> list[str]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.key for e in prof.key_averages() if e.self_device_time_total > 0]


def main() -> int:
    if len(sys.argv) > 1:
        torch.ops.load_library(sys.argv[1])
        route = f"library {sys.argv[1]}"
    else:
        import make_inplace  # noqa: F401  (registers the ops)

        route = "make_inplace package"
    ops = torch.ops.make_inplace
    print(f"{route}: backends {ops.build_backends()}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    failures = 0

    x0 = torch.randn(16384, 2048, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(2048, 2048, device="cuda") / 2048**0.5).to(torch.bfloat16)
    expected = x0.double() @ w.double()
    for ws in (None, 0):
        x = x0.clone()
        names = kernels_of(lambda: ops.square_matmul_(x, w, None, transpose=False, workspace_bytes=ws))
        err = ((x.double() - expected).norm() / expected.norm()).item()
        ok = any("square_matmul_wgmma" in k for k in names) and err < 1.2e-2
        failures += not ok
        print(f"  square_matmul_ bf16 (16384, 2048) ws={ws}: rel err {err:.1e}, kernels {[k[:60] for k in names]} {'ok' if ok else 'FAIL'}")

    for dtype, width in ((torch.bfloat16, 65536), (torch.float32, 65536)):
        x = torch.randn(64, width, device="cuda", dtype=dtype) * 3 + 1000
        wt = torch.randn(width, device="cuda", dtype=dtype)
        bs = torch.randn(width, device="cuda", dtype=dtype)
        expected = torch.nn.functional.layer_norm(x.double(), (width,), wt.double(), bs.double())
        names = kernels_of(lambda: ops.layer_norm_(x, [width], wt, bs, 1e-5))
        err = (x.double() - expected).abs().max().item()
        # The tests' tolerances (tests/test_layer_norm.py): atol + rtol * |expected|.
        atol, rtol = (3e-2, 1e-2) if dtype == torch.bfloat16 else (1e-5, 1e-5)
        within = ((x.double() - expected).abs() <= atol + rtol * expected.abs()).all().item()
        ok = any("layer_norm_staged_moments_kernel" in k for k in names) and within
        failures += not ok
        print(f"  layer_norm_ {dtype} (64, {width}) offset 1000: max abs err {err:.1e}, kernels {[k[:60] for k in names]} {'ok' if ok else 'FAIL'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
