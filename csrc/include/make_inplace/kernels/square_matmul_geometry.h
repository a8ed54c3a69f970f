#pragma once
// The shapes of the in-place square matmul kernels that the routing policy
// reasons about, and the launch facts passed between policy and kernels.
// Plain C++ (no CUDA, no torch): the policy is compiled in every build.
#include <array>
#include <cstdint>

namespace make_inplace::kernels {

// Largest thread-block cluster the H100/H200 can schedule (non-portable size).
constexpr int kMaxClusterCtas = 16;

// Hopper wgmma kernel: groups of CTAs own 128-row blocks; each CTA computes
// one or two result tiles of 128 x 256 (or 128 x 192: more, smaller groups
// where 256 columns leave a round of row-blocks mostly empty), one parked in
// shared memory and one in registers.
namespace wgmma {
constexpr int64_t kRowBlock = 128;
constexpr int64_t kColTile = 256;
constexpr int64_t kNarrowColTile = 192;
constexpr int kMaxTilesPerCta = 2;
// A row-block of results must fit in one cluster: 16 CTAs x 2 tiles x 256.
constexpr int64_t kMaxN = int64_t{kMaxClusterCtas} * kMaxTilesPerCta * kColTile;
}  // namespace wgmma

// Hopper wgmma kernel for rows of up to 512 columns: a CTA computes whole
// 64-row blocks (two 64 x 256 halves), so no CTA waits on another.
namespace wgmma_rows {
constexpr int64_t kRowBlock = 64;
constexpr int64_t kMaxN = 512;
// At least three 64-deep k-steps (its ring's stages): a block's last stage,
// held until its store, then keeps the consumers from finishing the next
// block first, which the store warp's barrier could not tell apart.
constexpr int64_t kMinN = 2 * 64 + 8;
}  // namespace wgmma_rows

// fp32 FFMA kernel: groups of CTAs own 128-row blocks; each CTA computes one
// or two 128 x 128 result tiles (the first parked in shared memory).
namespace ffma {
constexpr int64_t kRowBlock = 128;
constexpr int64_t kColTile = 128;
constexpr int kMaxTilesPerCta = 2;
}  // namespace ffma

// Both group kernels index rows with int and stop one row-block short of 2^31.
constexpr int64_t kMaxGroupRows = (int64_t{1} << 31) - 128;

// Bytes of the per-row-block counters of a counted launch (one uint32 each).
constexpr int64_t row_block_counter_bytes(int64_t rows) {
  return (rows + 127) / 128 * static_cast<int64_t>(sizeof(uint32_t));
}

// How many blocks of one kernel variant fit on a device at once: plain CTAs
// of a cooperative grid, and clusters of each size. Zeros where the variant
// cannot run (no cooperative launch, no clusters before sm_90, ...).
struct Residency {
  int ctas = 0;
  std::array<int, kMaxClusterCtas + 1> clusters{};  // [c]: clusters of c CTAs; [0] unused
};

// How the CTAs of a group tell one another they are done reading a
// row-block: a counter per row-block (device memory), the cooperative grid's
// barrier once a round of row-blocks (no memory; every group waits for the
// slowest), or thread-block clusters (wgmma only; no memory, but clusters
// must fit in one GPC and leave SMs idle).
enum class GroupMeet { kCounters, kGridBarrier, kClusters };

// A launch of a group kernel (wgmma, FFMA) as the policy planned it:
// `groups` groups of `group_ctas` CTAs, each CTA computing `tiles_per_cta`
// result tiles of the row-block its group owns, of `col_tile` columns (wgmma:
// 256 or 192; FFMA: always 128, the field unused). Counters and the grid
// barrier take one cooperative grid of plain CTAs.
struct RowBlockLaunch {
  int tiles_per_cta = 0;
  int group_ctas = 0;
  int groups = 0;
  int col_tile = static_cast<int>(wgmma::kColTile);
  GroupMeet meet = GroupMeet::kCounters;
};

}  // namespace make_inplace::kernels
