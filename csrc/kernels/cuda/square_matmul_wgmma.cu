// The Hopper square matmul for 16-bit types: x[rows, n] <- x @ w (+ bias),
// or x @ w^T with transpose, on wgmma tensor cores fed by TMA, using no
// device memory beyond x, w and bias (cluster and grid modes) or one counter
// per 128-row block (counted mode). How many tiles each CTA computes, the group
// size and the grid come from the routing policy (square_matmul_route.h).
//
// Why clusters: every result tile of a 128-row block of x reads the whole
// block, so nothing of the block may be written back until every tile of it
// has been computed. A cluster of C CTAs owns one row-block at a time: CTA r
// computes column tiles r, r + C, ... of the block. Its first tile is parked
// in shared memory, already rounded to x's dtype; with two tiles per CTA the
// second stays in the accumulator registers. Each CTA then tells every CTA
// of the cluster it is done with the block (an mbarrier arrive over
// distributed shared memory). Once all C are done, the store warp writes the
// parked tile over x (TMA store) while the consumers' next block is already
// loading; a held tile is parked in its turn once that store has read the
// park, and stored the same way (written from registers it was slow). Row-blocks of
// different clusters are disjoint, so no grid-wide barrier and no global
// counter are needed. Two tiles per CTA halve the cluster size, which packs
// clusters into the GPCs better, and reach rows of 8192 (32 tiles over 16
// CTAs).
//
// Counted mode: clusters must fit in a GPC and leave SMs idle. Given a
// counter per row-block, a cooperative grid of plain CTAs (all resident)
// fills every SM instead: groups of consecutive CTAs play the clusters, and
// "done" is an add to the row-block's counter, awaited with acquire loads;
// the launch zeroes the counters itself, behind one grid barrier at its start.
// Grid mode: the same groups without counters; at the end of each round of
// row-blocks (one per group) each CTA's store warp meets every other at the
// cooperative grid's barrier. The loads and the tensor work of the next
// round go on meanwhile: only the stores wait. The policy takes counters
// where the bound has room for them, else the grid's barrier; clusters only
// where a group does not fit in one cooperative grid.
//
// CTA layout (384 threads): warpgroup 0 issues the TMA loads (one thread),
// and another of its warps tells the group "done" and issues the TMA stores;
// warpgroups 1 and 2 each compute 64 rows of the 128 x 256 tile with
// wgmma.m64n256k16 (fp32 accumulators in registers). Shared memory: a
// 3-stage ring of 128 x 64 x-tiles and 64 x 256 w-tiles (128-byte swizzle, as
// TMA writes and wgmma reads them), then the park (four 128 x 64 TMA boxes).
// 128 x 192 tiles take wgmma.m64n192k16, a 4-stage ring and three boxes.
// Variants tried and dropped are in docs/square_matmul.md.
#include "make_inplace/kernels/square_matmul_wgmma.h"

#include <cstdint>

#include "make_inplace/kernels/row_block_groups.cuh"
#include "make_inplace/kernels/sm90_sync.cuh"
#include "make_inplace/kernels/wgmma_sm90.cuh"

namespace make_inplace::kernels {
namespace {

using namespace wgmma_sm90;

constexpr int kBM = static_cast<int>(wgmma::kRowBlock);
constexpr int kThreads = 384;
constexpr int kATileBytes = kBM * kBK * 2;        // 16 KiB
constexpr int kSmemLimit = 227 * 1024;            // sm_90 shared memory per block
constexpr int kSmemExtra = 1024 /* alignment */ + 256 /* barriers */;
constexpr int kWide = static_cast<int>(wgmma::kColTile), kNarrow = static_cast<int>(wgmma::kNarrowColTile);

// The shared memory of a CTA computing 128 x kBN result tiles: the park (one
// tile), then as many ring stages (an x-tile and a w-tile) as fit beside it:
// 3 for 256 columns, 4 for 192.
template <int kBN>
struct Tile {
  static_assert(kBN == kWide || kBN == kNarrow, "256- or 192-column tiles");
  static constexpr int kBTileBytes = kBN * kBK * 2;  // 32 or 24 KiB
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  static constexpr int kParkBytes = kBM * kBN * 2;   // 64 or 48 KiB
  static constexpr int kStages = (kSmemLimit - kParkBytes - kSmemExtra) / kStageBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes + kParkBytes + kSmemExtra;
  static constexpr int kAcc = kBN / 2;  // a consumer thread's accumulators for 64 x kBN results
};
static_assert(Tile<256>::kStages == 3 && Tile<192>::kStages == 4, "ring stages");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kConsumerThreads = 256;             // warpgroups 1 and 2
constexpr int kParkBoxBytes = kBM * kBoxCols * 2; // a 128 x 64 box of results, 16 KiB

using row_block_groups::count_done;
using row_block_groups::grid_arrive;
using row_block_groups::grid_wait;
using row_block_groups::wait_count;
using sm90::cluster_sync;
using sm90::mbar_arrive;
using sm90::mbar_arrive_expect_tx;
using sm90::mbar_wait;

// How the CTAs owning a row-block tell one another they are done reading it:
// mbarriers over distributed shared memory (a cluster), a counter per
// row-block in global memory (the counted mode) or the grid's barrier (grid
// mode). j counts this CTA's row-blocks; the two cluster barriers alternate
// by its parity.
struct BlockDone {
  uint64_t* bars;          // [2], cluster mode
  uint32_t* counters;      // counted mode, else null
  uint32_t* grid_barrier;  // grid mode, else null
  int ctas;

  // By the lanes of one warp: lane q tells CTA q of the cluster, all at once
  // rather than one after another. Returns lane 0's token for wait.
  __device__ __forceinline__ uint32_t arrive(int rb, int j, int lane) const {
    if (grid_barrier != nullptr) return lane == 0 ? grid_arrive(grid_barrier) : 0;
    if (counters != nullptr) {
      if (lane == 0) count_done(counters + rb);
    } else if (lane < ctas) {
      sm90::mbar_arrive_in_cta(&bars[j & 1], lane);
    }
    return 0;
  }

  // By lane 0.
  __device__ __forceinline__ void wait(int rb, int j, uint32_t token) const {
    if (grid_barrier != nullptr) {
      grid_wait(grid_barrier, token);
    } else if (counters != nullptr) {
      wait_count(counters + rb, ctas);
    } else {
      mbar_wait<true>(&bars[j & 1], (j >> 1) & 1);
    }
  }
};

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The column tiles CTA `rank` of a cluster of `ctas` computes in each
// row-block: rank + t * ctas for t < kTiles, while below col_tiles. Tile 0
// is parked in shared memory; with kTiles = 2, tile 1 is held in registers
// until the park is free again. x itself is reached through x_map only.
template <typename Elem, bool kWeightKMajor, int kTiles, int kBN>
__global__ void __launch_bounds__(kThreads, 1)
    square_matmul_wgmma_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                               const void* bias, int64_t rows, int n, int col_tiles,
                               uint32_t* counters, int group_ctas) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStages = Tile<kBN>::kStages, kStageBytes = Tile<kBN>::kStageBytes;
  constexpr int kParkBytes = Tile<kBN>::kParkBytes;
  extern __shared__ uint8_t smem_raw[];
  // TMA's 128-byte swizzle repeats every 1024 bytes: align the ring and parking to it.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* park = smem + kStages * kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(park + kParkBytes);
  uint64_t* empty = full + kStages;
  uint64_t* done = empty + kStages;  // [2], by row-block parity: every CTA of the cluster is done with it
  uint64_t* park_free = done + 2;    // the store warp has read the parked tile out
  uint64_t* held_parked = park_free + 1;  // the consumers have parked their held tile
  uint64_t* block_read = held_parked + 1;  // the consumers' last k-step of the row-block is done, its tile parked

  // Counted and grid modes (group_ctas > 0): groups of group_ctas
  // consecutive CTAs stand in for clusters, and per-row-block counters (or
  // the grid's barrier, without counters) for the cluster barriers.
  const bool grouped = group_ctas > 0;
  const bool grid = grouped && counters == nullptr;
  const int ctas = grouped ? group_ctas : static_cast<int>(sm90::cluster_size());
  const int rank = grouped ? static_cast<int>(blockIdx.x) % ctas : static_cast<int>(sm90::cluster_rank());
  const BlockDone block_done{done, counters, grid ? row_block_groups::grid_barrier_word() : nullptr, ctas};
  const int cluster = blockIdx.x / ctas;
  const int clusters = gridDim.x / ctas;
  const int row_blocks = static_cast<int>((rows + kBM - 1) / kBM);
  const int k_tiles = (n + kBK - 1) / kBK;
  const int warpgroup = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&full[s], 1);
      sm90::mbar_init(&empty[s], kConsumerThreads / 32);
    }
    sm90::mbar_init(&done[0], ctas);
    sm90::mbar_init(&done[1], ctas);
    sm90::mbar_init(park_free, 1);
    sm90::mbar_init(held_parked, 1);
    sm90::mbar_init(block_read, 1);
    sm90::mbar_init_fence();
  }
  cluster_sync();  // no CTA arrives on another's barriers before they exist

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (warp == 0 && lane == 0) {  // TMA loads, in the consumers' order
      StageRing<kStages> ring;
      for (int rb = cluster; rb < row_blocks; rb += clusters) {
        for (int t = 0; t < kTiles && rank + t * ctas < col_tiles; ++t) {
          const int c = rank + t * ctas;
          for (int kt = 0; kt < k_tiles; ++kt, ring.advance()) {
            const int stage = ring.stage;
            mbar_wait(&empty[stage], ring.phase ^ 1);
            mbar_arrive_expect_tx(&full[stage], kStageBytes);
            uint8_t* a = smem + stage * kStageBytes;
            uint8_t* b = a + kATileBytes;
            tma_load(a, &x_map, &full[stage], kt * kBK, rb * kBM);
            if (kWeightKMajor) {  // w[c*kBN + j][k]: one kBN-row box
              tma_load(b, &w_map, &full[stage], kt * kBK, c * kBN);
            } else {  // w[k][c*kBN + j]: kBN / 64 boxes of 64 columns
              for (int i = 0; i < kBN / kBoxCols; ++i) {
                tma_load(b + i * kWBoxBytes, &w_map, &full[stage], c * kBN + i * kBoxCols, kt * kBK);
              }
            }
          }
        }
      }
    } else if (warp == 1) {  // the group's "done" (lanes) and the TMA stores of the parked tiles (lane 0)
      // Stores the park as column tile c of row-block rb, and frees it once read.
      const auto store_park = [&](int c, int rb) {
        for (int i = 0; i < kBN / kBoxCols && c * kBN + i * kBoxCols < n; ++i) {
          tma_store(&x_map, park + i * kParkBoxBytes, c * kBN + i * kBoxCols, rb * kBM);
        }
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        mbar_arrive(park_free);
      };
      const bool holds = kTiles == 2 && rank + ctas < col_tiles;
      // Counted mode: the launch zeroes its own counters (no memset launch
      // before it), each CTA its share, and the CTAs meet once at the grid's
      // barrier before the first count. Meanwhile the first tiles compute.
      if (counters != nullptr && lane == 0) {
        for (int rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) counters[rb] = 0;
        uint32_t* word = row_block_groups::grid_barrier_word();
        grid_wait(word, grid_arrive(word));
      }
      __syncwarp();
      int j = 0;
      for (int rb = cluster; rb < row_blocks; rb += clusters, ++j) {
        // This warp, not the consumers, tells the group: the release at
        // cluster or GPU scope then costs the consumers nothing.
        mbar_wait(block_read, j & 1);
        const uint32_t token = block_done.arrive(rb, j, lane);
        if (lane == 0) {
          block_done.wait(rb, j, token);
          // Every CTA of the cluster has consumed this row-block's x (its TMA
          // loads completed before its last wgmma); order those async-proxy
          // reads before the async-proxy writes below.
          asm volatile("fence.proxy.async.global;" ::: "memory");
          store_park(rank, rb);
          if (holds) {
            mbar_wait(held_parked, j & 1);
            store_park(rank + ctas, rb);
          }
        }
        __syncwarp();
      }
      // Grid mode: a group left without a row-block in the last round still
      // arrives, or the others would wait for it forever.
      if (grid && lane == 0 && j < (row_blocks + clusters - 1) / clusters) grid_arrive(block_done.grid_barrier);
      if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int half = warpgroup - 1;  // rows half*64 .. half*64 + 63 of each tile
    StageRing<kStages> ring;
    int j = 0, parks = 0;
    float acc[Tile<kBN>::kAcc];
    // One tile a CTA: its column tile is the same every round, so its bias
    // is loaded once, here, not on the path of every park (where the load's
    // latency held up the consumers: docs/square_matmul.md).
    uint32_t bias_bits[Tile<kBN>::kAcc / 4];
    if (kTiles == 1 && bias != nullptr) load_bias_bits(bias, int64_t{rank} * kBN, n, lane, bias_bits);
    const auto tiles = [&](int stage) {
      return StepTiles{shared_address(smem + stage * kStageBytes) + half * 64 * 128,
                       shared_address(smem + stage * kStageBytes + kATileBytes)};
    };
    // Parks this warpgroup's half of acc as column tile c, once the store
    // warp has read the park's previous tile out.
    const auto park_acc = [&](int c) {
      if (bias != nullptr && kTiles != 1) load_bias_bits(bias, int64_t{c} * kBN, n, lane, bias_bits);
      if (parks > 0) mbar_wait(park_free, (parks - 1) & 1);
      if (bias != nullptr) {
        park_tile<Elem, true, kBM>(acc, park, bias_bits, half * 64, warp, lane);
      } else {
        park_tile<Elem, false, kBM>(acc, park, bias_bits, half * 64, warp, lane);
      }
      ++parks;
    };
    for (int rb = cluster; rb < row_blocks; rb += clusters, ++j) {
      int held = -1;  // the column tile left in acc, if any
      for (int t = 0; t < kTiles && rank + t * ctas < col_tiles; ++t) {
        const int c = rank + t * ctas;
        const int last = run_k_steps<Elem, kWeightKMajor>(acc, ring, full, empty, k_tiles, lane, tiles);
        if (lane == 0) mbar_arrive(&empty[last]);
        if (t == 1) {
          held = c;
        } else {
          park_acc(c);
        }
      }
      // Make the parked tile visible to TMA, then tell the store warp that
      // this CTA is done with the row-block.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
      if (threadIdx.x == 128) mbar_arrive(block_read);
      if (held >= 0) {
        // The park is free once the first tile's store has read it, which
        // the store warp issues only after the whole group is done with
        // these rows: the held tile may follow it over x.
        park_acc(held);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
        if (threadIdx.x == 128) mbar_arrive(held_parked);
      }
    }
  }
  __syncwarp();
  cluster_sync();  // no CTA leaves while others may still arrive on its barriers
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a: square_matmul_wgmma_supports never lets this launch
#endif
}

using KernelFn = void (*)(const CUtensorMap, const CUtensorMap, const void*, int64_t, int, int, uint32_t*, int);

// The variants built: one or two tiles a CTA, of 256 or 192 columns.
template <typename Elem, bool kKMajor, int kBN>
KernelFn kernel_for(int tiles) {
  return tiles == 1 ? square_matmul_wgmma_kernel<Elem, kKMajor, 1, kBN>
         : tiles == 2 ? square_matmul_wgmma_kernel<Elem, kKMajor, 2, kBN>
                      : nullptr;
}

template <typename Elem, bool kKMajor>
KernelFn kernel_for(int tiles, int col_tile) {
  return col_tile == kWide     ? kernel_for<Elem, kKMajor, kWide>(tiles)
         : col_tile == kNarrow ? kernel_for<Elem, kKMajor, kNarrow>(tiles)
                               : nullptr;
}

KernelFn kernel_for(ScalarKind kind, bool k_major, int tiles, int col_tile) {
  if (kind == ScalarKind::kBFloat16) {
    return k_major ? kernel_for<__nv_bfloat16, true>(tiles, col_tile)
                   : kernel_for<__nv_bfloat16, false>(tiles, col_tile);
  }
  return k_major ? kernel_for<__half, true>(tiles, col_tile) : kernel_for<__half, false>(tiles, col_tile);
}

int smem_bytes(int col_tile) {
  return col_tile == kNarrow ? Tile<kNarrow>::kSmemBytes : Tile<kWide>::kSmemBytes;
}

constexpr bool kBuiltForSm90a =
#if defined(MAKE_INPLACE_SM90A)
    true;
#else
    false;
#endif

// How many clusters of `ctas` CTAs of this variant fit on the current device
// at once (0: none, e.g. a cluster size the device cannot schedule); ctas = 0
// asks how many plain CTAs fit (the counted mode's cooperative grid). Sets the
// kernel's attributes on the way, so a launch of the variant finds them set.
int active_clusters(int device, KernelFn kernel, int smem, int ctas) {
  int count = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    if (ctas == 0) {
      int per_sm = 0, sms = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) == cudaSuccess &&
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess) {
        count = per_sm * sms;
      }
    } else {
      cudaLaunchAttribute attr;
      const cudaLaunchConfig_t config = row_block_groups::launch_config(ctas, kThreads, smem, ctas, nullptr, &attr);
      if (cudaOccupancyMaxActiveClusters(&count, reinterpret_cast<const void*>(kernel), &config) != cudaSuccess) {
        count = 0;
      }
    }
  }
  (void)cudaGetLastError();
  return count;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool square_matmul_wgmma_built() { return kBuiltForSm90a; }

bool square_matmul_wgmma_tensor_maps() { return tensor_map_encoder() != nullptr; }

Residency square_matmul_wgmma_residency(ScalarKind kind, bool transpose, int tiles_per_cta, int col_tile) {
  Residency r;
  if (!kBuiltForSm90a || (kind != ScalarKind::kFloat16 && kind != ScalarKind::kBFloat16)) return r;
  const KernelFn kernel = kernel_for(kind, transpose, tiles_per_cta, col_tile);
  int device = 0;
  if (kernel == nullptr || cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return r;
  }
  const int smem = smem_bytes(col_tile);
  r.ctas = active_clusters(device, kernel, smem, 0);
  for (int c = 1; c <= kMaxClusterCtas; ++c) r.clusters[c] = active_clusters(device, kernel, smem, c);
  return r;
}

cudaError_t square_matmul_wgmma(ScalarKind kind, void* x, const void* w, const void* bias, int64_t rows, int64_t n,
                                bool transpose, const RowBlockLaunch& launch, uint32_t* counters,
                                cudaStream_t stream) {
  if (!kBuiltForSm90a || (kind != ScalarKind::kFloat16 && kind != ScalarKind::kBFloat16) || n < 8 || n % 8 != 0 ||
      n > wgmma::kMaxN || rows < 0 || rows > kMaxGroupRows || !aligned16(x) || !aligned16(w)) {
    return cudaErrorNotSupported;
  }
  const KernelFn kernel = kernel_for(kind, transpose, launch.tiles_per_cta, launch.col_tile);
  const int col_tiles = static_cast<int>((n + launch.col_tile - 1) / launch.col_tile);
  const bool counted = counters != nullptr;
  const bool clusters = launch.meet == GroupMeet::kClusters;
  if (kernel == nullptr || launch.groups < 1 || launch.group_ctas < 1 ||
      int64_t{launch.group_ctas} * launch.tiles_per_cta < col_tiles ||
      counted != (launch.meet == GroupMeet::kCounters) || (clusters && launch.group_ctas > kMaxClusterCtas)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  // x is loaded and stored in 128 x 64 boxes. transpose: x @ w^T reads w's
  // rows along k (K-major, col_tile x 64 boxes); otherwise x @ w reads w's
  // rows along the output columns (N-major, 64 x 64 boxes).
  CUtensorMap x_map, w_map;
  if (tensor_map_encoder() == nullptr) return cudaErrorNotSupported;
  if (!encode_map(&x_map, kind, x, rows, n, kBM) ||
      !encode_map(&w_map, kind, w, n, n, transpose ? launch.col_tile : kBK)) {
    return cudaErrorInvalidValue;
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config =
      row_block_groups::launch_config(launch.groups * launch.group_ctas, kThreads, smem_bytes(launch.col_tile),
                                      clusters ? launch.group_ctas : 0, stream, &attr);
  return cudaLaunchKernelEx(&config, kernel, x_map, w_map, bias, rows, static_cast<int>(n), col_tiles, counters,
                            clusters ? 0 : launch.group_ctas);
}

}  // namespace make_inplace::kernels
