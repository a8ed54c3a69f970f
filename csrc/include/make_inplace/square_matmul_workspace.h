#pragma once
// square_matmul_'s workspace arithmetic: the bound on a call's extra memory,
// and the panel route's workspace cut so that the CUDA caching allocator
// reserves no more than the bound (square_matmul_tuning.h has its rules).
// Pure functions, torch-free.
#include <cstdint>
#include <optional>

namespace make_inplace::square_matmul {

// The bound on one call's extra memory: workspace_bytes when given, else
// 1/16 of x's x_bytes and at most 64 MiB.
int64_t workspace_bound(int64_t x_bytes, std::optional<int64_t> workspace_bytes);

// Whether per-row-block counters of counter_bytes fit the bound: they come
// from the small pool, which reserves a 2 MiB segment for them.
bool counters_fit(int64_t bound, int64_t counter_bytes);

// The panel route's workspace: each panel of rows is multiplied into
// `blocks` blocks of rows_per_block rows, then copied over x.
struct PanelPlan {
  bool small_blocks = false;   // separate 1 MiB allocations, else one buffer
  int blocks = 0;              // GEMM outputs of one panel
  int64_t block_bytes = 0;
  int64_t rows_per_block = 0;  // 0: no panel fits the bound
  bool batched = false;        // one batched GEMM for the full blocks of a panel
  int64_t panel_rows() const { return rows_per_block * blocks; }
  int64_t workspace_bytes() const { return blocks * block_bytes; }
};

// A bound of 10 MiB or more: one buffer rounded down to 2 MiB; 2-10 MiB:
// 1 MiB blocks, two per 2 MiB of bound (block 0 minus its pointer tail);
// less: no panels. Never more rows than x has (rows).
PanelPlan plan_panels(int64_t bound, int64_t row_bytes, int64_t rows);

}  // namespace make_inplace::square_matmul
