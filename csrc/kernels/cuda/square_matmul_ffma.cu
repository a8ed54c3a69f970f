// The float32 square matmul on CUDA cores: x[rows, n] <- x @ w (+ bias), or
// x @ w^T with transpose, written over x with one counter per 128-row block
// as the only extra memory (or none, at the grid's barrier).
//
// Why: cuBLAS's SGEMM cannot write over its input, so the panel route runs it
// on panels that fit the workspace bound, each one wave of the GPU, and copies
// each back. Here the whole product is one kernel: a cooperative grid (every
// CTA resident) in groups of ceil(n / (128 t)) CTAs. A group owns one 128-row
// block at a time and each of its CTAs computes t = 1 or 2 of the block's
// 128 x 128 result tiles: the last in registers, the first (t = 2) parked in
// shared memory. Reading the block is finished when every CTA of the group
// has added 1 to the block's counter; only then does a CTA write its tiles
// over x. Groups own disjoint blocks, so there is nothing else to order.
// Without memory for the counters the groups meet at the cooperative
// launch's own grid-wide barrier, once per round of row-blocks: every group
// then waits for the slowest of its round. The routing policy
// (square_matmul_route.h) picks the mode, the tiles per CTA and the grid.
//
// The main loop is a classic SIMT SGEMM: k-slices of 8 staged through
// registers into double-buffered shared memory (x's slice transposed so that
// each thread reads its 8 rows at one k as two 16-byte loads), and an 8 x 8
// register tile per thread (two 4 x 4 quarters 16 rows and 32 columns apart,
// so a warp's 16-byte shared loads are broadcasts or conflict-free).
#include "make_inplace/kernels/square_matmul_ffma.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "make_inplace/kernels/row_block_groups.cuh"

namespace make_inplace::kernels {
namespace {

constexpr int kBM = static_cast<int>(ffma::kRowBlock), kBN = static_cast<int>(ffma::kColTile), kBK = 8;
// Four warps as 2 x 2, each 64 x 64 of the tile; a thread holds 16 x 8
// results (the register budget of 255 allows it with two CTAs per SM, which
// keeps 8 warps per SM and lets every SM hold two CTAs of the grid).
constexpr int kThreads = 128;
constexpr int kCtasPerSm = 2;
// Row stride of a transposed slice in shared memory: k and k + 4, which one
// warp writes together, land 16 banks apart.
constexpr int kPad = kBM + 4;
// A thread's 16 x 8 results as float4s, and the dynamic shared memory that
// parks every tile of a CTA but its last (64 KiB a tile: with the slices,
// two CTAs of two tiles still fit an SM).
constexpr int kAccQuads = 32;
constexpr int park_bytes(int tiles) { return (tiles - 1) * kAccQuads * kThreads * 16; }

// A 16-byte global load, zero where !ok. (volatile: the compiler may neither
// drop nor merge it; the unconditional call in the main loop is what keeps it
// ahead of the FFMAs.)
__device__ __forceinline__ float4 load4(const float* p, bool ok) {
  float4 v;
  asm volatile(
      "{\n\t.reg .pred q;\n\t"
      "setp.ne.b32 q, %5, 0;\n\t"
      "mov.f32 %0, 0f00000000;\n\tmov.f32 %1, 0f00000000;\n\t"
      "mov.f32 %2, 0f00000000;\n\tmov.f32 %3, 0f00000000;\n\t"
      "@q ld.global.v4.f32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "l"(p), "r"(static_cast<int>(ok)));
  return v;
}

__device__ __forceinline__ void store_column(float (*slice)[kPad], int k, int m, float4 v) {
  slice[k + 0][m] = v.x;
  slice[k + 1][m] = v.y;
  slice[k + 2][m] = v.z;
  slice[k + 3][m] = v.w;
}

// kTransB: w is read as w^T (x @ w^T, nn.Linear's layout), so its slice is
// 128 rows of w along k and is transposed like x's. kTiles: result tiles per
// CTA (1 or 2). kCounted: the groups meet on counters, else at the grid
// barrier (a variant of its own: with both in one kernel the counted mode
// ran 1-2% slower).
template <bool kTransB, int kTiles, bool kCounted>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    square_matmul_ffma_kernel(float* x, const float* __restrict__ w, const float* __restrict__ bias, int rows, int n,
                uint32_t* counters, int group) {
  __shared__ __align__(16) float a_slice[2][kBK][kPad];
  __shared__ __align__(16) float b_slice[2][kBK][kPad];
  extern __shared__ float4 park[];  // [kTiles - 1][kAccQuads][kThreads]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int col_tiles = (n + kBN - 1) / kBN;
  const int first_tile = (blockIdx.x % group) * kTiles;
  const int my_tiles = min(kTiles, col_tiles - first_tile);  // >= 1: group = ceil(col_tiles / kTiles)
  const int groups = gridDim.x / group;
  const int row_blocks = (rows + kBM - 1) / kBM;
  const int k_slices = (n + kBK - 1) / kBK;

  // This thread's results: rows tm + 16q + (0..3) for q = 0..3 and columns
  // tn + 32h + (0..3) for h = 0..1 of the tile. A quarter-warp shares tm (its
  // x loads are one broadcast) and covers 32 consecutive columns (128 bytes).
  const int tm = (warp >> 1) * 64 + (lane >> 3) * 4;
  const int tn = (warp & 1) * 64 + (lane & 7) * 4;

  // What this thread loads per k-slice: 4 consecutive k of rows ld_row and
  // ld_row + 64 of x (two threads per row), and of w either 4 columns of
  // k rows wb_k and wb_k + 4 (x @ w) or 4 consecutive k of two rows of w
  // (x @ w^T).
  const int ld_row = tid >> 1, ld_k = (tid & 1) * 4;
  const int wb_k = tid >> 5, wb_col = (tid & 31) * 4;
  const int64_t w_half = kTransB ? int64_t{64} * n : int64_t{4} * n;  // the second load
  const int64_t w_step = kTransB ? kBK : static_cast<int64_t>(kBK) * n;

  float acc[16][8];

  // acc <- rows [row0, row0 + 128) of x times the columns [col0, col0 + 128)
  // of w (or w^T). Ends with a barrier after which both slices are free.
  auto product = [&](int row0, int col0) {
    const float* w_src = kTransB ? w + static_cast<int64_t>(col0 + ld_row) * n + ld_k
                                 : w + static_cast<int64_t>(wb_k) * n + col0 + wb_col;
    const bool w_ok0 = kTransB ? col0 + ld_row < n : col0 + wb_col < n;
    const bool w_ok1 = kTransB ? col0 + ld_row + 64 < n : w_ok0;
    const bool x_ok0 = row0 + ld_row < rows, x_ok1 = row0 + ld_row + 64 < rows;
    const float* x_src = x + static_cast<int64_t>(row0 + ld_row) * n + ld_k;
    const int64_t x_half = int64_t{64} * n;

    float4 xa0, xa1, wb0, wb1;
    auto fetch = [&](int s) {
      const int k = s * kBK;
      const bool xk = k + ld_k < n;
      xa0 = load4(x_src + k, x_ok0 && xk);
      xa1 = load4(x_src + x_half + k, x_ok1 && xk);
      const float* ws = w_src + s * w_step;
      if (kTransB) {
        wb0 = load4(ws, w_ok0 && xk);
        wb1 = load4(ws + w_half, w_ok1 && xk);
      } else {
        wb0 = load4(ws, w_ok0 && k + wb_k < n);
        wb1 = load4(ws + w_half, w_ok1 && k + wb_k + 4 < n);
      }
    };
    auto stash = [&](int buf) {
      store_column(a_slice[buf], ld_k, ld_row, xa0);
      store_column(a_slice[buf], ld_k, ld_row + 64, xa1);
      if (kTransB) {
        store_column(b_slice[buf], ld_k, ld_row, wb0);
        store_column(b_slice[buf], ld_k, ld_row + 64, wb1);
      } else {
        *reinterpret_cast<float4*>(&b_slice[buf][wb_k][wb_col]) = wb0;
        *reinterpret_cast<float4*>(&b_slice[buf][wb_k + 4][wb_col]) = wb1;
      }
    };

#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    fetch(0);
    stash(0);
    __syncthreads();
    for (int s = 0; s < k_slices; ++s) {
      const int buf = s & 1;
      // Unconditional (the last slice refetches itself into the idle
      // buffer): a branch here lets the compiler move the loads after the
      // FFMAs, which exposes their latency at every slice.
      fetch(min(s + 1, k_slices - 1));
#pragma unroll
      for (int k = 0; k < kBK; ++k) {
        float a[16], b[8];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float4 v = *reinterpret_cast<const float4*>(&a_slice[buf][k][tm + 16 * q]);
          a[4 * q] = v.x, a[4 * q + 1] = v.y, a[4 * q + 2] = v.z, a[4 * q + 3] = v.w;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float4 v = *reinterpret_cast<const float4*>(&b_slice[buf][k][tn + 32 * h]);
          b[4 * h] = v.x, b[4 * h + 1] = v.y, b[4 * h + 2] = v.z, b[4 * h + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < 16; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
      stash(buf ^ 1);
      __syncthreads();
    }
  };

  // acc (+ bias) over the tile at (row0, col0) of x.
  auto store = [&](int row0, int col0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = col0 + tn + 32 * h;
      if (col >= n) continue;
      float4 bv = make_float4(0.f, 0.f, 0.f, 0.f);
      if (bias != nullptr) bv = *reinterpret_cast<const float4*>(bias + col);
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int row = row0 + tm + (i & 3) + 16 * (i >> 2);
        if (row >= rows) continue;
        const float4 v = make_float4(acc[i][4 * h] + bv.x, acc[i][4 * h + 1] + bv.y,
                                     acc[i][4 * h + 2] + bv.z, acc[i][4 * h + 3] + bv.w);
        *reinterpret_cast<float4*>(x + static_cast<int64_t>(row) * n + col) = v;
      }
    }
  };

  // A thread parks and unparks only its own slots (consecutive threads,
  // consecutive 16 bytes: no bank conflicts), so no barrier guards them.
  auto park_acc = [&](int slot) {
#pragma unroll
    for (int q = 0; q < kAccQuads; ++q) {
      const int i = q >> 1, h = q & 1;
      park[(slot * kAccQuads + q) * kThreads + tid] =
          make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]);
    }
  };
  auto unpark_acc = [&](int slot) {
#pragma unroll
    for (int q = 0; q < kAccQuads; ++q) {
      const int i = q >> 1, h = q & 1;
      const float4 v = park[(slot * kAccQuads + q) * kThreads + tid];
      acc[i][4 * h] = v.x, acc[i][4 * h + 1] = v.y, acc[i][4 * h + 2] = v.z, acc[i][4 * h + 3] = v.w;
    }
  };

  // At the grid barrier every CTA takes part in every round, its group's
  // row-block or not (the last round may leave groups without one).
  const int rounds = (row_blocks + groups - 1) / groups;
  const int end = kCounted ? row_blocks : rounds * groups;
  for (int rb = blockIdx.x / group; rb < end; rb += groups) {
    const int row0 = rb * kBM;
    const bool owned = kCounted || rb < row_blocks;
    if (owned) {
      if constexpr (kTiles == 1) {
        product(row0, first_tile * kBN);
      } else {
        for (int t = 0; t < my_tiles; ++t) {
          product(row0, (first_tile + t) * kBN);
          if (t + 1 < my_tiles) park_acc(t);
        }
      }
    }

    // Every load of this block by this CTA has landed in shared memory
    // before the barrier that ends product(): tell the group, then wait for
    // all of it. (The next round's blocks are other rows: one barrier a
    // round orders every read of a block before any write over it.)
    if constexpr (kCounted) {
      if (tid == 0) {
        row_block_groups::count_done(counters + rb);
        row_block_groups::wait_count(counters + rb, group);
      }
      __syncthreads();
    } else {
      cooperative_groups::this_grid().sync();
    }
    if (!owned) continue;

    store(row0, (first_tile + my_tiles - 1) * kBN);
    for (int t = 0; t + 1 < my_tiles; ++t) {
      unpark_acc(t);
      store(row0, (first_tile + t) * kBN);
    }
  }
}

using KernelFn = void (*)(float*, const float*, const float*, int, int, uint32_t*, int);

template <bool kCounted>
KernelFn kernel_for(bool transpose, int tiles) {
  if (tiles == 2) {
    return transpose ? square_matmul_ffma_kernel<true, 2, kCounted> : square_matmul_ffma_kernel<false, 2, kCounted>;
  }
  return transpose ? square_matmul_ffma_kernel<true, 1, kCounted> : square_matmul_ffma_kernel<false, 1, kCounted>;
}

KernelFn kernel_for(bool transpose, int tiles, bool counted) {
  return counted ? kernel_for<true>(transpose, tiles) : kernel_for<false>(transpose, tiles);
}

// How many CTAs fit on the device at once in a cooperative grid, in both
// modes (0 where it cannot launch one).
int resident(int device, bool transpose, int tiles) {
  int sms = 0, cooperative = 0, fit = 0;
  bool known = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
               cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) == cudaSuccess &&
               cooperative;
  for (const bool counted : {true, false}) {
    const KernelFn kernel = kernel_for(transpose, tiles, counted);
    int per_sm = 0;
    known = known &&
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, park_bytes(tiles)) ==
                cudaSuccess &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, park_bytes(tiles)) == cudaSuccess;
    fit = counted ? per_sm : std::min(fit, per_sm);
  }
  (void)cudaGetLastError();
  return known ? fit * sms : 0;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int square_matmul_ffma_resident_ctas(bool transpose, int tiles_per_cta) {
  int device = 0;
  if (tiles_per_cta < 1 || tiles_per_cta > ffma::kMaxTilesPerCta || cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return resident(device, transpose, tiles_per_cta);
}

cudaError_t square_matmul_ffma(float* x, const float* w, const float* bias, int64_t rows, int64_t n, bool transpose,
                               const RowBlockLaunch& launch, uint32_t* counters, cudaStream_t stream) {
  const bool counted = counters != nullptr;
  if (n < 4 || n % 4 != 0 || rows < 0 || rows > kMaxGroupRows || !aligned16(x) || !aligned16(w) ||
      !aligned16(bias)) {
    return cudaErrorNotSupported;
  }
  const int tiles = launch.tiles_per_cta;
  const int64_t col_tiles = (n + kBN - 1) / kBN;
  if (tiles < 1 || tiles > ffma::kMaxTilesPerCta || launch.group_ctas != (col_tiles + tiles - 1) / tiles ||
      launch.groups < 1 || launch.meet != (counted ? GroupMeet::kCounters : GroupMeet::kGridBarrier)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  if (counted) {
    const cudaError_t zeroed = cudaMemsetAsync(counters, 0, row_block_counter_bytes(rows), stream);
    if (zeroed != cudaSuccess) return zeroed;
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = row_block_groups::launch_config(
      launch.groups * launch.group_ctas, kThreads, park_bytes(tiles), 0, stream, &attr);
  return cudaLaunchKernelEx(&config, kernel_for(transpose, tiles, counted), x, w, bias, static_cast<int>(rows),
                            static_cast<int>(n), counters, launch.group_ctas);
}

}  // namespace make_inplace::kernels
