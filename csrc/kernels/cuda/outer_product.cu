// Batched outer product on CUDA. Memory-bound on the output (forward) or on
// grad_out (backward).
//
// Forward: a block is tx lanes (the contiguous column axis, 16-byte packs) by
// ty row groups; a group writes kRowsPerGroup consecutive rows, reading each
// a[s, i] once and b[s, :] once per batch item it meets, and each output byte
// is written once. int64 offsets; the grid has one CTA per ty groups (at most
// 2^31 - 1 CTAs: 2^34 rows).
//
// Backward: grad_b is a column reduction. A block owns one batch item and a
// strip of columns; its ty row-groups accumulate column sums in registers and
// combine them in shared memory at the end (no atomics, deterministic). When
// the strip spans the whole row (m <= 32 lanes x 4 packs), the same sweep also
// forms the row sums for grad_a with a shuffle-reduce across the lanes, so
// grad_out is read once. Wider rows take grad_a from a separate row-reduction
// kernel (a group of lanes per row), which reads grad_out a second time.
#include "make_inplace/kernels/cuda_pack.cuh"
#include "make_inplace/kernels/outer_product.h"

namespace make_inplace::kernels {
namespace {

using namespace cuda_detail;

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

template <typename T>
__device__ __forceinline__ void store_result(T* dst, acc_t<T> value, bool accumulate) {
  *dst = from_acc<T>(accumulate ? to_acc(*dst) + value : value);
}

// Each row group writes kRowsPerGroup consecutive rows (flat (s, i) order),
// holding b[s]'s pack in registers while s stays the same and advancing
// pointers instead of recomputing (s, i) and the addresses per row. Many
// short-lived CTAs and streaming stores: on an H100 this ran at 97-99% of a
// plain fill's bandwidth where the grid-strided version ran at 77-91%
// (lab/probe_outer_product_forward.cu, docs/notes/outer_product.md).
constexpr int64_t kRowsPerGroup = 8;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    outer_forward_kernel(const T* __restrict__ a, int64_t as0, int64_t as1,
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

// grad_b (and, when grad_a is non-null, grad_a). blockDim = (tx, ty), tx a
// power of two <= 32; each lane holds P packs of a strip: columns
// (strip * P + p) * tx + threadIdx.x. A block iteration takes
//  * one (batch item, strip) when whole_items is false; grad_a may then only
//    be passed when one strip covers all m columns, or
//  * one whole batch item, strip after strip, when whole_items is true; row
//    sums then build up across strips in dynamic shared memory (n entries).
// Either way each row's sum is owned by one thread (x == 0 of row-group
// i % ty) and each column's by one strip pass: deterministic, no atomics.
template <typename T, int V, int P>
__global__ void __launch_bounds__(kThreads)
    outer_cols_kernel(const T* __restrict__ g, int64_t gs0, int64_t gs1, int64_t gs2,
                      const T* __restrict__ a, int64_t as0, int64_t as1,
                      const T* __restrict__ b, int64_t bs0, int64_t bs1, bool b_packed,
                      T* __restrict__ grad_a, T* __restrict__ grad_b, int64_t batch,
                      int64_t n, int64_t m, int64_t strips, bool whole_items,
                      bool accumulate) {
  using A = acc_t<T>;
  __shared__ A partial[kThreads * P * V];
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  A* row_acc = reinterpret_cast<A*>(dynamic_smem);
  const int tx = blockDim.x, ty = blockDim.y;
  const int x = threadIdx.x, y = threadIdx.y;
  const int tid = y * tx + x;
  const int64_t packs = m / V;
  const bool with_a = grad_a != nullptr;
  const bool rows_in_smem = with_a && whole_items;
  const int64_t units = whole_items ? batch : batch * strips;
  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int64_t s = whole_items ? unit : unit / strips;
    const int64_t strip_begin = whole_items ? 0 : unit - s * strips;
    const int64_t strip_end = whole_items ? strips : strip_begin + 1;
    const T* a_row = a + s * as0;
    const T* b_row = b + s * bs0;
    if (rows_in_smem && x == 0) {
      for (int64_t i = y; i < n; i += ty) row_acc[i] = 0;
    }
    for (int64_t strip = strip_begin; strip < strip_end; ++strip) {
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
      // i0 advances identically for every thread, so the shuffles below are
      // reached by whole warps.
      for (int64_t i0 = 0; i0 < n; i0 += ty) {
        const int64_t i = i0 + y;
        const bool valid = i < n;
        A row_sum = 0;
        if (valid) {
          const A ai = to_acc(a_row[i * as1]);
          const T* g_row = g + s * gs0 + i * gs1;
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const int64_t c = first_pack + p * tx;
            if (c < packs) {
              const Pack<T, V> gv = load_pack<T, V>(g_row + c * V * gs2, gs2, true);
#pragma unroll
              for (int e = 0; e < V; ++e) {
                const A ge = to_acc(gv.v[e]);
                col[p][e] += ge * ai;
                if (with_a) row_sum += ge * to_acc(bv[p].v[e]);
              }
            }
          }
        }
        if (with_a) {
          // The tx lanes of a row are consecutive threads of one warp.
          row_sum = group_sum(row_sum, tx);
          if (valid && x == 0) {
            if (rows_in_smem) {
              row_acc[i] += row_sum;
            } else {
              store_result(grad_a + s * n + i, row_sum, accumulate);
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
    if (rows_in_smem && x == 0) {
      // Each row's owner thread wrote every partial of it: no barrier needed.
      for (int64_t i = y; i < n; i += ty) store_result(grad_a + s * n + i, row_acc[i], accumulate);
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

// Row sums kept in dynamic shared memory by the whole-item sweep: within the
// default 48 KiB per block next to the static `partial` array (8 KiB at P = 1).
constexpr int64_t kMaxRowSumBytes = 32 * 1024;

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
      const int64_t groups = (rows + kRowsPerGroup - 1) / kRowsPerGroup;
      const int64_t grid = (groups + block.y - 1) / block.y;
      outer_forward_kernel<T, W><<<static_cast<unsigned>(grid), block, 0, stream>>>(
          static_cast<const T*>(a.data), a.stride[0], a.stride[1],
          static_cast<const T*>(b.data), b.stride[0], b.stride[1], W > 1 && b_packable(b, W),
          static_cast<T*>(out), n, m, rows);
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
      const bool fused = packs <= int64_t{kMaxPacksPerLane} * block.x;
      if (fused && gb != nullptr) {
        // One strip per batch item: both gradients from one read of grad_out.
        // Blocks run even when n or m is 0, to write the (zero) sums. P packs
        // per lane, no more than the row needs: each one costs V registers
        // and kThreads * V words of shared memory, i.e. resident CTAs and
        // loads in flight.
        const auto launch_fused = [&](auto p_tag) {
          constexpr int P = decltype(p_tag)::value;
          outer_cols_kernel<T, W, P><<<grid_for(batch, 1), block, 0, stream>>>(
              g, gs[0], gs[1], gs[2], ap, a.stride[0], a.stride[1], bp, b.stride[0],
              b.stride[1], b_packed, ga, gb, batch, n, m, 1, false, accumulate);
          return cudaGetLastError();
        };
        static_assert(kMaxPacksPerLane == 4, "the fused launch picks P in {1, 2, 4}");
        if (packs <= block.x) return launch_fused(std::integral_constant<int, 1>{});
        if (packs <= 2 * int64_t{block.x}) return launch_fused(std::integral_constant<int, 2>{});
        return launch_fused(std::integral_constant<int, 4>{});
      }
      const int64_t strips = (packs + block.x - 1) / block.x;
      const int64_t row_bytes = n * static_cast<int64_t>(sizeof(acc_t<T>));
      if (ga != nullptr && gb != nullptr && m > 0 && batch >= 2 * sm_count() &&
          row_bytes <= kMaxRowSumBytes) {
        // Enough batch items to fill the GPU with one block each: a block
        // sweeps its item strip by strip and still reads grad_out once.
        outer_cols_kernel<T, W, 1><<<grid_for(batch, 1), block, row_bytes, stream>>>(
            g, gs[0], gs[1], gs[2], ap, a.stride[0], a.stride[1], bp, b.stride[0],
            b.stride[1], b_packed, ga, gb, batch, n, m, strips, true, accumulate);
        return cudaGetLastError();
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
        outer_cols_kernel<T, W, 1><<<grid_for(batch * strips, 1), block, 0, stream>>>(
            g, gs[0], gs[1], gs[2], ap, a.stride[0], a.stride[1], bp, b.stride[0],
            b.stride[1], b_packed, nullptr, gb, batch, n, m, strips, false, accumulate);
      }
      return cudaGetLastError();
    };
    return vec ? launch(std::integral_constant<int, V>{})
               : launch(std::integral_constant<int, 1>{});
  });
}

}  // namespace make_inplace::kernels
