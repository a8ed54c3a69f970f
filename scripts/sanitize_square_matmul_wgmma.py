"""compute-sanitizer cases for the Hopper square matmul kernel: one and two
tiles per CTA, both weight layouts, partial row-blocks, clusters of 2-16.

    compute-sanitizer --tool memcheck python scripts/sanitize_square_matmul_wgmma.py
    compute-sanitizer --tool synccheck python scripts/sanitize_square_matmul_wgmma.py
"""

import os

import torch

import make_inplace

os.environ["MAKE_INPLACE_WGMMA_MIN_TILES"] = "0"
for tiles in ("1", "2"):
    os.environ["MAKE_INPLACE_WGMMA_TILES_PER_CTA"] = tiles
    for rows, n, t in [(300, 1024, False), (257, 2056, True), (130, 4096, False)]:
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) / n**0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ (w.double().t() if t else w.double()) + b.double()
        make_inplace.square_matmul_(x, w, b, transpose=t, workspace_bytes=0)
        torch.cuda.synchronize()
        print(tiles, rows, n, t, ((x.double() - ref).norm() / ref.norm()).item())
