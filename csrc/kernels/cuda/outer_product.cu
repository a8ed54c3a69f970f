// Batched outer product on CUDA. Memory-bound on the output (forward) or on
// grad_out (backward).
//
// Forward: a block is tx lanes (the contiguous column axis, 16-byte packs) by
// ty row groups. In 16-bit types a group writes kRowsPerGroup consecutive
// rows, reading each a[s, i] once and b[s, :] once per batch item it meets;
// in wider types a lane writes one pack of kRowsPerThread consecutive rows.
// Each output byte is written once; int64 offsets; at most 2^31 - 1 CTAs.
//
// Backward: grad_a sums each row against b, grad_b each column against a.
// Rows of 33 to 1024 contiguous 16-byte packs (16-bit, float32) are read
// whole by each CTA, an item's rows shared by a cluster when items are few
// (outer_rows_sweep.cuh). Otherwise a block owns one batch item and a strip
// of columns; its ty row-groups accumulate column sums in registers and
// combine them in shared memory at the end (no atomics, deterministic). When
// the strip spans the whole row (m <= 32 lanes x 4 packs), the same sweep also
// forms the row sums for grad_a with a shuffle-reduce across the lanes, so
// grad_out is read once. Wider rows are swept by one block per item, strip
// after strip, with the row sums in shared memory; on sm_90, when the items
// are too few to fill the GPU, by a cluster of blocks per item whose row sums
// meet in distributed shared memory. Otherwise grad_a comes from a separate
// row-reduction kernel (a group of lanes per row), which reads grad_out a
// second time. The column sweeps copy 16-byte packs a step ahead into shared
// memory (cp.async), so the loads overlap the sums.
#include "make_inplace/kernels/compute_capability.h"
#include "make_inplace/kernels/cuda_pack.cuh"
#include "make_inplace/kernels/outer_product.h"
#include "make_inplace/kernels/outer_rows_sweep.cuh"
#include "make_inplace/kernels/sm90_sync.cuh"

#include <limits>
#include <mutex>
#include <vector>

namespace make_inplace::kernels {
namespace {

using namespace cuda_detail;
using namespace outer_detail;

constexpr int kThreads = 256;

// (batch item, row) of a flat row index, advanced by a fixed step without a
// 64-bit division per row (grad_a's rows kernel reads few packs per row at
// small m, so per-row integer work would show in its throughput).
struct RowCursor {
  int64_t s, i, step_s, step_i, n;
  __device__ RowCursor(int64_t row, int64_t step, int64_t n_)
      : s(row / n_), i(row % n_), step_s(step / n_), step_i(step % n_), n(n_) {}
  __device__ void advance() {
    s += step_s;
    i += step_i;
    if (i >= n) {
      i -= n;
      ++s;
    }
  }
};

// 16-bit types: each row group writes kRowsPerGroup consecutive rows (flat
// (s, i) order), holding b[s]'s pack in registers, converted once, while s
// stays the same and advancing pointers instead of recomputing (s, i) and the
// addresses per row. Many short-lived CTAs and streaming stores: on an H100
// this ran at 97-99% of a plain fill's bandwidth where the grid-strided
// version ran at 77-91% (lab/probe_outer_product_forward.cu,
// docs/notes/outer_product.md).
constexpr int64_t kRowsPerGroup = 8;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    outer_forward_groups_kernel(const T* __restrict__ a, int64_t as0, int64_t as1,
                                const T* __restrict__ b, int64_t bs0, int64_t bs1, bool b_packed,
                                T* __restrict__ out, int64_t n, int64_t m, int64_t rows) {
  using A = acc_t<T>;
  const int64_t packs = m / V;
  int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y) * kRowsPerGroup;
  const int64_t end = row + kRowsPerGroup < rows ? row + kRowsPerGroup : rows;
  if (row >= end) return;
  int64_t s = row / n, i = row - s * n;
  while (row < end) {
    const int64_t count = end - row < n - i ? end - row : n - i;  // rows of item s
    const T* b_row = b + s * bs0;
    for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) {
      const Pack<T, V> bv = load_pack<T, V>(b_row + c * V * bs1, bs1, b_packed);
      A bf[V];
#pragma unroll
      for (int e = 0; e < V; ++e) bf[e] = to_acc(bv.v[e]);
      const T* ap = a + s * as0 + i * as1;
      T* op = out + row * m + c * V;
      int64_t r = 0;
      for (; r + 4 <= count; r += 4, ap += 4 * as1, op += 4 * m) {
        A ai[4];  // four loads in flight before the stores
#pragma unroll
        for (int k = 0; k < 4; ++k) ai[k] = to_acc(ap[k * as1]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          Pack<T, V> o;
#pragma unroll
          for (int e = 0; e < V; ++e) o.v[e] = from_acc<T>(ai[k] * bf[e]);
          store_pack<T, V, true>(op + k * m, o);
        }
      }
      for (; r < count; ++r, ap += as1, op += m) {
        const A ai = to_acc(*ap);
        Pack<T, V> o;
#pragma unroll
        for (int e = 0; e < V; ++e) o.v[e] = from_acc<T>(ai * bf[e]);
        store_pack<T, V, true>(op, o);
      }
    }
    row += count;
    ++s;
    i = 0;
  }
}

// 4- and 8-byte types: one thread writes one 16-byte pack column of
// kRowsPerThread consecutive rows, every load (a[s, i] and b[s]'s pack for
// each row) issued before its first store; the grid covers (row blocks x
// column chunks), so no thread loops. On an H200 float32 ran 1-6% faster this
// way than in row groups; 16-bit types, which convert b per row here and
// spend more instructions per byte, ran 12-17% slower
// (docs/notes/outer_product.md).
constexpr int kRowsPerThread = 2;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    outer_forward_flat_kernel(const T* __restrict__ a, int64_t as0, int64_t as1,
                              const T* __restrict__ b, int64_t bs0, int64_t bs1, bool b_packed,
                              T* __restrict__ out, int64_t n, int64_t m, int64_t rows, unsigned chunks) {
  using A = acc_t<T>;
  const unsigned chunk = blockIdx.x % chunks;
  const int64_t c = static_cast<int64_t>(chunk) * blockDim.x + threadIdx.x;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x / chunks) * blockDim.y + threadIdx.y) * kRowsPerThread;
  if (c * V >= m || row0 >= rows) return;
  int64_t s = row0 / n, i = row0 - s * n;
  A ai[kRowsPerThread];
  Pack<T, V> bv[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    if (row0 + r < rows) {
      ai[r] = to_acc(a[s * as0 + i * as1]);
      // A row of the same batch item as the row before reuses its pack of b.
      bv[r] = r > 0 && i > 0 ? bv[r - 1] : load_pack<T, V>(b + s * bs0 + c * V * bs1, bs1, b_packed);
    }
    if (++i == n) {  // the next row starts batch item s + 1
      i = 0;
      ++s;
    }
  }
  T* op = out + row0 * m + c * V;
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    if (row0 + r < rows) {
      Pack<T, V> o;
#pragma unroll
      for (int e = 0; e < V; ++e) o.v[e] = from_acc<T>(ai[r] * to_acc(bv[r].v[e]));
      store_pack<T, V, true>(op + r * m, o);
    }
  }
}

// grad_a[row] = sum_j grad_out[row, j] * b[s, j]: `group` lanes per row.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    outer_rows_kernel(const T* __restrict__ g, int64_t gs0, int64_t gs1, int64_t gs2,
                      const T* __restrict__ b, int64_t bs0, int64_t bs1, bool b_packed,
                      T* __restrict__ grad_a, int64_t n, int64_t m, int64_t rows, int group,
                      bool accumulate) {
  using A = acc_t<T>;
  const int64_t packs = m / V;
  const int lane = threadIdx.x & (group - 1);
  const int64_t groups_per_grid = static_cast<int64_t>(gridDim.x) * (kThreads / group);
  const int64_t mine = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / group;
  // Warp-uniform trip count (keyed on the warp's first group) for the shuffles.
  const int64_t offset_in_warp = (threadIdx.x & 31) / group;
  RowCursor at(mine, groups_per_grid, n);
  for (int64_t base = mine - offset_in_warp; base < rows; base += groups_per_grid, at.advance()) {
    const int64_t row = base + offset_in_warp;
    const bool valid = row < rows;
    A sum = 0;
    if (valid) {
      const int64_t s = at.s, i = at.i;
      const T* g_row = g + s * gs0 + i * gs1;
      const T* b_row = b + s * bs0;
      for (int64_t c = lane; c < packs; c += group) {
        const Pack<T, V> gv = load_pack<T, V>(g_row + c * V * gs2, gs2, true);
        const Pack<T, V> bv = load_pack<T, V>(b_row + c * V * bs1, bs1, b_packed);
#pragma unroll
        for (int e = 0; e < V; ++e) sum += to_acc(gv.v[e]) * to_acc(bv.v[e]);
      }
    }
    sum = group_sum(sum, group);
    if (valid && lane == 0) store_result(grad_a + row, sum, accumulate);
  }
}

// Rows a row-group sweeps before their sums are reduced across its lanes.
constexpr int kRowBlock = 8;

// v[k] summed over the 32 lanes of the warp, lane k (< kRowBlock) getting
// row k's sum: a transposing reduction, each exchange halving the values a
// lane holds (4 + 2 + 1 shuffles, then 2 for lanes 8-31), where a warp
// reduction per row took 5 shuffles a row and kept the memory system idle.
template <typename A>
__device__ __forceinline__ A warp_transpose_sum(const A (&v)[kRowBlock], int lane) {
  static_assert(kRowBlock == 8, "three halving exchanges");
  A w[4], z[2];
  const bool h4 = lane & 4, h2 = lane & 2, h1 = lane & 1;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // Keep the half of the values this lane's bit selects, send the other.
    const A keep = h4 ? v[j + 4] : v[j], send = h4 ? v[j] : v[j + 4];
    w[j] = keep + __shfl_xor_sync(0xffffffffu, send, 4);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const A keep = h2 ? w[j + 2] : w[j], send = h2 ? w[j] : w[j + 2];
    z[j] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
  }
  const A keep = h1 ? z[1] : z[0], send = h1 ? z[0] : z[1];
  A r = keep + __shfl_xor_sync(0xffffffffu, send, 1);  // value lane & 7, over lanes differing in bits 0-2
  r += __shfl_xor_sync(0xffffffffu, r, 8);
  r += __shfl_xor_sync(0xffffffffu, r, 16);
  return r;
}

// grad_b (and, when grad_a is non-null, grad_a). blockDim = (tx, ty), tx a
// power of two <= 32; each lane holds P packs of a strip: columns
// (strip * P + p) * tx + threadIdx.x. A block iteration takes
//  * one (batch item, strip) when whole_items is false; grad_a may then only
//    be passed when one strip covers all m columns, or
//  * one whole batch item, strip after strip, when whole_items is true; row
//    sums then build up across strips in dynamic shared memory (n entries).
// Either way each row's sum is owned by one thread (of row-group i % ty:
// lane 0, or the lane warp_transpose_sum leaves the row on) and each
// column's by one strip pass: deterministic, no atomics.
// With whole_items and a cluster of `split` CTAs (sm_90), the cluster shares
// an item: CTA r sweeps strips r, r + split, ... and the row sums of the
// CTAs meet through distributed shared memory, so few batch items still
// fill the GPU with one read of grad_out.
// One pack a lane (P = 1) reads kSweepRows rows a step and keeps kSweepCtas
// CTAs an SM, the best pairs with the staging ring below on an H200
// (lab/probe_outer_product_backward.cu; 16-bit (64, 4096, 4096): 4 rows and 3
// CTAs 0.78 ms, 8 and 2 0.85; float32 (512, 1024, 1024): 8 and 2 0.52, 4 and
// 3 0.67). 16-bit rows of at most kNarrowMaxPacks packs (kNarrow: the fused
// sweep, half a warp a row or less) read 2 rows a step with 4 CTAs an SM,
// 3-13% faster at 32-128 columns; at 32 packs the two pairs tie and on wider
// rows 2 and 4 lost up to 24% (H200, docs/notes/outer_product.md).
constexpr int kNarrowMaxPacks = 16;
template <typename T, bool kNarrow = false>
constexpr int kSweepRows = sizeof(T) == 2 ? (kNarrow ? 2 : 4) : 8;
template <typename T, bool kNarrow = false>
constexpr int kSweepCtas = sizeof(T) == 2 ? (kNarrow ? 4 : 3) : 2;

// Rows a row-group reads per step: U * P packs in flight per thread.
template <typename T, int P, bool kNarrow = false>
constexpr int kStepRows = P >= 4 ? 1 : P == 1 ? kSweepRows<T, kNarrow> : 4 / P;

// 16-byte packs are staged: each thread copies the packs of the step
// kStages - 1 ahead into its own slots of a ring (cp.async) before it sums the
// current step, so the loads overlap the arithmetic and the row reductions.
// Held in registers, a step's loads went out only after the previous step
// was used (16-bit (64, 4096, 4096) read at half the copy bandwidth on an
// H200). Four packs a lane (U = 1) keep registers: the ring's extra
// registers cost them a resident CTA.
constexpr int kStages = 2;
template <typename T, int V, int P>
constexpr bool kStaged = V * sizeof(T) == 16 && P <= 2;
template <typename T, int V, int P, bool kNarrow = false>
constexpr int64_t kStageRingBytes =
    kStaged<T, V, P> ? int64_t{kStages} * kStepRows<T, P, kNarrow> * P * kThreads * 16 : 0;

// Before sm_80 (no cp.async) the copy is a plain load and store.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

template <typename T, int V, int P, bool kNarrow = false>
__global__ void __launch_bounds__(kThreads, P == 1 ? kSweepCtas<T, kNarrow> : 1)
    outer_cols_kernel(const T* __restrict__ g, int64_t gs0, int64_t gs1, int64_t gs2,
                      const T* __restrict__ a, int64_t as0, int64_t as1,
                      const T* __restrict__ b, int64_t bs0, int64_t bs1, bool b_packed,
                      T* __restrict__ grad_a, T* __restrict__ grad_b, int64_t batch,
                      int64_t n, int64_t m, int64_t strips, bool whole_items,
                      int split, bool accumulate) {
  using A = acc_t<T>;
  __shared__ A partial[kThreads * P * V];
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  // The staging ring, then the row sums.
  auto* ring = reinterpret_cast<Pack<T, V>*>(dynamic_smem);
  A* row_acc = reinterpret_cast<A*>(dynamic_smem + kStageRingBytes<T, V, P, kNarrow>);
  const int tx = blockDim.x, ty = blockDim.y;
  const int x = threadIdx.x, y = threadIdx.y;
  const int tid = y * tx + x;
  const int64_t packs = m / V;
  const bool with_a = grad_a != nullptr;
  const bool rows_in_smem = with_a && whole_items;
  const int64_t units = whole_items ? batch : batch * strips;
  // A cluster's CTAs take the same units; rank r the strips r + k * split.
  const int rank = split > 1 ? static_cast<int>(blockIdx.x % split) : 0;
  for (int64_t unit = blockIdx.x / split; unit < units; unit += gridDim.x / split) {
    const int64_t s = whole_items ? unit : unit / strips;
    const int64_t strip_begin = whole_items ? rank : unit - s * strips;
    const int64_t strip_end = whole_items ? strips : strip_begin + 1;
    const T* a_row = a + s * as0;
    const T* b_row = b + s * bs0;
    if (rows_in_smem && x == 0) {
      for (int64_t i = y; i < n; i += ty) row_acc[i] = 0;
    }
    // Rows are zeroed by lane 0 and added to by their owner lanes.
    if (rows_in_smem) __syncthreads();
    for (int64_t strip = strip_begin; strip < strip_end; strip += split) {
      const int64_t first_pack = strip * P * tx + x;
      Pack<T, V> bv[P];
      if (with_a) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const int64_t c = first_pack + p * tx;
          if (c < packs) bv[p] = load_pack<T, V>(b_row + c * V * bs1, bs1, b_packed);
        }
      }
      A col[P][V] = {};
      // U rows per row-group and step, their loads issued before any use (one
      // pack of one row left the memory system idle, 43-53% of the copy
      // bandwidth on an H200).
      constexpr int U = kStepRows<T, P, kNarrow>;
      // i0 advances identically for every thread, so the shuffles below are
      // reached by whole warps. One pack a lane (the wide rows) takes blocks
      // of kRowBlock rows for warp_transpose_sum; more packs a lane sum each
      // of their U rows across the lanes.
      constexpr int RB = P == 1 ? kRowBlock : U;
      // The step at r0 takes rows r0 + u * ty + y; consecutive steps are
      // U * ty rows apart.
      const auto load_a = [&](int64_t r0, A(&ai)[U]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t i = r0 + u * ty + y;
          if (i < n) ai[u] = to_acc(a_row[i * as1]);
        }
      };
      Pack<T, V>* const slots = ring + tid;  // [slot][u][p], kThreads apart
      // Copies the packs of the step at r0 into ring slot `slot` (staged packs
      // are contiguous: gs2 == 1).
      const auto stage_in = [&](int64_t r0, int slot) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t i = r0 + u * ty + y;
          if (i < n) {
            const T* g_row = g + s * gs0 + i * gs1;
#pragma unroll
            for (int p = 0; p < P; ++p) {
              const int64_t c = first_pack + p * tx;
              if (c < packs) cp_async16(slots + ((slot * U + u) * P + p) * kThreads, g_row + c * V);
            }
          }
        }
        cp_async_commit();
      };
      int slot = 0;  // the current step's
      A a_next[U];   // a one step ahead: it is read from L2, shared by the item's CTAs
      if constexpr (kStaged<T, V, P>) {
#pragma unroll
        for (int k = 0; k < kStages - 1; ++k) stage_in(int64_t{k} * U * ty, k);
        load_a(0, a_next);
      }
      for (int64_t i0 = 0; i0 < n; i0 += RB * ty) {
        A row_sum[RB];
#pragma unroll
        for (int t = 0; t < RB; t += U) {
          Pack<T, V> gv[U][P];
          A ai[U];
          const int64_t r0 = i0 + t * ty;
          if constexpr (kStaged<T, V, P>) {
#pragma unroll
            for (int u = 0; u < U; ++u) ai[u] = a_next[u];
            load_a(r0 + U * ty, a_next);
            stage_in(r0 + int64_t{kStages - 1} * U * ty, slot == 0 ? kStages - 1 : slot - 1);
            cp_async_wait<kStages - 1>();
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
              for (int p = 0; p < P; ++p) gv[u][p] = slots[((slot * U + u) * P + p) * kThreads];
            }
            slot = slot + 1 == kStages ? 0 : slot + 1;
          } else {
#pragma unroll
            for (int u = 0; u < U; ++u) {
              const int64_t i = r0 + u * ty + y;
              if (i < n) {
                ai[u] = to_acc(a_row[i * as1]);
                const T* g_row = g + s * gs0 + i * gs1;
#pragma unroll
                for (int p = 0; p < P; ++p) {
                  const int64_t c = first_pack + p * tx;
                  if (c < packs) gv[u][p] = load_pack<T, V>(g_row + c * V * gs2, gs2, true);
                }
              }
            }
          }
#pragma unroll
          for (int u = 0; u < U; ++u) {
            row_sum[t + u] = 0;
            if (i0 + (t + u) * ty + y < n) {
#pragma unroll
              for (int p = 0; p < P; ++p) {
                const int64_t c = first_pack + p * tx;
                if (c < packs) {
                  A ge[V], be[V];
                  unpack(gv[u][p], ge);
                  if (with_a) unpack(bv[p], be);
#pragma unroll
                  for (int e = 0; e < V; ++e) {
                    col[p][e] += ge[e] * ai[u];
                    if (with_a) row_sum[t + u] += ge[e] * be[e];
                  }
                }
              }
            }
          }
        }
        if (with_a) {
          const auto add_row = [&](int64_t i, A v) {
            if (rows_in_smem) {
              row_acc[i] += v;
            } else {
              store_result(grad_a + s * n + i, v, accumulate);
            }
          };
          bool transposed = false;
          if constexpr (RB == kRowBlock) {
            if (tx == 32) {
              // Lane k < kRowBlock gets row i0 + k * ty + y.
              const A sum = warp_transpose_sum(row_sum, x);
              const int64_t i = i0 + x * ty + y;
              if (x < kRowBlock && i < n) add_row(i, sum);
              transposed = true;
            }
          }
          if (!transposed) {
#pragma unroll
            for (int k = 0; k < RB; ++k) {
              const int64_t i = i0 + k * ty + y;
              // The tx lanes of a row are consecutive threads of one warp.
              const A sum = group_sum(row_sum[k], tx);
              if (x == 0 && i < n) add_row(i, sum);
            }
          }
        }
      }
      // Tree-sum the ty row-groups' column sums in shared memory, laid out
      // [P * V][thread] so that a warp touches consecutive words.
      __syncthreads();  // the previous strip's readers are done with `partial`
#pragma unroll
      for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int e = 0; e < V; ++e) partial[(p * V + e) * kThreads + tid] = col[p][e];
      }
      __syncthreads();
      for (int half = ty / 2; half > 0; half /= 2) {
        if (y < half) {
#pragma unroll
          for (int k = 0; k < P * V; ++k) {
            partial[k * kThreads + tid] += partial[k * kThreads + tid + half * tx];
          }
        }
        __syncthreads();
      }
      if (y == 0) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const int64_t c = first_pack + p * tx;
          if (c < packs) {
            T* dst = grad_b + s * m + c * V;
            Pack<T, V> r;
#pragma unroll
            for (int e = 0; e < V; ++e) {
              const A sum = partial[(p * V + e) * kThreads + x];
              r.v[e] = from_acc<T>(accumulate ? to_acc(dst[e]) + sum : sum);
            }
            store_pack<T, V>(dst, r);
          }
        }
      }
    }
    if (rows_in_smem && split == 1 && x == 0) {
      // The barriers of the strips' column sums followed the last additions.
      for (int64_t i = y; i < n; i += ty) store_result(grad_a + s * n + i, row_acc[i], accumulate);
    }
    if (rows_in_smem && split > 1) {
      if constexpr (sizeof(A) == 4) cluster_sums(row_acc, grad_a + s * n, n, split, rank, tid, kThreads, accumulate);
    }
  }
}

bool multiple_of(int64_t x, int v) { return x % v == 0; }

// Whether b's rows can be read as 16-byte packs.
bool b_packable(const OuterInput& b, int v) {
  return (b.stride[1] == 1) && multiple_of(b.stride[0], v) && aligned16(b.data);
}

// Lanes per row (a power of two <= 32) and rows per block for `packs` packs.
dim3 block_for(int64_t packs) {
  const int tx = pow2_at_least(packs, 32);
  return dim3(tx, kThreads / tx);
}

// The widest strip (in packs per lane) that still lets one block own whole rows.
constexpr int kMaxPacksPerLane = 4;
// Where the whole-item sweep can run, the fused launch takes rows of at most
// this many packs a lane: the sweep (one pack a lane, staged, more CTAs) read
// faster beyond them on an H200 (lab/probe_outer_product_backward.cu: 16-bit
// (1024, 512, 512) 0.233 -> 0.166 ms, (512, 1024, 1024) 0.369 -> 0.355;
// float32 (1024, 512, 512) 0.304 -> 0.273), but not float32 at two packs
// ((4096, 256, 256) 0.282 against 0.293). float64 was not measured.
template <typename T>
constexpr int kFusedPacksPerLane = sizeof(T) == 2 ? 1 : sizeof(T) == 4 ? 2 : kMaxPacksPerLane;

// Whether clusters of `split` CTAs, one an item, suit the whole-item sweep
// of `batch` items too few to fill the GPU alone: they nearly fill it (a CTA
// on 7 SMs in 8) and every CTA gets a strip. The caller also checks that all
// the clusters fit at once (a second wave for a few of them doubled the time).
bool split_suits(int64_t batch, int64_t strips, int sms, int split) {
  return split <= strips && batch * split >= sms - sms / 8;
}

// The share of `waves` whole waves of `at_once` CTAs that `ctas` CTAs fill.
double wave_fill(int64_t ctas, int64_t at_once) {
  if (at_once <= 0) return 0;
  return static_cast<double>(ctas) / static_cast<double>((ctas + at_once - 1) / at_once * at_once);
}

// A launch configuration of `ctas` CTAs in clusters of `split` along x.
// Not copyable: the configuration points at its own cluster attribute.
struct ClusterLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster = {};
  ClusterLaunch(int64_t ctas, dim3 block, int64_t smem_bytes, int split, cudaStream_t stream) {
    config.gridDim = dim3(static_cast<unsigned>(ctas));
    config.blockDim = block;
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    config.stream = stream;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = static_cast<unsigned>(split);
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Clusters of `split` CTAs of the whole-item sweep that fit the current
// device at once, looked up once per (device, kernel, split, block, shared
// memory): the row sums' shared memory grows with n.
template <typename Kernel>
int active_clusters(Kernel kernel, dim3 block, int64_t smem_bytes, int split) {
  struct Known {
    const void* kernel;
    int device, split, clusters;
    unsigned block_x;
    int64_t smem_bytes;
  };
  static std::mutex mutex;
  static std::vector<Known> known;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const void* key = reinterpret_cast<const void*>(kernel);
  const std::lock_guard<std::mutex> lock(mutex);
  for (const Known& k : known) {
    if (k.kernel == key && k.device == device && k.split == split && k.block_x == block.x &&
        k.smem_bytes == smem_bytes) {
      return k.clusters;
    }
  }
  const ClusterLaunch launch(split, block, smem_bytes, split, nullptr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) != cudaSuccess) {
    cudaGetLastError();  // leave no sticky error behind: the caller falls back
    clusters = 0;
  }
  known.push_back({key, device, split, clusters, block.x, smem_bytes});
  return clusters;
}

// Row sums kept in dynamic shared memory by the whole-item sweep.
constexpr int64_t kMaxRowSumBytes = 32 * 1024;

// outer_cols_kernel<T, V, P, kNarrow> with its dynamic shared memory limit
// raised, once per device, to its staging ring and the most row sums: the
// default limit is 48 KiB less the static `partial` array. nullptr if the
// driver refused.
template <typename T, int V, int P, bool kNarrow = false>
auto cols_kernel() -> decltype(&outer_cols_kernel<T, V, P, kNarrow>) {
  const auto kernel = &outer_cols_kernel<T, V, P, kNarrow>;
  static std::mutex mutex;
  static std::vector<int> raised;  // devices
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
  const std::lock_guard<std::mutex> lock(mutex);
  for (int d : raised) {
    if (d == device) return kernel;
  }
  const int64_t bytes = kStageRingBytes<T, V, P, kNarrow> + kMaxRowSumBytes;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) !=
      cudaSuccess) {
    return nullptr;
  }
  raised.push_back(device);
  return kernel;
}

template <typename T, int V, int kCta>
cudaError_t launch_rows_sweep(const RowsSweepPlan& plan, const RowsSweepArgs<T>& x, cudaStream_t stream) {
  const auto kernel = &outer_rows_sweep_kernel<T, V, kCta>;
  const dim3 block(plan.tx, kCta / plan.tx);
  const int64_t smem = rows_sweep_smem_bytes<T, V>(kCta);
  // Items beyond a few waves are taken in turn by the CTAs already running.
  const int64_t grid = std::min<int64_t>(x.batch, int64_t{sm_count()} * 8) * plan.split;
  if (plan.split == 1) {
    kernel<<<static_cast<unsigned>(grid), block, smem, stream>>>(x, 1);
    return cudaGetLastError();
  }
  const ClusterLaunch launch(grid, block, smem, plan.split, stream);
  return cudaLaunchKernelEx(&launch.config, kernel, x, plan.split);
}

}  // namespace

cudaError_t outer_product_forward_cuda(ScalarKind kind, OuterInput a, OuterInput b,
                                       void* out, int64_t batch, int64_t n, int64_t m,
                                       cudaStream_t stream) {
  const int64_t rows = batch * n;
  if (rows == 0 || m == 0) return cudaSuccess;
  return dispatch_kind(kind, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const bool vec = V > 1 && multiple_of(m, V) && aligned16(out);
    const auto launch = [&](auto vtag) {
      constexpr int W = decltype(vtag)::value;
      // Wide rows: 256 lanes along the row; narrow rows: several rows per block.
      const int64_t packs = m / W;
      const int tx = pow2_at_least(packs, kThreads);
      const dim3 block(tx, kThreads / tx);
      const T* ap = static_cast<const T*>(a.data);
      const T* bp = static_cast<const T*>(b.data);
      const bool b_packed = W > 1 && b_packable(b, W);
      if constexpr (sizeof(T) == 2) {
        const int64_t groups = (rows + kRowsPerGroup - 1) / kRowsPerGroup;
        const int64_t grid = (groups + block.y - 1) / block.y;
        outer_forward_groups_kernel<T, W><<<static_cast<unsigned>(grid), block, 0, stream>>>(
            ap, a.stride[0], a.stride[1], bp, b.stride[0], b.stride[1], b_packed,
            static_cast<T*>(out), n, m, rows);
      } else {
        const int64_t chunks = (packs + tx - 1) / tx;
        const int64_t rows_per_block = int64_t{block.y} * kRowsPerThread;
        // One CTA per 512 to 2048 output elements: an output that fits in
        // memory stays under the 2^31 - 1 CTAs of a launch.
        const int64_t grid = (rows + rows_per_block - 1) / rows_per_block * chunks;
        if (grid > std::numeric_limits<int>::max()) return cudaErrorInvalidConfiguration;
        outer_forward_flat_kernel<T, W><<<static_cast<unsigned>(grid), block, 0, stream>>>(
            ap, a.stride[0], a.stride[1], bp, b.stride[0], b.stride[1], b_packed,
            static_cast<T*>(out), n, m, rows, static_cast<unsigned>(chunks));
      }
      return cudaGetLastError();
    };
    return vec ? launch(std::integral_constant<int, V>{})
               : launch(std::integral_constant<int, 1>{});
  });
}

cudaError_t outer_product_backward_cuda(ScalarKind kind, OuterInput grad_out,
                                        OuterInput a, OuterInput b, void* grad_a,
                                        void* grad_b, int64_t batch, int64_t n,
                                        int64_t m, bool accumulate,
                                        cudaStream_t stream) {
  if (batch == 0 || (grad_a == nullptr && grad_b == nullptr)) return cudaSuccess;
  return dispatch_kind(kind, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const int64_t* gs = grad_out.stride;
    const bool vec = V > 1 && multiple_of(m, V) && (gs[2] == 1) && multiple_of(gs[1], V) &&
                     multiple_of(gs[0], V) && aligned16(grad_out.data) &&
                     (grad_b == nullptr || aligned16(grad_b));
    const auto launch = [&](auto vtag) -> cudaError_t {
      constexpr int W = decltype(vtag)::value;
      const int64_t packs = m / W;
      const bool b_packed = W > 1 && b_packable(b, W);
      const T* g = static_cast<const T*>(grad_out.data);
      const T* ap = static_cast<const T*>(a.data);
      const T* bp = static_cast<const T*>(b.data);
      T* ga = static_cast<T*>(grad_a);
      T* gb = static_cast<T*>(grad_b);
      const dim3 block = block_for(packs);
      const int64_t strips = (packs + block.x - 1) / block.x;
      const int64_t row_bytes = n * static_cast<int64_t>(sizeof(acc_t<T>));
      const int sms = sm_count();
      // Both gradients of rows the rows sweep takes: whole rows a CTA, one
      // read (rows_sweep_plan says which). The column sweeps below take the rest.
      if constexpr (W > 1 && sizeof(acc_t<T>) == 4) {
        if (ga != nullptr && gb != nullptr) {
          const RowsSweepPlan plan = rows_sweep_plan(batch, n, packs, sms, [&](int threads, int split) {
            if (compute_major() < 9) return 0;
            return threads == 256 ? active_clusters(&outer_rows_sweep_kernel<T, W, 256>, dim3(256),
                                                    rows_sweep_smem_bytes<T, W>(256), split)
                                  : active_clusters(&outer_rows_sweep_kernel<T, W, 512>, dim3(512),
                                                    rows_sweep_smem_bytes<T, W>(512), split);
          });
          if (plan.threads != 0) {
            const RowsSweepArgs<T> args{g, gs[0], gs[1], ap, a.stride[0], a.stride[1], bp, b.stride[0], b.stride[1],
                                        b_packed, ga, gb, batch, n, m, accumulate};
            return plan.threads == 256 ? launch_rows_sweep<T, W, 256>(plan, args, stream)
                                       : launch_rows_sweep<T, W, 512>(plan, args, stream);
          }
        }
      }
      const auto kernel = cols_kernel<T, W, 1>();
      if (kernel == nullptr) return cudaGetLastError();
      const int64_t smem_bytes = kStageRingBytes<T, W, 1> + row_bytes;
      const bool sweep = ga != nullptr && gb != nullptr && m > 0 && row_bytes <= kMaxRowSumBytes;
      const bool clusters = compute_major() >= 9 && sizeof(T) < 8;  // float64 row sums stay out
      int split = 1;  // CTAs an item; 0: no whole-item sweep
      if (sweep && batch < 2 * int64_t{sms}) {
        // Too few items for a CTA each: the largest cluster that suits (8,
        // the portable size, down to 2). Clusters and their shared memory
        // need sm_90.
        split = 0;
        for (int c = 8; clusters && c >= 2 && split == 0; c /= 2) {
          if (split_suits(batch, strips, sms, c) && batch <= active_clusters(kernel, block, smem_bytes, c)) split = c;
        }
      } else if (sweep && clusters && strips >= 4 &&
                 wave_fill(batch, active_clusters(kernel, block, smem_bytes, 1)) <
                     wave_fill(2 * batch, 2 * int64_t{active_clusters(kernel, block, smem_bytes, 2)})) {
        // Pairs of CTAs an item where they fill the last wave better and
        // each CTA still sweeps two strips or more (16-bit (512, 1024, 1024)
        // on an H200: 0.355 -> 0.299 ms; float32, whose waves fill alike, and
        // 16-bit (1024, 512, 512), one strip a CTA, were no faster).
        split = 2;
      }
      const bool fused = packs <= (sweep && split > 0 ? kFusedPacksPerLane<T> : kMaxPacksPerLane) * int64_t{block.x};
      if (fused && gb != nullptr) {
        // One strip per batch item: both gradients from one read of grad_out.
        // Blocks run even when n or m is 0, to write the (zero) sums. P packs
        // per lane, no more than the row needs: each one costs V registers
        // and kThreads * V words of shared memory, i.e. resident CTAs and
        // loads in flight.
        const auto launch_fused = [&](auto p_tag, auto narrow_tag) {
          constexpr int P = decltype(p_tag)::value;
          constexpr bool kNarrow = decltype(narrow_tag)::value;
          const auto fused_kernel = cols_kernel<T, W, P, kNarrow>();
          if (fused_kernel == nullptr) return cudaGetLastError();
          fused_kernel<<<grid_for(batch, 1), block, kStageRingBytes<T, W, P, kNarrow>, stream>>>(
              g, gs[0], gs[1], gs[2], ap, a.stride[0], a.stride[1], bp, b.stride[0],
              b.stride[1], b_packed, ga, gb, batch, n, m, 1, false, 1, accumulate);
          return cudaGetLastError();
        };
        using One = std::integral_constant<int, 1>;
        static_assert(kMaxPacksPerLane == 4, "the fused launch picks P in {1, 2, 4}");
        if constexpr (sizeof(T) == 2 && W > 1) {
          if (packs <= kNarrowMaxPacks) return launch_fused(One{}, std::true_type{});
        }
        if (packs <= block.x) return launch_fused(One{}, std::false_type{});
        if (packs <= 2 * int64_t{block.x}) return launch_fused(std::integral_constant<int, 2>{}, std::false_type{});
        return launch_fused(std::integral_constant<int, 4>{}, std::false_type{});
      }
      if (sweep && split > 0) {
        // Enough batch items (or items shared by a cluster) to fill the GPU:
        // a block sweeps its item strip by strip and still reads grad_out once.
        if (split == 1) {
          kernel<<<grid_for(batch, 1), block, smem_bytes, stream>>>(
              g, gs[0], gs[1], gs[2], ap, a.stride[0], a.stride[1], bp, b.stride[0],
              b.stride[1], b_packed, ga, gb, batch, n, m, strips, true, 1, accumulate);
          return cudaGetLastError();
        }
        // One cluster an item (of few items, only as many as fit at once).
        const ClusterLaunch launch(batch * split, block, smem_bytes, split, stream);
        return cudaLaunchKernelEx(&launch.config, kernel, g, gs[0], gs[1], gs[2], ap, a.stride[0],
                                  a.stride[1], bp, b.stride[0], b.stride[1], b_packed, ga, gb,
                                  batch, n, m, strips, true, split, accumulate);
      }
      // Otherwise parallelism needs strips of one item on several blocks, and
      // grad_a (a sum across strips) comes from the row kernel: grad_out is
      // read twice.
      if (ga != nullptr && n > 0) {
        const int group = pow2_at_least(packs, 32);
        const int64_t rows = batch * n;
        outer_rows_kernel<T, W><<<grid_for(rows * group, kThreads), kThreads, 0, stream>>>(
            g, gs[0], gs[1], gs[2], bp, b.stride[0], b.stride[1], b_packed, ga, n, m, rows,
            group, accumulate);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
      }
      if (gb != nullptr && m > 0) {
        kernel<<<grid_for(batch * strips, 1), block, kStageRingBytes<T, W, 1>, stream>>>(
            g, gs[0], gs[1], gs[2], ap, a.stride[0], a.stride[1], bp, b.stride[0],
            b.stride[1], b_packed, nullptr, gb, batch, n, m, strips, false, 1, accumulate);
      }
      return cudaGetLastError();
    };
    return vec ? launch(std::integral_constant<int, V>{})
               : launch(std::integral_constant<int, 1>{});
  });
}

}  // namespace make_inplace::kernels
