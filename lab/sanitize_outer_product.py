"""compute-sanitizer cases for outer_product_backward's rows sweep
(csrc/include/make_inplace/kernels/outer_rows_sweep.cuh) and the column sweep
beside it: clusters of 2-8 CTAs sharing an item (few items), one 256-thread
CTA an item (many), 512-thread CTAs (rows over 512 packs), lanes without a
second pack, rows that do not divide among the CTAs, and the fused sweep's
narrow 16-bit rows (1-16 packs, `kNarrow`); each checked against a float64
sum.

    compute-sanitizer --tool memcheck python lab/sanitize_outer_product.py
    compute-sanitizer --tool racecheck python lab/sanitize_outer_product.py
"""

import torch

import make_inplace

CASES = [(12, 100, 520), (200, 33, 264), (140, 9, 8), (10, 37, 4096), (9, 20, 8192), (70, 3, 1288),
         (3, 5, 8), (7, 33, 16), (300, 17, 128), (2, 1, 64), (1000, 64, 120)]


def main() -> None:
    torch.manual_seed(0)
    worst = 0.0
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for batch, n, m in CASES:
            if dtype == torch.float32 and m > 4096:
                continue
            a = torch.randn(batch, n, dtype=dtype, device="cuda")
            b = torch.randn(batch, m, dtype=dtype, device="cuda")
            g = torch.randn(batch, n, m, dtype=dtype, device="cuda")
            ga, gb = make_inplace.outer_product_backward(g, a, b)
            ref_a = (g.double() * b.double()[:, None, :]).sum(-1)
            ref_b = (g.double() * a.double()[:, :, None]).sum(-2)
            # Errors relative to sqrt(terms): the sums' rounding grows like it.
            err_a = ((ga.double() - ref_a).abs().max() / m**0.5).item()
            err_b = ((gb.double() - ref_b).abs().max() / n**0.5).item()
            worst = max(worst, err_a, err_b)
            print(dtype, batch, n, m, f"{err_a:.2e} {err_b:.2e}")
    torch.cuda.synchronize()
    print("worst |error| / sqrt(terms)", worst)


if __name__ == "__main__":
    main()
