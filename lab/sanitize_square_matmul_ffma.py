"""compute-sanitizer cases for the fp32 FFMA square matmul kernel in both modes
(counters: a 4 MiB bound; the grid barrier: workspace_bytes=0) with one and two tiles
per CTA: both weight layouts, partial row-blocks, partial column tiles and
k-slices, groups of 1-17 CTAs, a last CTA with one tile of two, more
row-blocks than groups.

The kernel and its mode are forced with make_inplace._testing.forced_route
(docs/routing.md), whatever the policy's tile thresholds say; TF32 stays off
(the FFMA kernel does not run with it allowed). A forced mode that cannot run a
case (groups that do not fit) leaves it to the policy.

    compute-sanitizer --tool memcheck python lab/sanitize_square_matmul_ffma.py
    compute-sanitizer --tool racecheck python lab/sanitize_square_matmul_ffma.py --small

--small keeps the cases of at most 4e8 multiply-adds: racecheck tracks every
shared-memory access, and the larger cases took it over ten minutes.
"""

import sys

import torch

import make_inplace
from make_inplace._testing import forced_route

torch.backends.cuda.matmul.allow_tf32 = False
MODES = {0: "ffma_grid", 4 << 20: "ffma_counted"}  # workspace bound -> mode
cases = [(300, 1024, False), (257, 2052, True), (130, 100, False), (40000, 36, True), (129, 1412, False),
         (100, 1300, True), (200, 4096, True)]
if "--small" in sys.argv:
    cases = [c for c in cases if c[0] * c[1] * c[1] <= 4e8]
for tiles in (1, 2):
    for workspace, rows, n, t in [(4 << 20, *c) for c in cases] + [(0, *c) for c in cases]:
        x = torch.randn(rows, n, device="cuda")
        w = torch.randn(n, n, device="cuda") / n**0.5
        b = torch.randn(n, device="cuda")
        ref = x.double() @ (w.double().t() if t else w.double()) + b.double()
        with forced_route(MODES[workspace], tiles_per_cta=tiles):
            make_inplace.square_matmul_(x, w, b, transpose=t, workspace_bytes=workspace)
        torch.cuda.synchronize()
        print(tiles, workspace, rows, n, t, ((x.double() - ref).norm() / ref.norm()).item())
