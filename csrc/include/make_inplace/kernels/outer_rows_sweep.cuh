#pragma once
// outer_product backward by whole rows: a CTA reads whole rows of grad_out,
// the rows of one batch item split step by step over a cluster of `split`
// CTAs, so the cluster streams each item front to back. A step forms R row
// sums per row-group (grad_a, complete within the CTA) and adds to the
// thread's column sums; at the item's end the column sums meet in shared
// memory, then across the cluster through distributed shared memory
// (grad_b). Every sum has a fixed order: deterministic, no atomics, no
// workspace.
//
// Why: the column sweep (a CTA a strip of columns, down every row), which
// still takes the rows this does not, read 16-bit (64, 4096, 4096) at 0.65
// of the copy bandwidth on an H200; this reads it at 1.0
// (docs/notes/outer_product.md).
#include <cuda_runtime.h>

#include <cstdint>

#include "make_inplace/kernels/cuda_pack.cuh"
#include "make_inplace/kernels/sm90_sync.cuh"

namespace make_inplace::kernels::outer_detail {

using namespace cuda_detail;

template <typename T>
__device__ __forceinline__ void store_result(T* dst, acc_t<T> value, bool accumulate) {
  *dst = from_acc<T>(accumulate ? to_acc(*dst) + value : value);
}

// The sums of a cluster's CTAs added up: `count` floats at `part` in each
// CTA's shared memory; CTA `rank` adds its share of them over the CTAs in
// rank order (distributed shared memory) and writes them to dst. The barrier
// before lets every part land; the one after keeps each CTA's part alive,
// unchanged, until its peers have read it.
template <typename T>
__device__ __forceinline__ void cluster_sums(const float* part, T* dst, int64_t count, int split, int rank,
                                             int tid, int threads, bool accumulate) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  sm90::cluster_sync();
  const int64_t share = (count + split - 1) / split;
  const int64_t end = min(count, (rank + 1) * share);
  const uint32_t local = sm90::shared_address(part);
  for (int64_t i = rank * share + tid; i < end; i += threads) {
    float sum = 0;
    for (int q = 0; q < split; ++q) {
      uint32_t remote;
      float v;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local + static_cast<uint32_t>(i * 4)), "r"(q));
      asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
      sum += v;
    }
    store_result(dst + i, sum, accumulate);
  }
  sm90::cluster_sync();
#endif
}

// Two packs a lane of each of 8 rows a step keep 128 bytes a thread in
// flight (4 rows: 0.65 ms against 0.86 at 16-bit (64, 4096, 4096); 16 rows of
// one pack, at 256 columns: 0.201 against 0.175).
constexpr int kSweepPacksPerLane = 2;
constexpr int kSweepStepRows = 8;

// Lane l < R ends with the warp's sum of v[l] (R a power of two up to 32):
// log2(R) halving exchanges, then a plain reduction over the other lanes.
template <int R, typename A>
__device__ __forceinline__ A warp_rows_sum(const A (&v)[R], int lane) {
  A cur[R];
#pragma unroll
  for (int j = 0; j < R; ++j) cur[j] = v[j];
#pragma unroll
  for (int h = R / 2; h >= 1; h /= 2) {
    const bool up = lane & h;
#pragma unroll
    for (int j = 0; j < h; ++j) {
      const A keep = up ? cur[j + h] : cur[j], send = up ? cur[j] : cur[j + h];
      cur[j] = keep + __shfl_xor_sync(0xffffffffu, send, h);
    }
  }
  A r = cur[0];
#pragma unroll
  for (int offset = R; offset < 32; offset *= 2) r += __shfl_xor_sync(0xffffffffu, r, offset);
  return r;
}

// The sweep's operands: grad_out (B, n, m) with contiguous rows, a (B, n),
// b (B, m), the gradients (B, n) and (B, m), contiguous.
template <typename T>
struct RowsSweepArgs {
  const T* g;
  int64_t gs0, gs1;
  const T* a;
  int64_t as0, as1;
  const T* b;
  int64_t bs0, bs1;
  bool b_packed;  // b's rows load as 16-byte packs
  T *grad_a, *grad_b;
  int64_t batch, n, m;
  bool accumulate;  // add to the gradients instead of overwriting them
};

// blockDim = (tx, ty), tx * ty = kCta, tx a multiple of 32 with tx * P * V
// >= m (P = kSweepPacksPerLane): lane x holds packs x + p * tx of its
// row-group's rows, which are contiguous 16-byte packs (the caller checks).
// Up to 128 registers: two 256-thread CTAs or one 512-thread CTA an SM.
template <typename T, int V, int kCta>
__global__ void __launch_bounds__(kCta, 512 / kCta)
    outer_rows_sweep_kernel(const RowsSweepArgs<T> args, int split) {
  using A = acc_t<T>;
  const T* __restrict__ g = args.g;
  const T* __restrict__ a = args.a;
  const T* __restrict__ b = args.b;
  T* __restrict__ grad_a = args.grad_a;
  T* __restrict__ grad_b = args.grad_b;
  const int64_t gs0 = args.gs0, gs1 = args.gs1, as0 = args.as0, as1 = args.as1, bs0 = args.bs0, bs1 = args.bs1;
  const int64_t batch = args.batch, n = args.n, m = args.m;
  const bool b_packed = args.b_packed, accumulate = args.accumulate;
  static_assert(sizeof(A) == 4, "the cluster reads column sums as f32");
  constexpr int P = kSweepPacksPerLane, R = kSweepStepRows;
  constexpr int kWarps = kCta / 32;
  __shared__ A row_part[2][R * kWarps];  // [step parity][row * kWarps + warp]
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  A* col_part = reinterpret_cast<A*>(dynamic_smem);  // [ty][m] column sums
  const int tx = blockDim.x, ty = blockDim.y;
  const int x = threadIdx.x, y = threadIdx.y;
  const int tid = y * tx + x, lane = tid & 31, warp = tid >> 5;
  const int warps_per_row = tx / 32;
  const int64_t packs = m / V;
  const int rank = split > 1 ? static_cast<int>(blockIdx.x % split) : 0;
  const int64_t cta_rows = int64_t{R} * ty;
  const int64_t cluster_rows = cta_rows * split;
  const int64_t steps = (n + cluster_rows - 1) / cluster_rows;
  int parity = 0;
  for (int64_t s = blockIdx.x / split; s < batch; s += gridDim.x / split) {
    const T* g_item = g + s * gs0;
    const T* a_item = a + s * as0;
    Pack<T, V> bv[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t c = x + p * tx;
      bv[p] = Pack<T, V>{};
      if (c < packs) bv[p] = load_pack<T, V>(b + s * bs0 + c * V * bs1, bs1, b_packed);
    }
    A col[P][V] = {};
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t r0 = step * cluster_rows + rank * cta_rows;
      // Loads go straight to their registers: rows past n and packs past m
      // read the last row or pack, and the sums skip them. (A value merged
      // after its load waits for it, and the next row's load waited too.)
      Pack<T, V> gv[R][P];
      A ai[R];
#pragma unroll
      for (int u = 0; u < R; ++u) {
        const int64_t i = r0 + u * ty + y < n ? r0 + u * ty + y : n - 1;
        ai[u] = to_acc(a_item[i * as1]);
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const int64_t c = x + p * tx < packs ? x + p * tx : packs - 1;
          gv[u][p] = *reinterpret_cast<const Pack<T, V>*>(g_item + i * gs1 + c * V);
        }
      }
      A row_sum[R];
#pragma unroll
      for (int u = 0; u < R; ++u) {
        row_sum[u] = 0;
        if (r0 + u * ty + y < n) {
#pragma unroll
          for (int p = 0; p < P; ++p) {
            if (x + p * tx < packs) {
              A ge[V], be[V];
              unpack(gv[u][p], ge);
              unpack(bv[p], be);
#pragma unroll
              for (int e = 0; e < V; ++e) {
                col[p][e] += ge[e] * ai[u];
                row_sum[u] += ge[e] * be[e];
              }
            }
          }
        }
      }
      // Each warp's part of the R rows, then the row's warps added in order.
      // Two buffers: one barrier a step keeps writers and readers apart.
      const A part = warp_rows_sum<R>(row_sum, lane);
      if (lane < R) row_part[parity][lane * kWarps + warp] = part;
      __syncthreads();
      if (tid < R * ty) {
        const int u = tid / ty, yy = tid - u * ty;
        const int64_t i = r0 + u * ty + yy;
        A sum = 0;
        for (int w = 0; w < warps_per_row; ++w) sum += row_part[parity][u * kWarps + yy * warps_per_row + w];
        if (i < n) store_result(grad_a + s * n + i, sum, accumulate);
      }
      parity ^= 1;
    }
    // Column sums: each row-group's in its own row of col_part, then each
    // column's added over the row-groups in order into row 0, which the
    // cluster's CTAs add up in rank order. The previous item's readers of
    // col_part passed the last barrier.
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int64_t c = x + p * tx;
      if (c < packs) {
#pragma unroll
        for (int e = 0; e < V; ++e) col_part[y * m + c * V + e] = col[p][e];
      }
    }
    __syncthreads();
    if (ty > 1) {
      for (int64_t j = tid; j < m; j += kCta) {
        A sum = col_part[j];
        for (int yy = 1; yy < ty; ++yy) sum += col_part[yy * m + j];
        col_part[j] = sum;
      }
      __syncthreads();
    }
    if (split == 1) {
      for (int64_t j = tid; j < m; j += kCta) store_result(grad_b + s * m + j, col_part[j], accumulate);
      __syncthreads();
    } else {
      cluster_sums(col_part, grad_b + s * m, m, split, rank, tid, kCta, accumulate);
    }
  }
}

// Dynamic shared memory of the column sums: ty rows of m, at most one sum
// for each element of a CTA's packs (32 KiB for 512 threads, 16-bit).
template <typename T, int V>
constexpr int64_t rows_sweep_smem_bytes(int threads) {
  return int64_t{threads} * kSweepPacksPerLane * V * static_cast<int64_t>(sizeof(acc_t<T>));
}

// Which rows sweep runs: `threads` a CTA, tx lanes a row and `split` CTAs an
// item. threads == 0: the sweep does not take the case.
struct RowsSweepPlan {
  int threads = 0, tx = 0, split = 1;
};

// Rows of 33 to 1024 packs (up to two a lane of 512 lanes; narrower rows
// keep the fused column sweep: 16-bit (4096, 256, 256) 0.166-0.169 ms against
// 0.175). Many items take 256-thread CTAs, two an SM, one an item (16-bit
// (512, 1024, 1024): 0.261 ms against 0.275 with 512 threads); fewer items
// than SMs take 512-thread CTAs, one an SM, in the largest clusters whose
// CTAs all fit at once, one a slot ((64, 4096, 4096): clusters of 2, 0.50 ms,
// where 256-thread CTAs in clusters of 3 took 0.57). Items too few to cover
// half the SMs even so are left to the column sweep, which splits their
// columns. clusters_fit(threads, split) says how many clusters of `split`
// fit at once (0 where clusters cannot run).
template <typename ClustersFit>
RowsSweepPlan rows_sweep_plan(int64_t batch, int64_t n, int64_t packs, int sms, ClustersFit&& clusters_fit) {
  RowsSweepPlan plan;
  if (batch <= 0 || n <= 0 || packs <= 32 || packs > kSweepPacksPerLane * 512) return plan;
  const int threads = (batch < sms || packs > kSweepPacksPerLane * 256) ? 512 : 256;
  int tx = 32;
  while (tx < threads && kSweepPacksPerLane * int64_t{tx} < packs) tx *= 2;
  const int64_t slots = int64_t{sms} * (512 / threads);
  int split = 1;
  for (int c = 8; c >= 2 && split == 1; --c) {
    if (batch * c <= slots && clusters_fit(threads, c) >= batch) split = c;
  }
  if (batch * split < sms / 2) return plan;
  plan.threads = threads;
  plan.tx = tx;
  plan.split = split;
  return plan;
}

}  // namespace make_inplace::kernels::outer_detail
