"""compute-sanitizer memcheck, racecheck and synccheck over every CUDA kernel of make_inplace.

    python tools/sanitize.py RESULTS_FILE [--tools memcheck,racecheck,synccheck]
                             [--cases REGEX] [--isolate] [--sanitizer PATH]

Small shapes that reach every kernel route: register, staged and long rows and
the columns kernels of softmax_/layer_norm_ (and rms_norm_ where built), their
backward kernels, every square_matmul_ route forced in turn (wgmma counted and
clusters, one and two tiles per CTA, FFMA counted and clusters, panels in 1 MiB
blocks batched or not and in one buffer, the waves kernels big and small,
16-bit and fp32/fp64, aligned or not), trilinear and outer product forward and
backward. Each case also checks its values against torch.

For each tool the cases run in one process under compute-sanitizer (with
--isolate: one process per case, slower, exact attribution); errors are
attributed to the case whose markers enclose them. RESULTS_FILE gets one line
per tool x case with the error count, a total per tool from the sanitizer's
own summary (ERROR SUMMARY; racecheck's RACECHECK SUMMARY), and the kernel coverage: which __global__ functions of
csrc/ the cases launched (found with torch.profiler in a plain run) and which
none did. A case a tool cannot run (NOT_RUN) gets a line saying why instead
of a count. Exit status 0 only if every count is 0, every case passed its value
check and every kernel was launched.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("memcheck", "racecheck", "synccheck")
BEGIN, END = "@@sanitize-case-begin ", "@@sanitize-case-end "

# Cases a tool cannot run, and why. On the H100 (CUDA 13.0), racecheck fails
# inside cuBLAS's GEMM even with none of our kernels instrumented ("Internal
# Sanitizer Error: The Sanitizer failed to handle a hardware exception" with
# --kernel-name kns=no_such_kernel, for a plain torch.mm too), and the CUDA
# context is lost for every later case. The panels route's own kernels
# (copy_blocks_kernel, write_pointers_kernel) use no shared memory, the only
# memory racecheck checks; memcheck and synccheck run these cases.
NOT_RUN = {
    "racecheck": (re.compile(r"^square_matmul-panels"),
                  "not run: racecheck fails inside cuBLAS's GEMM (with no kernel instrumented too); "
                  "this route's own kernels use no shared memory"),
}


# ------------------------------------------------------------------ the cases
# Each case: name -> function(torch, make_inplace, forced_route) that runs the
# calls on CUDA and raises if a value is wrong. Imports stay inside so the
# driver (which runs no case) does not need torch.


def _cases(dev: str = "cuda"):
    import torch
    import torch.nn.functional as F

    import make_inplace
    from make_inplace._testing import forced_route, trilinear_reference

    op = torch.ops.make_inplace
    bf16, f16, f32, f64 = torch.bfloat16, torch.float16, torch.float32, torch.float64

    def close(result, expected, tol):
        torch.testing.assert_close(result.double(), expected.double(), rtol=tol, atol=tol * max(1.0, expected.abs().max().item()))

    def randn(*shape, dtype=f32, scale=1.0):
        return (torch.randn(*shape, device=dev, dtype=f64) * scale).to(dtype)

    cases = {}

    def case(name):
        def register(fn):
            cases[name] = fn
            return fn

        return register

    tol = {bf16: 3e-2, f16: 3e-3, f32: 1e-4, f64: 1e-10}

    # softmax_: plain register rows, general (masked, causal) rows, unaligned rows,
    # staged rows (plain and general), long rows (also masked), columns, fp64.
    def softmax_case(name, shape, dtype, dim=-1, mask_shape=None, causal=False, scale=None, staged=True):
        @case(name)
        def run():
            x = randn(*shape, dtype=dtype, scale=3.0)
            mask = None if mask_shape is None else randn(*mask_shape, dtype=dtype)
            v = x.double() * (1.0 if scale is None else scale) + (0 if mask is None else mask.double())
            if causal:
                v = v.masked_fill(torch.ones(shape[-2], shape[-1], dtype=torch.bool, device=dev).triu(1), float("-inf"))
            with forced_route(staged_rows=staged):
                make_inplace.softmax_(x, dim, scale=scale, causal=causal, mask=mask)
            close(x, torch.softmax(v, dim), tol[dtype])

    softmax_case("softmax-rows-plain", (64, 1024), bf16)
    softmax_case("softmax-rows-masked", (33, 1024), f32, mask_shape=(1024,))
    softmax_case("softmax-rows-causal", (2, 33, 1024), f16, causal=True, scale=0.5)
    softmax_case("softmax-rows-unaligned", (37, 1001), f16, scale=0.3)
    softmax_case("softmax-staged-plain", (4, 65536), bf16)
    softmax_case("softmax-staged-causal", (2, 3, 40000), f32, causal=True, scale=0.7)
    softmax_case("softmax-long", (2, 262144), bf16)
    softmax_case("softmax-long-masked", (2, 65536), f32, mask_shape=(65536,))
    softmax_case("softmax-long-no-staging", (3, 65536), bf16, staged=False)
    softmax_case("softmax-columns", (7, 33, 5), f32, dim=1, mask_shape=(33, 1))
    softmax_case("softmax-fp64", (5, 333), f64, mask_shape=(333,))

    def softmax_backward_case(name, shape, dtype, dim=-1, in_place=False):
        @case(name)
        def run():
            g = randn(*shape, dtype=dtype)
            y = torch.softmax(randn(*shape), dim).to(dtype)
            expected = 0.5 * y.double() * (g.double() - (g.double() * y.double()).sum(dim, keepdim=True))
            if in_place:
                op.softmax_backward_(g, y, dim, 0.5)
                close(g, expected, 4 * tol[dtype])
            else:
                close(op.softmax_backward(g, y, dim, 0.5), expected, 4 * tol[dtype])

    softmax_backward_case("softmax_backward-rows", (64, 1024), bf16)
    softmax_backward_case("softmax_backward-unaligned", (9, 1001), f32)
    softmax_backward_case("softmax_backward-columns", (6, 33, 5), f32, dim=1)
    softmax_backward_case("softmax_backward_-in-place", (64, 1024), f16, in_place=True)

    # layer_norm_: plain and general register rows, staged (and the staged moments
    # kernel of the stats op), long rows, fp64; backward rows and column sums.
    def layer_norm_case(name, shape, norm, dtype, affine=True, staged=True, stats=False):
        @case(name)
        def run():
            x = randn(*shape, dtype=dtype, scale=2.0)
            w = (0.5 + torch.rand(norm, device=dev)).to(dtype) if affine else None
            b = randn(*norm, dtype=dtype) if affine else None
            expected = F.layer_norm(x.double(), norm, None if w is None else w.double(), None if b is None else b.double())
            with forced_route(staged_rows=staged):
                if stats:
                    op.layer_norm_stats_(x, list(norm), w, b, 1e-5)
                else:
                    make_inplace.layer_norm_(x, norm, w, b)
            close(x, expected, 2 * tol[dtype])

    layer_norm_case("layer_norm-rows-plain", (64, 1024), (1024,), bf16)
    layer_norm_case("layer_norm-rows-no-affine", (33, 1000), (1000,), f32, affine=False)
    layer_norm_case("layer_norm-rows-2d-normalized", (5, 4, 33), (4, 33), f16)
    layer_norm_case("layer_norm-staged", (4, 65536), (65536,), bf16)
    layer_norm_case("layer_norm-stats-staged", (4, 65536), (65536,), bf16, stats=True)
    layer_norm_case("layer_norm-stats-rows", (64, 1024), (1024,), f32, stats=True)
    layer_norm_case("layer_norm-long", (2, 262144), (262144,), bf16)
    layer_norm_case("layer_norm-staged-fp64", (3, 8192), (8192,), f64)  # fp64's own staged kernel
    layer_norm_case("layer_norm-stats-long", (2, 262144), (262144,), f32, stats=True)
    layer_norm_case("layer_norm-long-no-staging", (3, 65536), (65536,), f32, staged=False)
    layer_norm_case("layer_norm-fp64", (5, 333), (333,), f64)

    def layer_norm_backward_case(name, rows, n, dtype):
        @case(name)
        def run():
            x = randn(rows, n, dtype=f64)
            w = 0.5 + torch.rand(n, device=dev, dtype=f64)
            b = randn(n, dtype=f64)
            rstd = (x.var(-1, unbiased=False) + 1e-5).rsqrt()
            y = F.layer_norm(x, (n,), w, b).to(dtype)
            g = randn(rows, n, dtype=dtype)
            stat = f64 if dtype == f64 else f32
            gx, gw, gb = op.layer_norm_backward(g, y, [n], w.to(dtype), b.to(dtype), rstd.to(stat), [True, True, True])
            x_hat = (y.double() - b.to(dtype).double()) / w.to(dtype).double()
            gxh = g.double() * w.to(dtype).double()
            r = rstd.to(stat).double()[:, None]
            close(gx, r * (gxh - gxh.mean(-1, keepdim=True) - x_hat * (gxh * x_hat).mean(-1, keepdim=True)), 8 * tol[dtype])
            close(gw, (g.double() * x_hat).sum(0), 8 * tol[dtype])
            close(gb, g.double().sum(0), 8 * tol[dtype])

    layer_norm_backward_case("layer_norm_backward-rows", 64, 1024, f32)
    layer_norm_backward_case("layer_norm_backward-many-rows", 4096, 96, bf16)
    layer_norm_backward_case("layer_norm_backward-unaligned", 33, 1001, f16)
    layer_norm_backward_case("layer_norm_backward-wide", 3, 65536, f32)

    # square_matmul_: every route, forced (where a forced route cannot run the
    # call the policy picks another, so the value check still holds).
    def square_matmul_case(name, rows, n, dtype, route, workspace, transpose=False, tiles=None, batched=True,
                           unaligned=False):
        @case(name)
        def run():
            buf = randn(rows * n + (1 if unaligned else 0), dtype=dtype)
            x = buf[1:] if unaligned else buf
            x = x.view(rows, n)
            w = randn(n, n, dtype=dtype, scale=n**-0.5)
            bias = randn(n, dtype=dtype)
            expected = x.double() @ (w.double().t() if transpose else w.double()) + bias.double()
            with forced_route(route, tiles_per_cta=tiles, panels_batched=batched):
                make_inplace.square_matmul_(x, w, bias, transpose=transpose, workspace_bytes=workspace)
            rel = ((x.double() - expected).norm() / expected.norm()).item()
            assert rel < {bf16: 1.2e-2, f16: 2e-3, f32: 2e-5, f64: 1e-12}[dtype], rel

    square_matmul_case("square_matmul-wgmma-counted", 1000, 1024, bf16, "wgmma_counted", 4 << 20)
    square_matmul_case("square_matmul-wgmma-counted-partial", 300, 520, f16, "wgmma_counted", 4 << 20, transpose=True)
    square_matmul_case("square_matmul-wgmma-two-tiles", 1000, 2048, bf16, "wgmma", 4 << 20, tiles=2)
    square_matmul_case("square_matmul-wgmma-clusters", 1000, 1024, bf16, "wgmma_clusters", 0, transpose=True)
    square_matmul_case("square_matmul-wgmma-clusters-partial", 130, 264, f16, "wgmma_clusters", 0)
    square_matmul_case("square_matmul-wgmma-grid", 1000, 1024, bf16, "wgmma_grid", 0, transpose=True)
    square_matmul_case("square_matmul-wgmma-grid-two-tiles", 300, 2056, f16, "wgmma_grid", 0, tiles=2)
    square_matmul_case("square_matmul-ffma-counted", 300, 1024, f32, "ffma_counted", 4 << 20)
    square_matmul_case("square_matmul-ffma-counted-partial", 257, 2052, f32, "ffma_counted", 4 << 20, transpose=True)
    square_matmul_case("square_matmul-ffma-grid", 130, 100, f32, "ffma_grid", 0)
    square_matmul_case("square_matmul-ffma-grid-tall", 4000, 36, f32, "ffma_grid", 0, transpose=True)
    square_matmul_case("square_matmul-panels-blocks", 3000, 640, f16, "panels", 4 << 20, transpose=True)
    square_matmul_case("square_matmul-panels-blocks-unbatched", 3000, 640, bf16, "panels", 4 << 20, batched=False)
    square_matmul_case("square_matmul-panels-one-buffer", 3000, 640, f32, "panels", 64 << 20)
    square_matmul_case("square_matmul-waves-mma-big", 1000, 256, bf16, "waves", 0)
    square_matmul_case("square_matmul-waves-mma-small", 9, 256, f16, "waves", 0, transpose=True)
    square_matmul_case("square_matmul-waves-mma-unaligned", 77, 96, bf16, "waves", 0, unaligned=True)
    square_matmul_case("square_matmul-waves-simt-fp32-big", 257, 96, f32, "waves", 0, transpose=True)
    square_matmul_case("square_matmul-waves-simt-fp32-small", 5, 33, f32, "waves", 0, unaligned=True)
    square_matmul_case("square_matmul-waves-simt-fp64", 100, 64, f64, "waves", 0)

    # trilinear_interpolation (+ backward), contiguous and strided feats.
    def trilinear_case(name, n, f, dtype, strided=False, backward=False, with_feats=True):
        @case(name)
        def run():
            feats = randn(n, f, 8, dtype=dtype).transpose(1, 2) if strided else randn(n, 8, f, dtype=dtype)
            points = (torch.rand(n, 3, device=dev, dtype=f64) * 2.4 - 1.2).to(dtype)
            if not backward:
                close(make_inplace.trilinear_interpolation(feats, points), trilinear_reference(feats.double(), points.double()), 2 * tol[dtype])
                return
            g = randn(n, f, dtype=dtype)
            gf, gp = make_inplace.trilinear_interpolation_backward(g, points, feats if with_feats else None)
            f64_feats, f64_points = feats.double().requires_grad_(), points.double().requires_grad_()
            trilinear_reference(f64_feats, f64_points).backward(g.double())
            close(gf, f64_feats.grad, 4 * tol[dtype])
            if with_feats:
                close(gp, f64_points.grad, 4 * tol[dtype] * f**0.5)

    trilinear_case("trilinear", 4096, 64, bf16)
    trilinear_case("trilinear-strided", 1000, 33, f32, strided=True)
    trilinear_case("trilinear_backward", 4096, 64, f16, backward=True)
    trilinear_case("trilinear_backward-no-feats", 1000, 33, f32, backward=True, with_feats=False)

    # outer_product (+ backward: the rows kernel for grad_a, the columns kernel for grad_b).
    def outer_case(name, lead, n, m, dtype, strided=False, backward=False):
        @case(name)
        def run():
            a = randn(*lead, n, dtype=dtype)
            b = randn(*lead, 2 * m, dtype=dtype)[..., ::2] if strided else randn(*lead, m, dtype=dtype)
            if not backward:
                close(make_inplace.outer_product(a, b), a.double()[..., :, None] * b.double()[..., None, :], tol[dtype])
                return
            g = randn(*lead, n, m, dtype=dtype)
            ga, gb = make_inplace.outer_product_backward(g, a, b)
            close(ga, (g.double() * b.double()[..., None, :]).sum(-1), 4 * tol[dtype] * m**0.5)
            close(gb, (g.double() * a.double()[..., :, None]).sum(-2), 4 * tol[dtype] * n**0.5)

    outer_case("outer_product", (8,), 300, 200, bf16)
    outer_case("outer_product-strided", (2, 3), 65, 33, f32, strided=True)
    outer_case("outer_product_backward", (8,), 300, 200, f32, backward=True)
    outer_case("outer_product_backward-wide", (2,), 1025, 7, bf16, backward=True)
    # Long rows and few batch items: grad_a from the separate rows kernel.
    outer_case("outer_product_backward-long-rows", (2,), 33, 8192, f32, backward=True)

    # rms_norm_, where this build has it: rows, long rows, backward rows and column sums.
    if hasattr(make_inplace, "rms_norm_"):
        def rms(x, w, eps=1e-6):
            return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * w

        def rms_norm_case(name, rows, n, dtype, backward=False):
            @case(name)
            def run():
                x = randn(rows, n, dtype=dtype)
                w = (0.5 + torch.rand(n, device=dev)).to(dtype)
                if not backward:
                    expected = rms(x.double(), w.double())
                    make_inplace.rms_norm_(x, n, w, 1e-6)
                    close(x, expected, 2 * tol[dtype])
                    return
                leaf, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
                g = randn(rows, n, dtype=dtype)
                make_inplace.rms_norm_(leaf * 1.0, n, wl, 1e-6).backward(g)
                x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
                rms(x64, w64).backward(g.double())
                close(leaf.grad, x64.grad, 8 * tol[dtype])
                close(wl.grad, w64.grad, 8 * tol[dtype])

        rms_norm_case("rms_norm-rows", 64, 1024, bf16)
        rms_norm_case("rms_norm-long", 2, 262144, f32)
        rms_norm_case("rms_norm_backward", 4096, 96, f32, backward=True)
    return cases


# ------------------------------------------------------------- running cases


def run_cases(pattern: str) -> int:
    """Runs the matching cases (inside a sanitizer or not), between markers."""
    import torch

    failures = 0
    for name, fn in _cases().items():
        if not re.search(pattern, name):
            continue
        print(BEGIN + name, flush=True)
        try:
            fn()
            torch.cuda.synchronize()  # kernel errors surface before the end marker
            print(f"{END}{name} ok", flush=True)
        except Exception as e:  # noqa: BLE001 - reported per case, the run goes on
            failures += 1
            print(f"{END}{name} FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
    return failures


def kernel_coverage(pattern: str) -> tuple[dict[str, set[str]], set[str]]:
    """Which of csrc's __global__ functions each case launches (torch.profiler, no sanitizer)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    declared = declared_kernels()
    launched: dict[str, set[str]] = {}
    for name, fn in _cases().items():
        if not re.search(pattern, name):
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
        launched[name] = {k for k in declared if any(re.search(rf"\b{k}\b", n) for n in names)}
    return launched, declared


def declared_kernels() -> set[str]:
    found = set()
    for path in list((ROOT / "csrc").rglob("*.cu")) + list((ROOT / "csrc").rglob("*.cuh")):
        if "mindspore" in path.parts:
            continue  # the MindSpore bridge's own build, not this library's
        text = path.read_text()
        for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(", text):
            found.add(m.group(1))
    return found


# ---------------------------------------------------------- the sanitizer run

_REPORT = re.compile(r"^========= \S")
_NOT_ERRORS = re.compile(r"^========= (COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|"
                         r"Target application|Saved host backtrace)")


def _error_lines(lines: list[str]) -> int:
    """Error reports in sanitizer output: '========= ' lines with text right after
    the prefix that are not banners or summaries (a report's details are indented)."""
    return sum(1 for line in lines if _REPORT.match(line) and not _NOT_ERRORS.match(line))


def parse(output: str) -> tuple[dict[str, tuple[int, str]], int, int | None]:
    """(case -> (errors, status), errors outside any case, the sanitizer's own total)."""
    per_case: dict[str, tuple[int, str]] = {}
    outside: list[str] = []
    current, chunk = None, []
    for line in output.splitlines():
        if line.startswith(BEGIN):
            current, chunk = line[len(BEGIN):].strip(), []
        elif line.startswith(END) and current is not None:
            status = line[len(END) + len(current):].strip()
            per_case[current] = (_error_lines(chunk), status)
            current, chunk = None, []
        elif current is not None:
            chunk.append(line)
        else:
            outside.append(line)
    if current is not None:  # the process died inside a case
        per_case[current] = (_error_lines(chunk), "DIED (no end marker)")
    # racecheck ends with "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
    summary = (re.findall(r"ERROR SUMMARY: (\d+) error", output)
               or re.findall(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?", output))
    return per_case, _error_lines(outside), int(summary[-1]) if summary else None


def sanitize(tool: str, pattern: str, sanitizer: str, log_dir: Path, ours_only: bool) -> tuple[dict, int, int | None, int]:
    # Only this library's kernels are instrumented (all live in namespace
    # make_inplace): torch's and cuBLAS's own kernels are not ours to check, and
    # racecheck over them would take most of the time.
    only = ["--kernel-name", "kns=make_inplace"] if ours_only else []
    cmd = [sanitizer, "--tool", tool, "--print-limit", "10000", *only,
           sys.executable, str(Path(__file__).resolve()), "--run-cases", pattern]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    label = "all" if "|" in pattern else re.sub(r"[^A-Za-z0-9_.-]+", "_", pattern)
    (log_dir / f"{tool}-{label}.log").write_text(output)
    per_case, outside, total = parse(output)
    return per_case, outside, total, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", help="results file to write (one line per tool x case)")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--cases", default=".", help="regex: only the cases whose names match")
    parser.add_argument("--isolate", action="store_true", help="one process per case (slow, exact attribution)")
    parser.add_argument("--sanitizer", default=shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer")
    parser.add_argument("--all-kernels", action="store_true",
                        help="instrument every kernel, not only make_inplace's (slower)")
    parser.add_argument("--run-cases", metavar="REGEX", help=argparse.SUPPRESS)  # inside the sanitizer
    parser.add_argument("--list", action="store_true", help="print the case names and exit")
    parser.add_argument("--commit", default="", help="the commit the library was built from, for the header")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))

    if args.run_cases is not None:
        return 1 if run_cases(args.run_cases) else 0
    if args.list:
        print("\n".join(n for n in _cases() if re.search(args.cases, n)))
        return 0
    if not args.results:
        parser.error("RESULTS_FILE is required")
    results = Path(args.results)
    log_dir = results.with_suffix(".logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n in _cases() if re.search(args.cases, n)]
    ok = True
    import torch

    version = subprocess.run([args.sanitizer, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    lines = [f"# compute-sanitizer over make_inplace's CUDA kernels{' at ' + args.commit if args.commit else ''}: "
             f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {version[-1] if version else 'compute-sanitizer'}",
             "# tool\tcase\terrors\tcase status"]
    for tool in args.tools.split(","):
        skip, why = NOT_RUN.get(tool, (None, ""))
        run = [n for n in names if skip is None or not skip.search(n)]
        lines += [f"{tool}\t{n}\t-\t{why}" for n in names if n not in run]
        # One process per tool for all cases, or (--isolate) one per tool and case.
        groups = ([(f"^{re.escape(n)}$", [n]) for n in run] if args.isolate
                  else [("^(" + "|".join(re.escape(n) for n in run) + ")$", run)] if run else [])
        counted = totals = 0
        for pattern, group in groups:
            per_case, outside, total, rc = sanitize(tool, pattern, args.sanitizer, log_dir, not args.all_kernels)
            for name in group:
                errors, status = per_case.get(name, (None, "NOT RUN"))
                lines.append(f"{tool}\t{name}\t{'?' if errors is None else errors}\t{status}")
                ok &= errors == 0 and status == "ok"
                counted += errors or 0
            if outside:
                lines.append(f"{tool}\t(outside any case)\t{outside}\t-")
            counted += outside
            totals += total if total is not None else 0
            if total is None:
                ok = False
                lines.append(f"{tool}\t(no ERROR or RACECHECK SUMMARY: the sanitizer did not finish, exit {rc})\t?\t-")
        lines.append(f"{tool}\tTOTAL (the sanitizer's summary)\t{totals}\t"
                     + ("matches the per-case counts" if totals == counted else f"per-case counts sum to {counted}"))
        ok &= totals == 0
        results.write_text("\n".join(lines) + "\n")  # partial results survive a later crash
    launched, declared = kernel_coverage(args.cases)
    covered = set().union(*launched.values()) if launched else set()
    missing = sorted(declared - covered)
    lines.append(f"coverage\t{len(covered)} of {len(declared)} __global__ functions launched\t-\t"
                 + ("all" if not missing else "never launched: " + ", ".join(missing)))
    for name, kernels in launched.items():
        lines.append(f"kernels\t{name}\t-\t{', '.join(sorted(kernels)) or '(none of ours)'}")
    ok &= not missing or args.cases != "."
    results.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
