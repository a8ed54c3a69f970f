// The Hopper square matmul for 16-bit types: x[rows, n] <- x @ w (+ bias),
// or x @ w^T with transpose, on wgmma tensor cores fed by TMA, using no
// device memory beyond x, w and bias (cluster mode) or one counter per
// 128-row block (counted mode). How many tiles each CTA computes, the group
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
// "done" is an add to the row-block's counter, awaited with acquire loads.
//
// CTA layout (384 threads): warpgroup 0 issues the TMA loads (one thread),
// and another of its warps tells the group "done" and issues the TMA stores;
// warpgroups 1 and 2 each compute 64 rows of the 128 x 256 tile with
// wgmma.m64n256k16 (fp32 accumulators in registers). Shared memory: a
// 3-stage ring of 128 x 64 x-tiles and 64 x 256 w-tiles (128-byte swizzle, as
// TMA writes and wgmma reads them), then the park (four 128 x 64 TMA boxes).
// Variants tried and dropped are in docs/square_matmul.md.
#include "make_inplace/kernels/square_matmul_wgmma.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "make_inplace/kernels/packed_rows.cuh"
#include "make_inplace/kernels/row_block_groups.cuh"
#include "make_inplace/kernels/sm90_sync.cuh"

namespace make_inplace::kernels {
namespace {

constexpr int kBM = static_cast<int>(wgmma::kRowBlock), kBN = static_cast<int>(wgmma::kColTile);
constexpr int kBK = 64;  // 64 16-bit elements: one 128-byte swizzle row
constexpr int kThreads = 384;
constexpr int kStages = 3;
constexpr int kATileBytes = kBM * kBK * 2;        // 16 KiB
constexpr int kBTileBytes = kBN * kBK * 2;        // 32 KiB
constexpr int kStageBytes = kATileBytes + kBTileBytes;
constexpr int kBoxCols = 64;                      // 128 bytes: the TMA box width along a row
constexpr int kParkBytes = kBM * kBN * 2;         // 64 KiB
constexpr int kSmemBytes = kStages * kStageBytes + kParkBytes + 1024 /* alignment */ + 256 /* barriers */;
constexpr int kMaxTilesPerCta = wgmma::kMaxTilesPerCta;  // one parked, one held in registers
static_assert(kSmemBytes <= 227 * 1024, "sm_90 shared memory per block");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kConsumerThreads = 256;             // warpgroups 1 and 2
constexpr int kWBoxBytes = kBK * kBoxCols * 2;    // a 64 x 64 box of w (no transpose), 8 KiB
constexpr int kParkBoxBytes = kBM * kBoxCols * 2; // a 128 x 64 box of results, 16 KiB

using rowwise::pack_pair;
using rowwise::to_acc;
using row_block_groups::count_done;
using row_block_groups::wait_count;
using sm90::cluster_sync;
using sm90::mbar_arrive;
using sm90::mbar_arrive_expect_tx;
using sm90::mbar_wait;
using sm90::shared_address;

// How the CTAs owning a row-block tell one another they are done reading it:
// mbarriers over distributed shared memory (a cluster) or a counter per
// row-block in global memory (the counted mode). j counts this CTA's
// row-blocks; the two barriers alternate by its parity.
struct BlockDone {
  uint64_t* bars;      // [2], cluster mode
  uint32_t* counters;  // null in cluster mode
  int ctas;

  // By the lanes of one warp: lane q tells CTA q of the cluster, all at once
  // rather than one after another.
  __device__ __forceinline__ void arrive(int rb, int j, int lane) const {
    if (counters != nullptr) {
      if (lane == 0) count_done(counters + rb);
    } else if (lane < ctas) {
      sm90::mbar_arrive_in_cta(&bars[j & 1], lane);
    }
  }

  __device__ __forceinline__ void wait(int rb, int j) const {
    if (counters != nullptr) {
      wait_count(counters + rb, ctas);
    } else {
      mbar_wait<true>(&bars[j & 1], (j >> 1) & 1);
    }
  }
};

__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(col), "r"(row)
      : "memory");
}

__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int col, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(shared_address(src)), "r"(col), "r"(row)
               : "memory");
}

// A shared-memory matrix descriptor with the 128-byte swizzle (PTX ISA,
// "Matrix Descriptor Format"): start address, leading and stride byte offsets.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t leading, uint32_t stride) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>(leading >> 4) << 16 |
         static_cast<uint64_t>(stride >> 4) << 32 | uint64_t{1} << 62;
}

#define MI_WGMMA_ACC_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

#define MI_WGMMA_ACC_OPERANDS(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// d (+)= A[64 x 16] * B[16 x 256]; A K-major, B K-major (kTransB = 0) or
// N-major (kTransB = 1); accumulate = 0 overwrites d.
#define MI_WGMMA_M64N256K16(type)                                                            \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                             \
  "wgmma.mma_async.sync.aligned.m64n256k16.f32." type "." type " {" MI_WGMMA_ACC_REGS \
  "}, %128, %129, p, 1, 1, 0, %131;\n}\n"

template <typename Elem, int kTransB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile(MI_WGMMA_M64N256K16("bf16")
                 : MI_WGMMA_ACC_OPERANDS(d)
                 : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB));
  } else {
    asm volatile(MI_WGMMA_M64N256K16("f16")
                 : MI_WGMMA_ACC_OPERANDS(d)
                 : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB));
  }
}

#undef MI_WGMMA_M64N256K16
#undef MI_WGMMA_ACC_REGS
#undef MI_WGMMA_ACC_OPERANDS

// Rounds a 64-row half of a result tile (this warpgroup's accumulators, plus
// the bias in fp32) into the parked tile, in the 128-byte-swizzled layout of
// the four 128 x 64 TMA boxes that store it. wgmma's accumulator layout:
// register 4i + {0, 1} holds row warp*16 + lane/4, columns 8i + 2(lane%4) +
// {0, 1}; 4i + {2, 3} the same columns 8 rows down. That is stmatrix's 8 x 8
// fragment layout, so one stmatrix.x4 writes column groups i and i + 1 of the
// warp's 16 rows (a quarter of the instructions 4-byte stores take).
template <typename Elem, bool kBias>
__device__ __forceinline__ void park_tile(const float (&acc)[128], uint8_t* tile, const Elem* bias, int64_t col0,
                                          int n, int half, int warp, int lane) {
  // Lane l addresses row l % 8 of matrix l / 8: matrices 0 and 1 are the top
  // and bottom 8 rows of group i, 2 and 3 those of group i + 1.
  const int matrix = lane / 8;
  const int row = half * 64 + warp * 16 + (matrix & 1) * 8 + lane % 8;
  const uint32_t row_base = shared_address(tile) + row * 128;
#pragma unroll
  for (int i = 0; i < 32; i += 2) {
    float b[4] = {0.f, 0.f, 0.f, 0.f};  // columns of groups i and i + 1 this lane holds
    if constexpr (kBias) {
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        const int64_t col = col0 + (i + g) * 8 + (lane % 4) * 2;  // n % 8 == 0: col < n covers col + 1
        if (col < n) b[2 * g] = to_acc(bias[col]), b[2 * g + 1] = to_acc(bias[col + 1]);
      }
    }
    // Without a bias the sums are skipped (x + 0.f is not free: it turns -0 into +0).
    const auto at_col = [&](int r, int g) { return kBias ? acc[r] + b[g] : acc[r]; };
    const int group = i + (matrix >> 1);
    // 16-byte chunk (group % 8) of a 128-byte row, XOR-swizzled by the row.
    const uint32_t at = row_base + (group / 8) * kParkBoxBytes + (((group % 8) ^ (row % 8)) * 16);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(at),
                 "r"(pack_pair(Elem{}, at_col(4 * i, 0), at_col(4 * i + 1, 1))),
                 "r"(pack_pair(Elem{}, at_col(4 * i + 2, 0), at_col(4 * i + 3, 1))),
                 "r"(pack_pair(Elem{}, at_col(4 * i + 4, 2), at_col(4 * i + 5, 3))),
                 "r"(pack_pair(Elem{}, at_col(4 * i + 6, 2), at_col(4 * i + 7, 3)))
                 : "memory");
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The column tiles CTA `rank` of a cluster of `ctas` computes in each
// row-block: rank + t * ctas for t < kTiles, while below col_tiles. Tile 0
// is parked in shared memory; with kTiles = 2, tile 1 is held in registers
// until the park is free again. x itself is reached through x_map only.
template <typename Elem, bool kWeightKMajor, int kTiles>
__global__ void __launch_bounds__(kThreads, 1)
    square_matmul_wgmma_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                               const void* bias, int64_t rows, int n, int col_tiles,
                               uint32_t* counters, int group_ctas) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
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

  // Counted mode: groups of group_ctas consecutive CTAs stand in for
  // clusters, and per-row-block counters for the cluster barriers.
  const bool counted = counters != nullptr;
  const int ctas = counted ? group_ctas : static_cast<int>(sm90::cluster_size());
  const int rank = counted ? static_cast<int>(blockIdx.x) % ctas : static_cast<int>(sm90::cluster_rank());
  const BlockDone block_done{done, counters, ctas};
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
      int stage = 0;
      uint32_t phase = 0;
      for (int rb = cluster; rb < row_blocks; rb += clusters) {
        for (int t = 0; t < kTiles && rank + t * ctas < col_tiles; ++t) {
          const int c = rank + t * ctas;
          for (int kt = 0; kt < k_tiles; ++kt) {
            mbar_wait(&empty[stage], phase ^ 1);
            mbar_arrive_expect_tx(&full[stage], kStageBytes);
            uint8_t* a = smem + stage * kStageBytes;
            uint8_t* b = a + kATileBytes;
            tma_load(a, &x_map, &full[stage], kt * kBK, rb * kBM);
            if (kWeightKMajor) {  // w[c*256 + j][k]: one 256-row box
              tma_load(b, &w_map, &full[stage], kt * kBK, c * kBN);
            } else {  // w[k][c*256 + j]: four 64-column boxes
              for (int i = 0; i < kBN / kBoxCols; ++i) {
                tma_load(b + i * kWBoxBytes, &w_map, &full[stage], c * kBN + i * kBoxCols, kt * kBK);
              }
            }
            if (++stage == kStages) stage = 0, phase ^= 1;
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
      int j = 0;
      for (int rb = cluster; rb < row_blocks; rb += clusters, ++j) {
        // This warp, not the consumers, tells the group: the release at
        // cluster or GPU scope then costs the consumers nothing.
        mbar_wait(block_read, j & 1);
        block_done.arrive(rb, j, lane);
        if (lane == 0) {
          block_done.wait(rb, j);
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
      if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int half = warpgroup - 1;  // rows half*64 .. half*64 + 63 of each tile
    int stage = 0, j = 0, parks = 0;
    uint32_t phase = 0;
    float acc[128];
    // Parks this warpgroup's half of acc as column tile c, once the store
    // warp has read the park's previous tile out.
    const auto park_acc = [&](int c) {
      if (parks > 0) mbar_wait(park_free, (parks - 1) & 1);
      const Elem* b = static_cast<const Elem*>(bias);
      if (b != nullptr) {
        park_tile<Elem, true>(acc, park, b, static_cast<int64_t>(c) * kBN, n, half, warp, lane);
      } else {
        park_tile<Elem, false>(acc, park, b, static_cast<int64_t>(c) * kBN, n, half, warp, lane);
      }
      ++parks;
    };
    for (int rb = cluster; rb < row_blocks; rb += clusters, ++j) {
      int held = -1;  // the column tile left in acc, if any
      for (int t = 0; t < kTiles && rank + t * ctas < col_tiles; ++t) {
        const int c = rank + t * ctas;
#pragma unroll
        for (int i = 0; i < 128; ++i) acc[i] = 0.f;
        int previous = 0;
        for (int kt = 0; kt < k_tiles; ++kt) {
          mbar_wait(&full[stage], phase);
          const uint32_t a = shared_address(smem + stage * kStageBytes) + half * 64 * 128;
          const uint32_t b = shared_address(smem + stage * kStageBytes + kATileBytes);
          asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
          for (int kk = 0; kk < kBK / 16; ++kk) {
            // K-major operands step 16 elements (32 bytes) inside the swizzled
            // row, 8-row groups 1024 bytes apart; the N-major w steps 16 rows
            // of 128 bytes, and its 64-column boxes lie kWBoxBytes apart.
            const uint64_t a_desc = smem_desc(a + kk * 32, 16, 1024);
            const uint64_t b_desc = kWeightKMajor ? smem_desc(b + kk * 32, 16, 1024)
                                                  : smem_desc(b + kk * 2048, kWBoxBytes, 1024);
            wgmma_m64n256k16<Elem, kWeightKMajor ? 0 : 1>(acc, a_desc, b_desc, (kt | kk) != 0);
          }
          asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
          asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
          if (kt > 0 && lane == 0) mbar_arrive(&empty[previous]);  // its wgmmas are done
          previous = stage;
          if (++stage == kStages) stage = 0, phase ^= 1;
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        if (lane == 0) mbar_arrive(&empty[previous]);
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

template <typename Elem>
KernelFn kernel_for(bool k_major, int tiles) {
  if (k_major) {
    return tiles == 1 ? square_matmul_wgmma_kernel<Elem, true, 1> : square_matmul_wgmma_kernel<Elem, true, 2>;
  }
  return tiles == 1 ? square_matmul_wgmma_kernel<Elem, false, 1> : square_matmul_wgmma_kernel<Elem, false, 2>;
}

KernelFn kernel_for(ScalarKind kind, bool k_major, int tiles) {
  return kind == ScalarKind::kBFloat16 ? kernel_for<__nv_bfloat16>(k_major, tiles)
                                       : kernel_for<__half>(k_major, tiles);
}

constexpr bool kBuiltForSm90a =
#if defined(MAKE_INPLACE_SM90A)
    true;
#else
    false;
#endif

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

// The driver's tensor-map encoder, through the runtime (no libcuda link).
EncodeTiled tensor_map_encoder() {
  static const EncodeTiled fn = []() -> EncodeTiled {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                             cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A row-major rows x cols matrix of 16-bit elements read or written in
// box_rows x 64 boxes with the 128-byte swizzle; zeros past the edges.
bool encode_map(CUtensorMap* map, ScalarKind kind, const void* base, uint64_t rows, uint64_t cols,
                uint32_t box_rows) {
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * 2};
  const cuuint32_t box[2] = {kBoxCols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const auto type = kind == ScalarKind::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return tensor_map_encoder()(map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// How many clusters of `ctas` CTAs of this variant fit on the current device
// at once (0: none, e.g. a cluster size the device cannot schedule); ctas = 0
// asks how many plain CTAs fit (the counted mode's cooperative grid). Sets the
// kernel's attributes on the way, so a launch of the variant finds them set.
int active_clusters(int device, ScalarKind kind, bool k_major, int tiles, int ctas) {
  const KernelFn kernel = kernel_for(kind, k_major, tiles);
  int count = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) == cudaSuccess &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    if (ctas == 0) {
      int per_sm = 0, sms = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kSmemBytes) == cudaSuccess &&
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess) {
        count = per_sm * sms;
      }
    } else {
      cudaLaunchAttribute attr;
      const cudaLaunchConfig_t config = row_block_groups::launch_config(ctas, kThreads, kSmemBytes, ctas, nullptr, &attr);
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

Residency square_matmul_wgmma_residency(ScalarKind kind, bool transpose, int tiles_per_cta) {
  Residency r;
  if (!kBuiltForSm90a || (kind != ScalarKind::kFloat16 && kind != ScalarKind::kBFloat16) || tiles_per_cta < 1 ||
      tiles_per_cta > wgmma::kMaxTilesPerCta) {
    return r;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return r;
  }
  r.ctas = active_clusters(device, kind, transpose, tiles_per_cta, 0);
  for (int c = 1; c <= kMaxClusterCtas; ++c) r.clusters[c] = active_clusters(device, kind, transpose, tiles_per_cta, c);
  return r;
}

cudaError_t square_matmul_wgmma(ScalarKind kind, void* x, const void* w, const void* bias, int64_t rows, int64_t n,
                                bool transpose, const RowBlockLaunch& launch, uint32_t* counters,
                                cudaStream_t stream) {
  if (!kBuiltForSm90a || (kind != ScalarKind::kFloat16 && kind != ScalarKind::kBFloat16) || n < 8 || n % 8 != 0 ||
      n > wgmma::kMaxN || rows < 0 || rows > kMaxGroupRows || !aligned16(x) || !aligned16(w)) {
    return cudaErrorNotSupported;
  }
  const int col_tiles = static_cast<int>((n + kBN - 1) / kBN);
  const bool counted = counters != nullptr;
  if (launch.tiles_per_cta < 1 || launch.tiles_per_cta > kMaxTilesPerCta || launch.groups < 1 ||
      launch.group_ctas < 1 || int64_t{launch.group_ctas} * launch.tiles_per_cta < col_tiles ||
      (!counted && launch.group_ctas > kMaxClusterCtas)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  // x is loaded and stored in 128 x 64 boxes. transpose: x @ w^T reads w's
  // rows along k (K-major, 256 x 64 boxes); otherwise x @ w reads w's rows
  // along the output columns (N-major, 64 x 64 boxes).
  CUtensorMap x_map, w_map;
  if (tensor_map_encoder() == nullptr) return cudaErrorNotSupported;
  if (!encode_map(&x_map, kind, x, rows, n, kBM) || !encode_map(&w_map, kind, w, n, n, transpose ? kBN : kBK)) {
    return cudaErrorInvalidValue;
  }
  if (counted) {
    const cudaError_t zeroed = cudaMemsetAsync(counters, 0, row_block_counter_bytes(rows), stream);
    if (zeroed != cudaSuccess) return zeroed;
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = row_block_groups::launch_config(
      launch.groups * launch.group_ctas, kThreads, kSmemBytes, counted ? 0 : launch.group_ctas, stream, &attr);
  return cudaLaunchKernelEx(&config, kernel_for(kind, transpose, launch.tiles_per_cta), x_map, w_map, bias, rows,
                            static_cast<int>(n), col_tiles, counters, counted ? launch.group_ctas : 0);
}

}  // namespace make_inplace::kernels
