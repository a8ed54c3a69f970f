"""compute-sanitizer cases for the Hopper square matmul kernel: one and two
tiles per CTA, both weight layouts, partial row-blocks, groups of 2-16 CTAs,
in both modes (clusters: workspace_bytes=0; counters: a 4 MiB bound).

    compute-sanitizer --tool memcheck python lab/sanitize_square_matmul_wgmma.py
    compute-sanitizer --tool synccheck python lab/sanitize_square_matmul_wgmma.py
"""

import os

import torch

import make_inplace

os.environ["MAKE_INPLACE_WGMMA_MIN_TILES"] = "0"
for workspace, tiles in [(0, "1"), (0, "2"), (4 << 20, "1"), (4 << 20, "2")]:
    os.environ["MAKE_INPLACE_WGMMA_TILES_PER_CTA"] = tiles
    for rows, n, t in [(300, 1024, False), (257, 2056, True), (130, 4096, False)]:
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) / n**0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ (w.double().t() if t else w.double()) + b.double()
        make_inplace.square_matmul_(x, w, b, transpose=t, workspace_bytes=workspace)
        torch.cuda.synchronize()
        print(workspace, tiles, rows, n, t, ((x.double() - ref).norm() / ref.norm()).item())
