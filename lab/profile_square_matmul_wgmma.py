"""Cases for ncu: the Hopper square_matmul_ kernel and torch.matmul at one shape.

    ncu --kernel-name regex:'wgmma|nvjet|gemm' python lab/profile_square_matmul_wgmma.py 40000 1024 bf16
"""

import sys

import torch

import make_inplace

rows, n = int(sys.argv[1]), int(sys.argv[2])
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[sys.argv[3]]
transpose = len(sys.argv) > 4 and sys.argv[4] == "t"
x = torch.randn(rows, n, device="cuda", dtype=dtype)
w = torch.linalg.qr(torch.randn(n, n, device="cuda"))[0].to(dtype)
for _ in range(2):
    make_inplace.square_matmul_(x, w, transpose=transpose)
    torch.matmul(x, w.t() if transpose else w)
torch.cuda.synchronize()
