"""compute-sanitizer cases for the Hopper square matmul kernels: the 128-row
kernel with one and two tiles per CTA of 256 and of 192 columns, both weight
layouts, partial row-blocks, groups of 2-16 CTAs, in all three modes
(clusters and the grid's barrier: workspace_bytes=0; counters: a 4 MiB
bound); then the 64-row kernel (n of 136 to 512, partial row-blocks and
halves, more row-blocks than CTAs). Arguments
pick what runs: `rows` (the 64-row kernel) and modes (`wgmma_grid`, ...);
none, everything.

The kernel, its mode, tiles per CTA and tile width are forced with
make_inplace._testing.forced_route (docs/routing.md), whatever the policy
prefers. A forced route that cannot run a case (no sm_90a build, no
schedulable plan for that many tiles per CTA or that width, no room for the
counters) leaves it to the policy, which picks another kernel (cuBLAS panels
where the bound allows): run this on an H100/H200 with an sm_90a build.

    compute-sanitizer --tool memcheck python lab/sanitize_square_matmul_wgmma.py
    compute-sanitizer --tool racecheck python lab/sanitize_square_matmul_wgmma.py [rows] [wgmma_grid]
"""

import sys

import torch

import make_inplace
from make_inplace._testing import forced_route


def case(label, rows, n, transpose, workspace, dtype=torch.bfloat16):
    x = torch.randn(rows, n, device="cuda", dtype=dtype)
    w = torch.randn(n, n, device="cuda", dtype=dtype) / n**0.5
    b = torch.randn(n, device="cuda", dtype=dtype)
    ref = x.double() @ (w.double().t() if transpose else w.double()) + b.double()
    make_inplace.square_matmul_(x, w, b, transpose=transpose, workspace_bytes=workspace)
    torch.cuda.synchronize()
    print(label, rows, n, transpose, ((x.double() - ref).norm() / ref.norm()).item())


MODES = {"wgmma_clusters": 0, "wgmma_grid": 0, "wgmma_counted": 4 << 20}  # mode -> workspace bound
picked = sys.argv[1:] or ["rows", *MODES]
for mode, workspace in MODES.items():
    if mode in picked:
        for tiles in (1, 2):
            for width in (256, 192):
                with forced_route(mode, tiles_per_cta=tiles, col_tile=width):
                    for rows, n, t in [(300, 1024, False), (257, 2056, True), (130, 4096, False), (129, 776, True)]:
                        case(f"{mode} tiles={tiles} width={width}", rows, n, t, workspace)

if "rows" in picked:
    with forced_route("wgmma_rows"):
        for rows, n, t in [(300, 512, False), (65, 392, True), (20000, 504, False), (9000, 512, True), (9000, 136, False)]:
            case("wgmma_rows", rows, n, t, 0, torch.float16)
