// square_matmul_'s workspace arithmetic (see square_matmul_workspace.h).
#include "make_inplace/square_matmul_workspace.h"

#include <algorithm>

#include "make_inplace/square_matmul_tuning.h"

namespace make_inplace::square_matmul {

int64_t workspace_bound(int64_t x_bytes, std::optional<int64_t> workspace_bytes) {
  if (workspace_bytes.has_value()) return *workspace_bytes;
  return std::min(kDefaultWorkspaceCap, x_bytes / kDefaultWorkspaceFraction);
}

bool counters_fit(int64_t bound, int64_t counter_bytes) {
  return bound >= kSmallSegmentBytes && counter_bytes <= kSmallBlockBytes;
}

PanelPlan plan_panels(int64_t bound, int64_t row_bytes, int64_t rows) {
  PanelPlan p;
  if (bound >= kOneBufferMinBound) {
    p.blocks = 1;
    p.block_bytes = bound / kLargeRoundBytes * kLargeRoundBytes;
    p.rows_per_block = p.block_bytes / row_bytes;
  } else if (bound >= kSmallSegmentBytes) {
    p.small_blocks = true;
    p.blocks = static_cast<int>(
        std::min<int64_t>(kSmallSegmentBytes / kSmallBlockBytes * (bound / kSmallSegmentBytes), kMaxPanelBlocks));
    p.block_bytes = kSmallBlockBytes;
    p.rows_per_block = (kSmallBlockBytes - kPointerTailBytes) / row_bytes;
  }
  // cuBLAS takes int sizes; more rows than x has would only waste workspace.
  p.rows_per_block = std::min<int64_t>({p.rows_per_block, rows, int64_t{1} << 30});
  if (p.rows_per_block >= 1) {
    p.blocks = static_cast<int>(std::min<int64_t>(p.blocks, (rows + p.rows_per_block - 1) / p.rows_per_block));
  } else {
    p = PanelPlan{};
  }
  p.batched = p.blocks > 1;
  return p;
}

}  // namespace make_inplace::square_matmul
