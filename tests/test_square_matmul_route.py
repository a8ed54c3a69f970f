"""square_matmul_'s routing policy, on CPU: which kernel runs for every kind of call,
over tables of calls and device facts (no GPU needed), and the forced-route switch.

The device facts below model real GPUs: residency (blocks that fit at once) comes
from SM counts and GPC sizes. The policy takes them as given, so the tests check
its rules, not the model; the CUDA tests check the kernels on a real GPU.
"""

import pytest
import torch

from make_inplace._testing import FORCED_ROUTES, DeviceFacts, forced_route, square_matmul_route

MiB = 1 << 20
F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


def clusters(gpc_sms, ctas_per_sm):
    """Clusters of c CTAs that fit at once, c = 0..16: a cluster lives in one GPC."""
    return [0] + [sum(ctas_per_sm * sms // c for sms in gpc_sms) for c in range(1, 17)]


def waves_width(dtype):
    # The widest rows the zero-workspace kernel takes on an H100 (its header's figures).
    return {F16: 640_000, BF16: 640_000, F32: 420_000, F64: 200_000}.get(dtype, 0)


# An H100 SXM: 132 SMs in 8 GPCs (7 clusters of 16 CTAs fit, 15 of 8); the wgmma
# kernel fits 1 CTA per SM, the FFMA kernel 2.
H100_GPCS = [16, 16, 18, 18, 18, 18, 18, 10]



def h100(dtype, **changes):
    facts = DeviceFacts(
        capability=(9, 0),
        wgmma_ctas=132,
        wgmma_clusters=clusters(H100_GPCS, 1),
        ffma_ctas=264,
        waves_max_width=waves_width(dtype),
    )
    return facts._replace(**changes)


def a100(dtype, **changes):
    # sm_80: no clusters, no wgmma; 108 SMs.
    facts = DeviceFacts(capability=(8, 0), sm90a=True, wgmma_ctas=0, ffma_ctas=216, waves_max_width=waves_width(dtype))
    return facts._replace(**changes)


def route(rows, n, dtype, device="h100", **kwargs):
    facts = {"h100": h100, "a100": a100}[device](dtype, **kwargs.pop("facts", {})) if device != "cpu" else None
    return square_matmul_route(rows, n, dtype, device=facts, **kwargs)


# (id, rows, n, dtype, device, call keywords, expected route, expected plan fields)
CASES = [
    # ---- the Hopper wgmma kernel: 16-bit, sm_90 built for sm_90a, any number of rows. Its groups meet on
    # counters where the bound has room for them, else at the grid's barrier (no memory), else in clusters; the
    # cheaper plan of 256- or 192-column tiles (rounds x (1 + the k-steps of a CTA's tiles))
    ("wgmma counted by default", 40000, 1024, BF16, "h100", {}, "wgmma_counted",
     dict(tiles_per_cta=1, group_ctas=4, groups=33, col_tile=256, counter_bytes=313 * 4)),
    ("wgmma at the grid barrier with no workspace: the same plan", 40000, 1024, BF16, "h100",
     dict(workspace_bytes=0), "wgmma_grid", dict(tiles_per_cta=1, group_ctas=4, groups=33, col_tile=256,
                                                counter_bytes=0)),
    ("wgmma counters need a 2 MiB bound", 40000, 1024, F16, "h100", dict(workspace_bytes=2 * MiB - 1), "wgmma_grid",
     {}),
    ("wgmma counters at a 2 MiB bound", 40000, 1024, F16, "h100", dict(workspace_bytes=2 * MiB), "wgmma_counted", {}),
    ("wgmma below 32 MiB of x: no room for counters by default", 8192, 1024, F16, "h100", {}, "wgmma_grid",
     dict(counter_bytes=0)),
    ("wgmma on 40M rows of 8", 40_000_000, 8, BF16, "h100", {}, "wgmma_grid", dict(counter_bytes=0)),
    ("wgmma at 128 tiles", 16384, 256, BF16, "h100", dict(workspace_bytes=0), "wgmma_grid",
     dict(group_ctas=1, groups=128)),
    ("wgmma below 128 tiles too", 16256, 256, BF16, "h100", dict(workspace_bytes=0), "wgmma_grid", {}),
    ("wgmma on one row-block", 16, 1024, F16, "h100", {}, "wgmma_grid", dict(groups=1, col_tile=192)),
    ("192-column tiles where 256 leave a round mostly empty: 2 rounds of 33 groups against 2 of 44, each cheaper",
     5760, 768, F16, "h100", {}, "wgmma_grid", dict(tiles_per_cta=1, group_ctas=4, groups=33, col_tile=192)),
    ("256-column tiles where 192 take more rounds: 12 against 16", 65536, 768, BF16, "h100", {}, "wgmma_counted",
     dict(tiles_per_cta=1, group_ctas=3, groups=44, col_tile=256)),
    ("256-column tiles at n = 1024", 40000, 1024, BF16, "h100", dict(transpose=True), "wgmma_counted",
     dict(col_tile=256)),
    ("n = 8192: groups of 32 CTAs", 4096, 8192, BF16, "h100", dict(workspace_bytes=0), "wgmma_grid",
     dict(tiles_per_cta=1, group_ctas=32, groups=4)),
    ("groups too large for the grid: clusters", 4096, 8192, BF16, "h100",
     dict(workspace_bytes=0, facts=dict(wgmma_ctas=16)),
     "wgmma_clusters", dict(tiles_per_cta=2, group_ctas=16, groups=7, counter_bytes=0)),
    ("n > 8192: no wgmma", 4096, 8200, BF16, "h100", {}, "panels_small_blocks", {}),
    # ---- the 64-row wgmma kernel: n = 448 and 512, one CTA per SM looping over the row-blocks
    ("64-row kernel at n = 512", 16384, 512, BF16, "h100", {}, "wgmma_rows",
     dict(tiles_per_cta=2, group_ctas=1, groups=132, counter_bytes=0)),
    ("64-row kernel with no workspace", 16384, 512, F16, "h100", dict(workspace_bytes=0), "wgmma_rows",
     dict(groups=132, counter_bytes=0)),
    ("64-row kernel, transposed weight", 16384, 512, BF16, "h100", dict(transpose=True), "wgmma_rows", {}),
    ("64-row kernel from n = 448", 16384, 448, BF16, "h100", {}, "wgmma_rows", dict(tiles_per_cta=2)),
    ("n = 480, a partial k-step: the 128-row groups", 16384, 480, BF16, "h100", dict(workspace_bytes=0),
     "wgmma_grid", {}),
    ("n = 384: the 128-row groups", 16384, 384, BF16, "h100", dict(workspace_bytes=4 * MiB), "wgmma_counted",
     dict(group_ctas=2)),
    ("n = 520: the 128-row groups", 16384, 520, BF16, "h100", dict(workspace_bytes=0), "wgmma_grid", {}),
    ("64-row kernel on few rows", 100, 512, BF16, "h100", {}, "wgmma_rows", dict(groups=2)),
    ("64-row kernel: no more CTAs than row-blocks", 8192, 512, BF16, "h100", dict(facts=dict(wgmma_ctas=264)),
     "wgmma_rows", dict(groups=128)),
    ("64-row kernel misaligned: no wgmma", 16384, 512, BF16, "h100", dict(weight_aligned=False, workspace_bytes=0),
     "waves", {}),
    ("64-row kernel not resident: the 128-row kernel in clusters", 16384, 512, BF16, "h100",
     dict(workspace_bytes=0, facts=dict(wgmma_ctas=0)), "wgmma_clusters", {}),
    ("n not a multiple of 8: no wgmma", 40000, 1028, BF16, "h100", {}, "panels_small_blocks", {}),
    ("misaligned x: no wgmma", 40000, 1024, BF16, "h100", dict(x_aligned=False), "panels_small_blocks", {}),
    ("misaligned weight: no wgmma", 40000, 1024, BF16, "h100", dict(weight_aligned=False), "panels_small_blocks", {}),
    ("transposed weight", 40000, 1024, BF16, "h100", dict(transpose=True), "wgmma_counted", {}),
    ("sm_80: no wgmma", 40000, 1024, BF16, "a100", {}, "panels_small_blocks",
     dict(panel_blocks=4, panel_rows_per_block=510, panel_block_bytes=MiB, panels_batched=True)),
    ("sm_90 without sm_90a in the build: no wgmma", 40000, 1024, BF16, "h100", dict(facts=dict(sm90a=False)),
     "panels_small_blocks", {}),
    ("sm_90 without TMA tensor maps: no wgmma", 40000, 1024, BF16, "h100", dict(facts=dict(tensor_maps=False)),
     "panels_small_blocks", {}),
    ("sm_90 but not 9.0 (e.g. 9.1)", 40000, 1024, BF16, "h100", dict(facts=dict(capability=(9, 1))),
     "panels_small_blocks", {}),
    ("no schedulable cluster: the grid all the same", 40000, 1024, BF16, "h100",
     dict(workspace_bytes=0, facts=dict(wgmma_clusters=[0] * 17)), "wgmma_grid", {}),
    ("neither grid nor clusters: no wgmma", 40000, 1024, BF16, "h100",
     dict(facts=dict(wgmma_ctas=0, wgmma_clusters=[0] * 17)), "panels_small_blocks", {}),
    ("fp32 and fp64 never take wgmma", 40000, 1024, F64, "h100", {}, "panels_one_buffer", {}),
    # ---- the fp32 FFMA kernel: no TF32, from one whole row-block; counted, or the grid barrier without memory
    ("ffma counted by default: two tiles where they take no more rounds", 40000, 1024, F32, "h100", {},
     "ffma_counted", dict(tiles_per_cta=2, group_ctas=4, groups=66, counter_bytes=313 * 4)),
    ("ffma at the grid barrier with no workspace: the same groups, no counters", 40000, 1024, F32, "h100",
     dict(workspace_bytes=0), "ffma_grid", dict(tiles_per_cta=2, group_ctas=4, groups=66, counter_bytes=0)),
    ("ffma at n = 512: two tiles, 1 round against 2", 16384, 512, F32, "h100", dict(workspace_bytes=0),
     "ffma_grid", dict(tiles_per_cta=2, group_ctas=2, groups=128)),
    ("ffma: TF32 allowed goes to cuBLAS", 40000, 1024, F32, "h100", dict(allow_tf32=True), "panels_small_blocks",
     dict(panel_blocks=8, panel_rows_per_block=255)),
    ("ffma counted: one tile where two take as many rounds", 4096, 1024, F32, "h100", dict(workspace_bytes=4 * MiB),
     "ffma_counted", dict(tiles_per_cta=1, group_ctas=8, groups=32)),
    ("ffma counted from one whole row-block", 128, 1024, F32, "h100", dict(workspace_bytes=4 * MiB), "ffma_counted",
     dict(tiles_per_cta=1, group_ctas=8, groups=1)),
    ("ffma at the grid barrier from one whole row-block", 128, 1024, F32, "h100", dict(workspace_bytes=0),
     "ffma_grid", dict(tiles_per_cta=1, group_ctas=8, groups=1)),
    ("ffma below one row-block: waves", 127, 1024, F32, "h100", dict(workspace_bytes=0), "waves", {}),
    ("ffma at n = 2048: two tiles, 10 rounds against 20", 40000, 2048, F32, "h100", dict(workspace_bytes=0),
     "ffma_grid", dict(tiles_per_cta=2, group_ctas=8, groups=33)),
    ("ffma at n = 4096 without a workspace", 16384, 4096, F32, "h100", dict(workspace_bytes=0), "ffma_grid",
     dict(tiles_per_cta=2, group_ctas=16, groups=16)),
    ("ffma past n = 4096: one tile where two take more rounds", 40000, 4100, F32, "h100", dict(workspace_bytes=0),
     "ffma_grid", dict(tiles_per_cta=1, group_ctas=33, groups=8)),
    ("ffma: fp32 from n = 4096 keeps contiguous panels", 40000, 4096, F32, "h100", {}, "panels_one_buffer",
     dict(panel_blocks=1, panel_block_bytes=38 * MiB, panel_rows_per_block=38 * MiB // 16384)),
    ("ffma: below n = 4096 the FFMA kernel", 40000, 4092, F32, "h100", {}, "ffma_counted", {}),
    ("ffma: n = 4096 with small blocks", 4096, 4096, F32, "h100", dict(workspace_bytes=4 * MiB), "ffma_counted", {}),
    ("ffma: n not a multiple of 4", 40000, 1026, F32, "h100", {}, "panels_small_blocks", {}),
    ("ffma: misaligned bias", 40000, 1024, F32, "h100", dict(bias_aligned=False), "panels_small_blocks", {}),
    ("ffma on sm_80: counted", 40000, 1024, F32, "a100", {}, "ffma_counted", dict(tiles_per_cta=2, groups=54)),
    ("ffma on sm_80: the grid barrier", 40000, 1024, F32, "a100", dict(workspace_bytes=0), "ffma_grid",
     dict(tiles_per_cta=2, groups=54)),
    ("ffma counted: groups must fit at once", 40000, 40000, F32, "h100", dict(workspace_bytes=4 * MiB), "waves", {}),
    # ---- cuBLAS panels against the waves kernel, by bound
    ("bound 0: waves", 40000, 1024, BF16, "a100", dict(workspace_bytes=0), "waves", {}),
    ("bound under 2 MiB: waves", 400, 1024, F32, "a100", dict(workspace_bytes=2 * MiB - 1, allow_tf32=True), "waves",
     {}),
    ("bound of 2 MiB: two 1 MiB blocks", 400, 1024, F32, "a100", dict(workspace_bytes=2 * MiB, allow_tf32=True),
     "panels_small_blocks", dict(panel_blocks=2, panel_rows_per_block=255, panel_block_bytes=MiB)),
    ("bound just under 10 MiB: eight 1 MiB blocks", 40000, 1024, F32, "a100",
     dict(workspace_bytes=10 * MiB - 1, allow_tf32=True), "panels_small_blocks", dict(panel_blocks=8)),
    ("bound of 10 MiB: one buffer", 40000, 1024, F32, "a100", dict(workspace_bytes=10 * MiB, allow_tf32=True),
     "panels_one_buffer", dict(panel_blocks=1, panel_block_bytes=10 * MiB, panel_rows_per_block=2560)),
    ("bound over 10 MiB: rounded down to 2 MiB", 40000, 1024, F32, "a100",
     dict(workspace_bytes=11 * MiB, allow_tf32=True), "panels_one_buffer", dict(panel_block_bytes=10 * MiB)),
    ("one buffer never holds more rows than x", 1000, 1024, F32, "a100",
     dict(workspace_bytes=64 * MiB, allow_tf32=True), "panels_one_buffer", dict(panel_rows_per_block=1000)),
    ("small panels that do not fill the GPU: waves", 3968, 1024, F32, "h100",
     dict(workspace_bytes=4 * MiB, allow_tf32=True), "waves", {}),
    ("small panels that hold all of x", 500, 1024, F32, "a100", dict(workspace_bytes=4 * MiB, allow_tf32=True),
     "panels_small_blocks", dict(panel_blocks=2)),
    ("16-bit blocks of 63 rows keep enough tiles busy", 4097, 8192, BF16, "a100", {}, "panels_small_blocks",
     dict(panel_rows_per_block=63)),
    ("fp32 blocks of 31 rows do not: waves", 4097, 8192, F32, "a100", dict(allow_tf32=True), "waves", {}),
    ("too wide for waves: panels even where they lose", 100000, 8192, F32, "a100",
     dict(allow_tf32=True, workspace_bytes=4 * MiB, facts=dict(waves_max_width=4096)), "panels_small_blocks", {}),
    ("no rows: nothing to do", 0, 1024, BF16, "h100", {}, "empty", {}),
    # ---- CPU: ATen GEMMs on panels, or the row kernel when panels would be small or it is faster
    ("cpu: default bound too small for 128 rows", 1000, 2048, BF16, "cpu", {}, "cpu_rows", {}),
    ("cpu: bf16 panels", 100000, 64, BF16, "cpu", {}, "cpu_panels", dict(panel_blocks=1, panel_rows_per_block=6250)),
    ("cpu: bf16 without bf16 dot products: rows", 100000, 1024, BF16, "cpu", dict(cpu_bf16_dot=False), "cpu_rows",
     {}),
    ("cpu: bf16 without bf16 dot products, wider than 1024: panels", 100000, 1032, BF16, "cpu",
     dict(cpu_bf16_dot=False), "cpu_panels", dict(panel_blocks=1, panel_rows_per_block=6250)),
    ("cpu: bf16 with the row kernel on dot products, no AMX: rows", 100000, 1024, BF16, "cpu",
     dict(cpu_rows_bf16_dot=True), "cpu_rows", {}),
    ("cpu: bf16 with the row kernel on dot products, odd n: panels", 100000, 1023, BF16, "cpu",
     dict(cpu_rows_bf16_dot=True), "cpu_panels", dict(panel_blocks=1, panel_rows_per_block=6250)),
    ("cpu: bf16 with the row kernel on dot products, wider than 1024: panels", 100000, 1026, BF16, "cpu",
     dict(cpu_rows_bf16_dot=True), "cpu_panels", dict(panel_blocks=1, panel_rows_per_block=6250)),
    ("cpu: bf16 where torch's GEMM runs on AMX: panels", 100000, 1024, BF16, "cpu",
     dict(cpu_rows_bf16_dot=True, cpu_amx=True), "cpu_panels", dict(panel_blocks=1, panel_rows_per_block=6250)),
    ("cpu: fp32 up to 1024 wide: rows whatever the bound", 100000, 1024, F32, "cpu", {}, "cpu_rows", {}),
    ("cpu: fp32 whose w fits L2: rows", 100000, 724, F32, "cpu", dict(cpu_l2_bytes=2 * MiB), "cpu_rows", {}),
    ("cpu: fp32 whose w outgrows L2: panels", 100000, 725, F32, "cpu", dict(cpu_l2_bytes=2 * MiB), "cpu_panels",
     dict(panel_blocks=1, panel_rows_per_block=6250)),
    ("cpu: fp32 outgrowing L2 without room for a panel: rows", 1000, 768, F32, "cpu", dict(cpu_l2_bytes=2 * MiB),
     "cpu_rows", {}),
    ("cpu: fp16 ignores L2 (torch has no fast fp16 GEMM on the CPU)", 100000, 1024, F16, "cpu",
     dict(cpu_l2_bytes=1 * MiB), "cpu_rows", {}),
    ("cpu: fp16 up to 1024 wide: rows", 100000, 64, F16, "cpu", {}, "cpu_rows", {}),
    ("cpu: fp32 wider than 1024: panels", 100000, 1032, F32, "cpu", {}, "cpu_panels",
     dict(panel_blocks=1, panel_rows_per_block=6250)),
    ("cpu: no workspace", 100000, 64, BF16, "cpu", dict(workspace_bytes=0), "cpu_rows", {}),
    ("cpu: fewer than 128 rows, all in one panel", 50, 64, BF16, "cpu", dict(workspace_bytes=50 * 128), "cpu_panels",
     dict(panel_rows_per_block=50)),
    ("cpu: fewer than 128 rows, not all", 50, 64, BF16, "cpu", dict(workspace_bytes=49 * 128), "cpu_rows", {}),
]


@pytest.mark.parametrize("rows,n,dtype,device,kwargs,expected,fields", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_policy_table(rows, n, dtype, device, kwargs, expected, fields):
    plan = route(rows, n, dtype, device, **dict(kwargs))
    assert plan.route == expected, plan
    for name, value in fields.items():
        assert getattr(plan, name) == value, (name, plan)


FORCED = [
    # (id, rows, n, dtype, device, call keywords, forced route and options, expected route, expected plan fields)
    ("panels over wgmma", 40000, 1024, BF16, "h100", dict(workspace_bytes=4 * MiB), dict(forced="panels"),
     "panels_small_blocks", {}),
    ("panels need a bound: the policy decides", 40000, 1024, BF16, "h100", dict(workspace_bytes=0),
     dict(forced="panels"), "wgmma_grid", {}),
    ("panels, one GEMM per block", 40000, 1024, BF16, "h100", dict(workspace_bytes=4 * MiB),
     dict(forced="panels", panels_batched=False), "panels_small_blocks", dict(panels_batched=False)),
    ("waves over wgmma", 40000, 1024, BF16, "h100", {}, dict(forced="waves"), "waves", {}),
    ("waves too narrow: the policy decides", 40000, 1024, BF16, "h100", dict(facts=dict(waves_max_width=512)),
     dict(forced="waves"), "wgmma_counted", {}),
    ("wgmma at any size", 1, 8, BF16, "h100", dict(workspace_bytes=0), dict(forced="wgmma"), "wgmma_grid",
     dict(tiles_per_cta=1, group_ctas=1, groups=1)),
    ("wgmma counted at any size", 1, 8, BF16, "h100", dict(workspace_bytes=4 * MiB), dict(forced="wgmma_counted"),
     "wgmma_counted", dict(groups=1, counter_bytes=4)),
    ("wgmma counted: the grid's plan with counters", 40000, 1024, BF16, "h100", {}, dict(forced="wgmma_counted"),
     "wgmma_counted", dict(tiles_per_cta=1, group_ctas=4, groups=33, counter_bytes=313 * 4)),
    ("wgmma counters need a 2 MiB bound: the policy decides", 40000, 1024, F16, "h100",
     dict(workspace_bytes=2 * MiB - 1), dict(forced="wgmma_counted"), "wgmma_grid", {}),
    ("wgmma counters at a 2 MiB bound", 40000, 1024, F16, "h100", dict(workspace_bytes=2 * MiB),
     dict(forced="wgmma_counted"), "wgmma_counted", {}),
    ("wgmma counters over 1 MiB do not fit: the policy decides", 40_000_000, 8, BF16, "h100", {},
     dict(forced="wgmma_counted"), "wgmma_grid", {}),
    ("wgmma grid forced over counters", 40000, 1024, BF16, "h100", {}, dict(forced="wgmma_grid"), "wgmma_grid",
     dict(counter_bytes=0)),
    ("wgmma grid where no group fits: the policy decides", 4096, 8192, BF16, "h100", dict(facts=dict(wgmma_ctas=16)),
     dict(forced="wgmma_grid"), "wgmma_clusters", {}),
    ("wgmma clusters forced", 40000, 1024, BF16, "h100", {}, dict(forced="wgmma_clusters"), "wgmma_clusters", {}),
    ("wgmma two tiles per CTA", 1000, 1024, BF16, "h100", dict(workspace_bytes=0),
     dict(forced="wgmma", tiles_per_cta=2, col_tile=256), "wgmma_grid", dict(tiles_per_cta=2, group_ctas=2)),
    ("wgmma two tiles per CTA, counted", 1000, 1024, BF16, "h100", dict(workspace_bytes=4 * MiB),
     dict(forced="wgmma_counted", tiles_per_cta=2, col_tile=256), "wgmma_counted", dict(tiles_per_cta=2, group_ctas=2)),
    ("wgmma 192-column tiles", 65536, 768, BF16, "h100", {}, dict(forced="wgmma", col_tile=192), "wgmma_counted",
     dict(tiles_per_cta=1, group_ctas=4, groups=33, col_tile=192)),
    ("wgmma 256-column tiles", 8192, 768, BF16, "h100", {}, dict(forced="wgmma", col_tile=256), "wgmma_grid",
     dict(col_tile=256)),
    ("wgmma 192-column tiles at n = 8192: groups of 43", 4096, 8192, BF16, "h100", dict(workspace_bytes=0),
     dict(forced="wgmma", col_tile=192), "wgmma_grid", dict(tiles_per_cta=1, group_ctas=43, groups=3)),
    ("wgmma with a tile width: the 128-row kernel", 16384, 512, BF16, "h100", dict(workspace_bytes=0),
     dict(forced="wgmma", col_tile=192), "wgmma_grid", dict(group_ctas=3, col_tile=192)),
    ("wgmma misaligned: the policy decides", 4096, 1024, BF16, "h100", dict(x_aligned=False, workspace_bytes=0),
     dict(forced="wgmma"), "waves", {}),
    ("wgmma at n = 512: the 64-row kernel", 100, 512, BF16, "h100", dict(workspace_bytes=0), dict(forced="wgmma"),
     "wgmma_rows", dict(groups=2)),
    ("wgmma with tiles per CTA: the 128-row kernel", 100, 512, BF16, "h100", dict(workspace_bytes=0),
     dict(forced="wgmma", tiles_per_cta=1, col_tile=256), "wgmma_grid", dict(tiles_per_cta=1, group_ctas=2)),
    ("wgmma counted at n = 512", 16384, 512, BF16, "h100", dict(workspace_bytes=4 * MiB),
     dict(forced="wgmma_counted"), "wgmma_counted", dict(group_ctas=2)),
    ("wgmma_rows at any width from 136 to 512", 1, 136, F16, "h100", dict(workspace_bytes=0),
     dict(forced="wgmma_rows"), "wgmma_rows", dict(tiles_per_cta=1, group_ctas=1, groups=1)),
    ("wgmma_rows under three k-steps: the policy decides", 1, 128, F16, "h100", dict(workspace_bytes=0),
     dict(forced="wgmma_rows"), "wgmma_grid", {}),
    ("wgmma_rows past 512: the policy decides", 40000, 1024, BF16, "h100", {}, dict(forced="wgmma_rows"),
     "wgmma_counted", {}),
    # clusters, forced: the cheapest of one or two tiles a CTA (one only up to 8 column tiles), clusters of at
    # most 16 CTAs that can be scheduled
    ("clusters: 5 rounds of two tiles (33 k-steps each) against 11 of one (17)", 40000, 1024, BF16, "h100", {},
     dict(forced="wgmma_clusters"), "wgmma_clusters",
     dict(tiles_per_cta=2, group_ctas=2, groups=66, col_tile=256, counter_bytes=0)),
    ("clusters: one tile per CTA where two save too few rounds: 21 of 33 k-steps against 11 of 65", 40000, 2048,
     BF16, "h100", {}, dict(forced="wgmma_clusters"), "wgmma_clusters", dict(tiles_per_cta=1, group_ctas=8, groups=15)),
    ("clusters: 192-column tiles where 256 leave a round mostly empty: 1 round of two tiles on 66 clusters of 2 "
     "against 2 of one tile on 43 clusters of 3", 8192, 768, BF16, "h100", {}, dict(forced="wgmma_clusters"),
     "wgmma_clusters", dict(tiles_per_cta=2, group_ctas=2, groups=64, col_tile=192)),
    ("clusters: two tiles per CTA where they take fewer rounds", 8192, 1024, BF16, "h100", {},
     dict(forced="wgmma_clusters"), "wgmma_clusters", dict(tiles_per_cta=2, group_ctas=2, groups=64)),
    ("clusters: 256-column tiles at 12288 x 1024, two a CTA: 2 rounds of 33 k-steps against 4 of 17", 12288, 1024,
     BF16, "h100", {}, dict(forced="wgmma_clusters", col_tile=256), "wgmma_clusters",
     dict(tiles_per_cta=2, group_ctas=2, groups=66)),
    ("clusters: one tile per CTA where clusters of two cannot be scheduled", 8192, 1024, BF16, "h100",
     dict(facts=dict(wgmma_clusters=[0, 132, 0] + clusters(H100_GPCS, 1)[3:])),
     dict(forced="wgmma_clusters", col_tile=256), "wgmma_clusters", dict(tiles_per_cta=1, group_ctas=4, groups=30)),
    ("clusters: two tiles per CTA from 9 column tiles", 40000, 2056, BF16, "h100", {},
     dict(forced="wgmma_clusters", col_tile=256), "wgmma_clusters", dict(tiles_per_cta=2, group_ctas=5)),
    ("clusters: n = 8192 in clusters of 16", 4096, 8192, BF16, "h100", {}, dict(forced="wgmma_clusters"),
     "wgmma_clusters", dict(tiles_per_cta=2, group_ctas=16, groups=7)),
    ("clusters: 192-column tiles, two a CTA", 65536, 1024, BF16, "h100", {},
     dict(forced="wgmma_clusters", tiles_per_cta=2, col_tile=192), "wgmma_clusters",
     dict(tiles_per_cta=2, group_ctas=3, groups=43, col_tile=192)),
    ("clusters: 192-column tiles cannot reach n = 8192 (clusters of at most 16)", 4096, 8192, BF16, "h100",
     dict(workspace_bytes=0), dict(forced="wgmma_clusters", col_tile=192), "wgmma_grid", {}),
    ("clusters: one tile per CTA cannot reach n = 8192", 4096, 8192, BF16, "h100", dict(workspace_bytes=0),
     dict(forced="wgmma_clusters", tiles_per_cta=1), "wgmma_grid", {}),
    ("wgmma_rows in fp32: the policy decides", 4096, 512, F32, "h100", dict(workspace_bytes=0),
     dict(forced="wgmma_rows"), "ffma_grid", {}),
    ("ffma at any size", 1, 4, F32, "h100", dict(workspace_bytes=4 * MiB), dict(forced="ffma"), "ffma_counted",
     dict(group_ctas=1, groups=1)),
    ("ffma over contiguous panels", 40000, 4096, F32, "h100", {}, dict(forced="ffma"), "ffma_counted", {}),
    ("ffma grid barrier forced over counters", 40000, 1024, F32, "h100", {}, dict(forced="ffma_grid"), "ffma_grid",
     dict(counter_bytes=0)),
    ("ffma two tiles per CTA, counted", 40000, 1000, F32, "h100", dict(workspace_bytes=4 * MiB),
     dict(forced="ffma", tiles_per_cta=2), "ffma_counted", dict(tiles_per_cta=2, group_ctas=4, groups=66)),
    ("ffma two tiles per CTA, grid barrier", 40000, 1412, F32, "h100", dict(workspace_bytes=0),
     dict(forced="ffma_grid", tiles_per_cta=2), "ffma_grid", dict(tiles_per_cta=2, group_ctas=6, groups=44)),
    ("ffma two tiles where one tile's group does not fit", 40000, 40000, F32, "h100", dict(workspace_bytes=0),
     dict(forced="ffma_grid", tiles_per_cta=2), "ffma_grid", dict(tiles_per_cta=2, group_ctas=157, groups=1)),
    ("ffma where no group fits: the policy decides", 1000, 70000, F32, "h100", dict(workspace_bytes=0),
     dict(forced="ffma_grid"), "waves", {}),
    ("ffma counted without a bound: the policy decides", 40000, 1024, F32, "h100", dict(workspace_bytes=0),
     dict(forced="ffma_counted"), "ffma_grid", {}),
    ("ffma with TF32 allowed: the policy decides", 4096, 1024, F32, "h100",
     dict(allow_tf32=True, workspace_bytes=4 * MiB), dict(forced="ffma"), "waves", {}),
    ("ffma misaligned: the policy decides", 4096, 1024, F32, "h100", dict(x_aligned=False, workspace_bytes=0),
     dict(forced="ffma"), "waves", {}),
]


@pytest.mark.parametrize(
    "rows,n,dtype,device,kwargs,options,expected,fields", [c[1:] for c in FORCED], ids=[c[0] for c in FORCED]
)
def test_forced_routes(rows, n, dtype, device, kwargs, options, expected, fields):
    plan = route(rows, n, dtype, device, **dict(kwargs), **options)
    assert plan.route == expected, plan
    for name, value in fields.items():
        assert getattr(plan, name) == value, (name, plan)


@pytest.mark.parametrize("workspace_bytes", [0, 1, MiB])
def test_too_wide_without_workspace_is_an_error(workspace_bytes):
    with pytest.raises(RuntimeError, match="too wide for the zero-workspace kernel.*pass a larger workspace_bytes"):
        route(100, 8192, BF16, "a100", workspace_bytes=workspace_bytes, facts=dict(waves_max_width=4096))


def test_no_cooperative_launch_and_no_room_is_an_error():
    # A device where the waves kernel cannot run at all (waves_max_width 0).
    with pytest.raises(RuntimeError, match="too wide for the zero-workspace kernel"):
        route(100, 64, F64, "a100", workspace_bytes=0, facts=dict(waves_max_width=0))


SHAPES = [(rows, n) for rows in (1, 127, 4097, 40000, 262144) for n in (8, 512, 1000, 1024, 2056, 4096, 8192)]
BOUNDS = [None, 0, 1, 2 * MiB - 1, 2 * MiB, 5 * MiB, 10 * MiB - 1, 10 * MiB, 10 * MiB + 1, 64 * MiB]


@pytest.mark.parametrize("dtype", [F16, BF16, F32, F64])
@pytest.mark.parametrize("device", ["h100", "a100"])
def test_every_plan_keeps_reserved_memory_within_the_bound(dtype, device):
    """What a plan allocates stays within the bound once the caching allocator has
    rounded it: 1 MiB blocks (and counters) come two to a 2 MiB segment, one buffer
    is a multiple of 2 MiB."""
    for rows, n in SHAPES:
        for bound in BOUNDS:
            plan = route(rows, n, dtype, device, workspace_bytes=bound)
            limit = min(64 * MiB, rows * n * dtype.itemsize // 16) if bound is None else bound
            if plan.counter_bytes:
                assert plan.counter_bytes <= MiB and 2 * MiB <= limit, (rows, n, bound, plan)
            if plan.route == "panels_small_blocks":
                assert plan.panel_block_bytes == MiB and (plan.panel_blocks + 1) // 2 * 2 * MiB <= limit
            elif plan.route == "panels_one_buffer":
                assert plan.panel_block_bytes % (2 * MiB) == 0 and plan.panel_block_bytes <= limit
            if plan.route.startswith("panels"):
                assert 1 <= plan.panel_rows_per_block <= rows and plan.panel_rows_per_block * n * dtype.itemsize <= (
                    plan.panel_block_bytes
                )
            if plan.route in ("wgmma_grid", "wgmma_clusters", "wgmma_rows", "ffma_grid", "waves"):
                assert plan.workspace_bytes == 0


def test_bad_arguments_are_refused():
    with pytest.raises(RuntimeError, match="square_matmul route must be one of"):
        route(10, 8, BF16, forced="fused")
    with pytest.raises(RuntimeError, match="tiles_per_cta must be 0"):
        route(10, 8, BF16, forced="wgmma", tiles_per_cta=3)
    with pytest.raises(RuntimeError, match="must have|unsupported dtype"):
        route(10, 8, torch.int32)
    with pytest.raises(RuntimeError, match="cpu_l2_bytes must be None or >= 0"):
        route(10, 8, F32, "cpu", cpu_l2_bytes=-1)


def _sysfs_l2_bytes():
    """cpu0's L2 size from sysfs, or None."""
    import glob

    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(f"{index}/level") as f:
                level = f.read().strip()
            with open(f"{index}/type") as f:
                kind = f.read().strip()
            with open(f"{index}/size") as f:
                size = f.read().strip()
        except OSError:
            continue
        if level == "2" and kind in ("Unified", "Data") and size.endswith("K"):
            return int(size[:-1]) * 1024
    return None


def test_cpu_facts_are_this_machines():
    """The facts the op routes by: on Intel, L2 as the OS reports it; elsewhere no L2 rule."""
    try:
        with open("/proc/cpuinfo") as f:
            intel = "GenuineIntel" in f.read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    l2 = _sysfs_l2_bytes()
    if intel and l2 is None:
        pytest.skip("the OS does not report the L2 size")
    n = 1024  # w of 4 MiB: past the L2 of every CPU this library has seen
    expected = "cpu_panels" if intel and n * n * 4 > l2 else "cpu_rows"
    assert route(4096, n, F32, "cpu", cpu_l2_bytes=None).route == expected


THIS_MACHINE = dict(cpu_bf16_dot=None, cpu_amx=None, cpu_rows_bf16_dot=None)


def test_cpu_bf16_fact_is_this_machines():
    """bfloat16 takes the row kernel exactly where an x86-64 CPU has no bfloat16
    dot products, or has them for the row kernel too (AVX-512 in use) and no AMX."""
    import os
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the fact is read on x86-64 only (elsewhere: torch's GEMM)")
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read().split()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    dot = "avx512_bf16" in flags
    avx512 = all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))
    avx512 = avx512 and os.environ.get("ATEN_CPU_CAPABILITY", "avx512") not in ("default", "avx2")
    rows = not dot or (avx512 and "amx_bf16" not in flags)
    assert route(4096, 512, BF16, "cpu", **THIS_MACHINE).route == ("cpu_rows" if rows else "cpu_panels")


def test_cpu_bf16_calls_follow_this_machines_fact():
    """The op's bfloat16 CPU plan is the policy's with this machine's facts (the
    panels run ATen's GEMM, seen in the profiler), and either way it computes x @ w."""
    import make_inplace

    for n in (64, 512):
        x = torch.randn(4096, n).bfloat16()
        w = (torch.randn(n, n) / n**0.5).bfloat16()
        expected = (x.double() @ w.double()).bfloat16()
        with torch.profiler.profile() as prof:
            make_inplace.square_matmul_(x, w)
        gemm = any(e.name in ("aten::mm", "aten::addmm") for e in prof.events())
        assert gemm == (route(4096, n, BF16, "cpu", **THIS_MACHINE).route == "cpu_panels"), n
        torch.testing.assert_close(x, expected, rtol=1.6e-2, atol=1e-2)


def test_cpu_calls_follow_the_l2_rule_of_this_machine():
    """The op's CPU plan is the policy's with this machine's facts (on Intel a
    float32 w that outgrows L2 takes ATen's GEMM panels, seen in the profiler)."""
    import make_inplace

    for n in (64, 512, 768, 1024):
        x = torch.randn(4096, n)
        w = torch.randn(n, n) / n**0.5
        expected = x @ w
        with torch.profiler.profile() as prof:
            make_inplace.square_matmul_(x, w)
        gemm = any(e.name in ("aten::mm", "aten::addmm") for e in prof.events())
        assert gemm == (route(4096, n, F32, "cpu", cpu_l2_bytes=None).route == "cpu_panels"), n
        torch.testing.assert_close(x, expected, rtol=1e-4, atol=1e-4)


def test_forced_route_sets_and_restores_the_switch():
    default = torch.ops.make_inplace._route_override()
    assert default == ("", 0, 0, True, True)
    with forced_route("wgmma", tiles_per_cta=2, col_tile=192, staged_rows=False):
        assert torch.ops.make_inplace._route_override() == ("wgmma", 2, 192, True, False)
        with forced_route("panels", panels_batched=False):
            assert torch.ops.make_inplace._route_override() == ("panels", 0, 0, False, True)
        assert torch.ops.make_inplace._route_override() == ("wgmma", 2, 192, True, False)
    assert torch.ops.make_inplace._route_override() == default
    with pytest.raises(RuntimeError, match="square_matmul route must be one of"):
        with forced_route("fused"):
            pass
    with pytest.raises(RuntimeError, match="col_tile must be 0"):
        with forced_route("wgmma", col_tile=128):
            pass
    assert torch.ops.make_inplace._route_override() == default


def test_every_forced_name_is_accepted():
    for name in FORCED_ROUTES:
        with forced_route(name):
            assert torch.ops.make_inplace._route_override()[0] == name


@pytest.mark.parametrize("route_name", [None, "panels", "waves", "wgmma", "ffma"])
def test_forced_routes_leave_cpu_results_unchanged(route_name):
    """The CPU has its own routes: a forced CUDA route changes nothing there."""
    import make_inplace

    x = torch.randn(300, 64, dtype=torch.float64)
    w = torch.randn(64, 64, dtype=torch.float64)
    expected = x @ w
    with forced_route(route_name):
        make_inplace.square_matmul_(x, w)
    torch.testing.assert_close(x, expected)


HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not HOPPER, reason="staged rows run on sm_90 (H100/H200)")
@pytest.mark.parametrize("staged_rows", [True, False])
def test_cuda_staged_rows_can_be_switched_off(staged_rows):
    """forced_route(staged_rows=False) keeps softmax_ and layer_norm_ off their staged
    kernels (long rows then stream through global memory); results stay right."""
    import make_inplace

    x = torch.randn(64, 65536, device="cuda", dtype=torch.bfloat16)
    expected_softmax = torch.softmax(x.float(), dim=-1)
    expected_norm = torch.nn.functional.layer_norm(x.float(), (65536,))

    def run():
        a, b = x.clone(), x.clone()
        make_inplace.softmax_(a)
        make_inplace.layer_norm_(b, (65536,))
        torch.cuda.synchronize()
        return a, b

    with forced_route(staged_rows=staged_rows):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            a, b = run()
    names = " ".join(e.name for e in prof.events())
    assert ("softmax_staged_kernel" in names) == staged_rows, names
    assert ("layer_norm_staged" in names) == staged_rows, names
    # bf16 tolerances of tests/test_softmax.py and tests/test_layer_norm.py
    torch.testing.assert_close(a.double(), expected_softmax.double(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(b.double(), expected_norm.double(), rtol=1e-2, atol=3e-2)
