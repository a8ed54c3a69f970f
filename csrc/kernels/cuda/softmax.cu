// softmax_ and softmax_backward on CUDA, torch-free.
//
// Forward, softmax over the last dim (rows):
//  * rows that fit on chip: `tpr` threads own a row (a sub-warp or warp for
//    short rows, several rows per CTA; a CTA of up to 512 threads for long
//    ones), each holding NV vectors of the row in registers, so every element
//    is read once and written once (max, sum and write passes run from
//    registers). 16-byte vectors when the row start is 16-byte aligned. The
//    common case (no mask or causal cut, a positive scale, 16-bit or float32,
//    up to 32 elements per thread) takes softmax_rows_plain_kernel, which
//    works on packed pairs and computes each exponential once; its rows of
//    16-32 vectors are walked row after row by each thread group instead
//    (softmax_short_rows_kernel, short_rows.cuh).
//  * unmasked rows of 32 KiB and more on sm_90 (16-byte aligned) that the
//    registers cannot hold: a persistent CTA per row at a time, the rows
//    staged through a ring of shared-memory slots by bulk copies
//    (staged_rows.cuh), so the next rows load while this one is reduced and
//    written: one read, one write. Rows too long for one ring (160 KiB; up to
//    1.25 MiB) are split over a cluster of 2, 4 or 8 CTAs in the common case.
//  * longer rows: a CTA per row in two passes over global memory, an online
//    max/sum pass and a write pass (the second read mostly hits L2), still in
//    place and with no workspace.
// Forward over a middle dim (inner > 1): a thread per (outer, inner) column,
// threads along inner so accesses coalesce, the same online two-pass scheme
// through the stride: no transpose, no copy.
// Backward: the same layouts, two passes (dot product, then write).
#include <cmath>

#include "make_inplace/kernels/packed_rows.cuh"
#include "make_inplace/kernels/rowwise_cuda.cuh"
#include "make_inplace/kernels/short_rows.cuh"
#include "make_inplace/kernels/softmax.h"
#include "make_inplace/kernels/staged_rows.cuh"

namespace make_inplace::kernels {
namespace {

using namespace rowwise;

constexpr int kLongThreads = 512;
constexpr int kColumnThreads = 256;

// Value of element c of a row after scale, mask and causal cut: -inf where
// masked out. `valid` = number of columns the causal cut keeps. MASKED is a
// template flag so the common unmasked kernels carry no mask registers.
template <typename T, bool MASKED, typename Index>
struct RowValue {
  const T* mask;
  int64_t mask_row;
  int64_t mask_step;
  Index valid;
  acc_t<T> scale;

  __device__ __forceinline__ acc_t<T> operator()(T raw, Index c) const {
    if (c >= valid) return neg_inf<T>();
    acc_t<T> v = mul_rn(to_acc_fresh(raw), scale);
    if constexpr (MASKED) v += load_acc_fresh(mask + mask_row + c * mask_step);
    return v;
  }
};

template <typename T, bool MASKED, typename Index>
__device__ __forceinline__ RowValue<T, MASKED, Index> row_value(int64_t row, bool active,
                                                                int64_t n, acc_t<T> scale,
                                                                int64_t causal_rows,
                                                                const MaskLayout& mask) {
  RowValue<T, MASKED, Index> rv;
  rv.mask = static_cast<const T*>(mask.data);
  rv.mask_row = MASKED && active ? mask_offset(mask.outer_rank, mask.outer_sizes,
                                               mask.outer_strides, row)
                                 : 0;
  rv.mask_step = mask.dim_stride;
  rv.valid = static_cast<Index>(!active ? 0 : causal_rows > 0 ? min(n, row % causal_rows + 1) : n);
  rv.scale = scale;
  return rv;
}

// Rows held on chip: n <= kOnChipMaxThreads * NV * VEC, so column indices fit in int.
template <typename T, int VEC, int NV, bool MASKED>
__global__ void __launch_bounds__(kOnChipMaxThreads)
    softmax_rows_kernel(T* __restrict__ x, int64_t row0, int64_t rows, int n, int tpr,
                        acc_t<T> scale, int64_t causal_rows, MaskLayout mask) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  __shared__ A scratch[32];
  const auto [lane, row, active, end] = on_chip_row(row0, rows, n, tpr);
  T* p = x + (active ? row : 0) * n;
  const auto value = row_value<T, MASKED, int>(row, active, n, scale, causal_rows, mask);

  V buf[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    // Columns at or past `valid` are masked out: not read, only written.
    if (col < value.valid) buf[k] = *reinterpret_cast<const V*>(p + col);
  }
  A m = neg_inf<T>();
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
#pragma unroll
    for (int e = 0; e < VEC; ++e) m = nan_max(m, value(buf[k].v[e], col + e));
  }
  m = group_reduce(m, tpr, neg_inf<T>(), scratch, MaxOp{});
  A s = 0;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < value.valid) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += fast_exp(value(buf[k].v[e], col + e) - m);
    }
  }
  s = group_reduce(s, tpr, A(0), scratch, SumOp{});
  const A inv = A(1) / s;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (active && col < n) {
      V out;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        out.v[e] = from_acc<T>(fast_exp(value(buf[k].v[e], col + e) - m) * inv);
      }
      store_vec(p + col, out);
    }
  }
}

// The common case on the fewest instructions (packed_rows.cuh): no mask, no
// causal cut, a positive scale, 16-byte vectors of a 16-bit type or float, at
// most 32 elements per thread. The row max is taken over the raw values (a
// positive scale keeps the order), each exponential is computed once and kept
// in registers for the write.
template <typename T, int NV>
__global__ void __launch_bounds__(kOnChipMaxThreads)
    softmax_rows_plain_kernel(T* __restrict__ x, int64_t row0, int64_t rows, int n, int tpr,
                              float log2e_scale) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int F = kFloatsPerVector<T>;
  static_assert(NV * F <= 32, "exponentials of at most 32 elements stay in registers");
  using V = Vec<T, VEC>;
  __shared__ float scratch[32];
  const auto [lane, row, active, end] = on_chip_row(row0, rows, n, tpr);
  T* p = x + (active ? row : 0) * n;

  V buf[NV];
  VectorMax<T> vmax;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
      buf[k] = *reinterpret_cast<const V*>(p + col);
      vmax.add(buf[k]);
    }
  }
  const float m = group_reduce(vmax.result(), tpr, -std::numeric_limits<float>::infinity(),
                               scratch, MaxOp{});
  float ex[NV][F];
  float s = 0;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
      unpack_vector<T>(buf[k], ex[k]);
#pragma unroll
      for (int e = 0; e < F; ++e) {
        ex[k][e] = exp2_approx((ex[k][e] - m) * log2e_scale);
        s += ex[k][e];
      }
    }
  }
  s = group_reduce(s, tpr, 0.0f, scratch, SumOp{});
  const float inv = 1.0f / s;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
#pragma unroll
      for (int e = 0; e < F; ++e) ex[k][e] *= inv;
      store_vec(p + col, pack_vector<T, V>(ex[k]));
    }
  }
}

// softmax_rows_plain_kernel for rows of one vector a thread and at most a
// warp, walked row after row (short_rows.cuh): the next row loads while this
// one is reduced and written.
template <typename T, int TPR>
__global__ void __launch_bounds__(kSmallBlock)
    softmax_short_rows_kernel(T* __restrict__ x, int64_t rows, int n, float log2e_scale) {
  constexpr int NV = 1;
  constexpr int VEC = 16 / sizeof(T);
  constexpr int F = kFloatsPerVector<T>;
  using V = Vec<T, VEC>;
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  walk_short_rows<TPR, NV, false>(x, rows, n, [&](const uint4(&buf)[NV], int64_t row, bool active) {
    VectorMax<T> vmax;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if ((k * TPR + lane) * VEC < n) vmax.add(buf[k]);
    }
    const float m = group_reduce(vmax.result(), TPR, -std::numeric_limits<float>::infinity(),
                                 static_cast<float*>(nullptr), MaxOp{});
    float ex[NV][F];
    float s = 0;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if ((k * TPR + lane) * VEC < n) {
        unpack_vector<T>(buf[k], ex[k]);
#pragma unroll
        for (int e = 0; e < F; ++e) {
          ex[k][e] = exp2_approx((ex[k][e] - m) * log2e_scale);
          s += ex[k][e];
        }
      }
    }
    s = group_reduce(s, TPR, 0.0f, static_cast<float*>(nullptr), SumOp{});
    const float inv = 1.0f / s;
    T* p = x + row * n;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int col = (k * TPR + lane) * VEC;
      if (active && col < n) {
#pragma unroll
        for (int e = 0; e < F; ++e) ex[k][e] *= inv;
        store_vec(p + col, pack_vector<T, V>(ex[k]));
      }
    }
  });
}

// Folds value v into a running (max m, sum s of exp(. - m)) pair. NaN and
// +inf propagate to NaN, as in torch; -inf contributes nothing.
template <typename A>
__device__ __forceinline__ void online_add(A& m, A& s, A chunk_max, A chunk_sum_at_max) {
  const A mn = nan_max(m, chunk_max);
  if (mn == -std::numeric_limits<A>::infinity()) return;
  s = s * fast_exp(m - mn) + chunk_sum_at_max * fast_exp(chunk_max - mn);
  m = mn;
}

// Folds one vector of a row (columns col..col+VEC-1) into the running pair.
template <typename A, typename V, typename Value, typename Index>
__device__ __forceinline__ void fold_vector(const V& in, Index col, const Value& value, A& m,
                                            A& s) {
  constexpr int VEC = sizeof(in.v) / sizeof(in.v[0]);
  A v[VEC];
  A cm = -std::numeric_limits<A>::infinity();
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    v[e] = value(in.v[e], col + e);
    cm = nan_max(cm, v[e]);
  }
  if (cm == -std::numeric_limits<A>::infinity()) return;
  A cs = 0;
#pragma unroll
  for (int e = 0; e < VEC; ++e) cs += fast_exp(v[e] - cm);
  online_add(m, s, cm, cs);
}

// The row's max and 1 / sum from every thread's running pair (a CTA per row).
template <typename A>
__device__ __forceinline__ void row_max_and_inverse(A m, A s, A* scratch, A* row_max, A* inv) {
  *row_max = group_reduce(m, static_cast<int>(blockDim.x),
                          -std::numeric_limits<A>::infinity(), scratch, MaxOp{});
  // Threads that saw nothing (s == 0, m == -inf) add 0 rather than 0 * exp(NaN).
  const A mine = s == A(0) ? A(0) : s * fast_exp(m - *row_max);
  *inv = A(1) / group_reduce(mine, static_cast<int>(blockDim.x), A(0), scratch, SumOp{});
}

// The softmax of one vector from the row's max and 1 / sum.
template <typename T, typename V, typename Value, typename Index>
__device__ __forceinline__ V softmax_vector(const V& in, Index col, const Value& value,
                                            acc_t<T> row_max, acc_t<T> inv) {
  constexpr int VEC = sizeof(in.v) / sizeof(in.v[0]);
  V out;
#pragma unroll
  for (int e = 0; e < VEC; ++e) out.v[e] = from_acc<T>(fast_exp(value(in.v[e], col + e) - row_max) * inv);
  return out;
}

template <typename T, int VEC, bool MASKED>
__global__ void __launch_bounds__(kLongThreads)
    softmax_long_kernel(T* __restrict__ x, int64_t row0, int64_t n, acc_t<T> scale,
                        int64_t causal_rows, MaskLayout mask) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  __shared__ A scratch[32];
  const int64_t row = row0 + blockIdx.x;
  T* p = x + row * n;
  const auto value = row_value<T, MASKED, int64_t>(row, true, n, scale, causal_rows, mask);
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;

  A m = neg_inf<T>(), s = 0;
  // Unrolled so each thread has several independent loads in flight.
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < value.valid; col += step) {
    fold_vector(*reinterpret_cast<const V*>(p + col), col, value, m, s);
  }
  A row_max, inv;
  row_max_and_inverse(m, s, scratch, &row_max, &inv);
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < n; col += step) {
    V io;
    if (col < value.valid) io = *reinterpret_cast<const V*>(p + col);
    store_vec(p + col, softmax_vector<T>(io, col, value, row_max, inv));
  }
}

// Unmasked rows staged in shared memory (see staged_rows.cuh). Each row: a
// statistics pass over its pieces as they land, then a write pass that reads
// the slots again and stores straight to global memory. PLAIN (no causal cut, a positive
// scale, not float64; `scale` then holds log2(e) * scale): a packed max pass
// and an exponential-sum pass (packed_rows.cuh), about half the instructions
// of the general online max/sum pass.
template <typename T, int VEC, bool PLAIN>
__global__ void __launch_bounds__(staged::kThreads)
    softmax_staged_kernel(T* __restrict__ x, int64_t rows, int64_t n, acc_t<T> scale,
                          int64_t causal_rows, staged::Plan plan) {
#ifdef MAKE_INPLACE_STAGED_ROWS
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ A scratch[32];
  __shared__ staged::SplitMaxSum exchange;  // split rows only (PLAIN: A is float)
  int round = 0;
  const staged::Share share = staged::share_of(plan);
  const int64_t part_base = share.part_base, cluster = share.first_row, clusters = share.row_step;
  staged::RowRing<T> ring(smem, x, rows, n, plan, share);
  ring.start();
  const int step = static_cast<int>(blockDim.x) * VEC;
  const int threads = static_cast<int>(blockDim.x);
  for (int64_t li = 0; cluster + li * clusters < rows; ++li) {
    const int64_t row = cluster + li * clusters;
    const auto value = row_value<T, false, int64_t>(row, true, n, scale, causal_rows, MaskLayout{});
    A row_max, inv;
    if constexpr (PLAIN) {
      constexpr int F = kFloatsPerVector<T>;
      VectorMax<T> vmax;
      for (int j = 0; j < plan.pieces; ++j) {
        const T* piece = ring.wait(li, j);
        const int count = ring.piece_elems(j);
#pragma unroll 4
        for (int c = threadIdx.x * VEC; c < count; c += step) {
          vmax.add(*reinterpret_cast<const V*>(piece + c));
        }
      }
      // Split rows: this part's max; the parts' (max, sum) pairs meet once, below.
      row_max = group_reduce(vmax.result(), threads, neg_inf<T>(), scratch, MaxOp{});
      const A shift = plan.split > 1 && row_max == neg_inf<T>() ? A(0) : row_max;
      A s = 0;
      for (int j = 0; j < plan.pieces; ++j) {
        const T* piece = ring.landed(li, j);
        const int count = ring.piece_elems(j);
#pragma unroll 4
        for (int c = threadIdx.x * VEC; c < count; c += step) {
          float f[F];
          unpack_vector<T>(*reinterpret_cast<const V*>(piece + c), f);
#pragma unroll
          for (int e = 0; e < F; ++e) s += exp2_approx((f[e] - shift) * scale);
        }
      }
      s = group_reduce(s, threads, A(0), scratch, SumOp{});
      if (plan.split > 1) staged::split_max_sum(&row_max, &s, scale, plan.split, &exchange, &round);
      inv = A(1) / s;
    } else {  // never split (plan_rows without allow_split)
      A m = neg_inf<T>(), s = 0;
      for (int j = 0; j < plan.pieces; ++j) {
        const T* piece = ring.wait(li, j);
        const int64_t base = static_cast<int64_t>(j) * plan.slot_elems;
        const int count = ring.piece_elems(j);
        for (int c = threadIdx.x * VEC; c < count && base + c < value.valid; c += step) {
          fold_vector(*reinterpret_cast<const V*>(piece + c), base + c, value, m, s);
        }
      }
      row_max_and_inverse(m, s, scratch, &row_max, &inv);
    }
    T* out = x + row * n + part_base;
    for (int j = 0; j < plan.pieces; ++j) {
      const T* piece = ring.landed(li, j);
      const int64_t base = static_cast<int64_t>(j) * plan.slot_elems;
      const int count = ring.piece_elems(j);
#pragma unroll 4
      for (int c = threadIdx.x * VEC; c < count; c += step) {
        const V in = *reinterpret_cast<const V*>(piece + c);
        if constexpr (PLAIN) {
          constexpr int F = kFloatsPerVector<T>;
          float f[F];
          unpack_vector<T>(in, f);
#pragma unroll
          for (int e = 0; e < F; ++e) f[e] = exp2_approx((f[e] - row_max) * scale) * inv;
          store_vec(out + base + c, pack_vector<T, V>(f));
        } else {
          store_vec(out + base + c, softmax_vector<T>(in, base + c, value, row_max, inv));
        }
      }
    }
    ring.release(li);
  }
  if (plan.split > 1) staged::cluster_sync();  // no exit while a peer may still store here
#endif
}

template <typename T>
__global__ void __launch_bounds__(kColumnThreads)
    softmax_columns_kernel(T* __restrict__ x, int64_t col0, int64_t columns, int64_t n,
                           int64_t inner, acc_t<T> scale, MaskLayout mask) {
  using A = acc_t<T>;
  const int64_t c = col0 + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= columns) return;
  const int64_t o = c / inner, i = c % inner;
  T* p = x + o * n * inner + i;
  const T* mk = static_cast<const T*>(mask.data);
  const int64_t moff =
      mk == nullptr ? 0
                    : mask_offset(mask.outer_rank, mask.outer_sizes, mask.outer_strides, o) +
                          mask_offset(mask.inner_rank, mask.inner_sizes, mask.inner_strides, i);
  auto value = [&](int64_t d) {
    A v = mul_rn(to_acc(p[d * inner]), scale);
    if (mk != nullptr) v += to_acc(mk[moff + d * mask.dim_stride]);
    return v;
  };
  A m = neg_inf<T>(), s = 0;
  for (int64_t d = 0; d < n; ++d) {
    const A v = value(d);
    online_add(m, s, v, A(1));
  }
  const A inv = A(1) / s;
  for (int64_t d = 0; d < n; ++d) p[d * inner] = from_acc<T>(fast_exp(value(d) - m) * inv);
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kOnChipMaxThreads)
    softmax_backward_rows_kernel(const T* dy, const T* __restrict__ y,
                                 T* dx, int64_t row0, int64_t rows, int64_t n,
                                 int tpr, acc_t<T> scale) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  __shared__ A scratch[32];
  const int groups = blockDim.x / tpr;
  const int lane = threadIdx.x % tpr;
  const int64_t row = row0 + static_cast<int64_t>(blockIdx.x) * groups + threadIdx.x / tpr;
  const bool active = row < rows;
  const int64_t off = (active ? row : 0) * n;
  const int64_t end = active ? n : 0;
  const int64_t step = static_cast<int64_t>(tpr) * VEC;
  A dot = 0;
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(lane) * VEC; col < end; col += step) {
    const V g = *reinterpret_cast<const V*>(dy + off + col);
    const V o = *reinterpret_cast<const V*>(y + off + col);
#pragma unroll
    for (int e = 0; e < VEC; ++e) dot += to_acc(g.v[e]) * to_acc(o.v[e]);
  }
  dot = group_reduce(dot, tpr, A(0), scratch, SumOp{});
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(lane) * VEC; col < end; col += step) {
    const V g = *reinterpret_cast<const V*>(dy + off + col);
    const V o = *reinterpret_cast<const V*>(y + off + col);
    V out;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      out.v[e] = from_acc<T>(scale * to_acc(o.v[e]) * (to_acc(g.v[e]) - dot));
    }
    store_vec(dx + off + col, out);
  }
}

template <typename T>
__global__ void __launch_bounds__(kColumnThreads)
    softmax_backward_columns_kernel(const T* dy, const T* __restrict__ y,
                                    T* dx, int64_t col0, int64_t columns,
                                    int64_t n, int64_t inner, acc_t<T> scale) {
  using A = acc_t<T>;
  const int64_t c = col0 + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= columns) return;
  const int64_t base = (c / inner) * n * inner + c % inner;
  A dot = 0;
  for (int64_t d = 0; d < n; ++d) dot += to_acc(dy[base + d * inner]) * to_acc(y[base + d * inner]);
  for (int64_t d = 0; d < n; ++d) {
    const int64_t k = base + d * inner;
    dx[k] = from_acc<T>(scale * to_acc(y[k]) * (to_acc(dy[k]) - dot));
  }
}

template <typename T, int VEC, int NV, bool MASKED>
cudaError_t launch_rows(T* x, int64_t rows, int64_t n, int tpr, acc_t<T> scale,
                        int64_t causal_rows, const MaskLayout& mask, cudaStream_t stream) {
  const int block = tpr > 32 ? tpr : kSmallBlock;  // above a warp: one row per CTA
  return launch_chunks(rows, block / tpr, [&](int64_t row0, unsigned grid) {
    softmax_rows_kernel<T, VEC, NV, MASKED><<<grid, block, 0, stream>>>(
        x, row0, rows, static_cast<int>(n), tpr, scale, causal_rows, mask);
  });
}

// Masked rows keep at most 4 vectors per thread on chip: the per-element mask
// addresses need registers of their own.
template <typename T, bool MASKED>
constexpr int max_nv() {
  return MASKED ? 4 : max_vectors_per_thread<T>();
}

template <typename T, int VEC, bool MASKED>
cudaError_t forward_rows(T* x, int64_t rows, int64_t n, acc_t<T> scale, int64_t causal_rows,
                         const MaskLayout& mask, cudaStream_t stream) {
  int tpr = 0, nv = 0;
  if (on_chip_plan((n + VEC - 1) / VEC, max_nv<T, MASKED>(), 1, max_nv<T, MASKED>(), &tpr,
                   &nv)) {
    switch (nv) {
      case 1:
        return launch_rows<T, VEC, 1, MASKED>(x, rows, n, tpr, scale, causal_rows, mask, stream);
      case 2:
        return launch_rows<T, VEC, 2, MASKED>(x, rows, n, tpr, scale, causal_rows, mask, stream);
      case 4:
        return launch_rows<T, VEC, 4, MASKED>(x, rows, n, tpr, scale, causal_rows, mask, stream);
      case 8:
        if constexpr (max_nv<T, MASKED>() >= 8) {
          return launch_rows<T, VEC, 8, MASKED>(x, rows, n, tpr, scale, causal_rows, mask, stream);
        }
        break;
      case 16:
        if constexpr (max_nv<T, MASKED>() >= 16) {
          return launch_rows<T, VEC, 16, MASKED>(x, rows, n, tpr, scale, causal_rows, mask,
                                                 stream);
        }
        break;
    }
    return cudaErrorInvalidValue;  // on_chip_plan never returns nv above max_nv
  }
  return launch_chunks(rows, 1, [&](int64_t row0, unsigned grid) {
    softmax_long_kernel<T, VEC, MASKED>
        <<<grid, kLongThreads, 0, stream>>>(x, row0, n, scale, causal_rows, mask);
  });
}

template <typename T, int VEC>
cudaError_t forward_rows(T* x, int64_t rows, int64_t n, acc_t<T> scale, int64_t causal_rows,
                         const MaskLayout& mask, cudaStream_t stream) {
  return mask.data != nullptr
             ? forward_rows<T, VEC, true>(x, rows, n, scale, causal_rows, mask, stream)
             : forward_rows<T, VEC, false>(x, rows, n, scale, causal_rows, mask, stream);
}

// The fast paths' case: no causal cut, a positive finite scale, not float64
// (the caller checks the mask).
template <typename T>
bool plain_softmax(int64_t causal_rows, acc_t<T> scale) {
  return sizeof(T) != 8 && causal_rows == 0 && scale > 0 && std::isfinite(scale);
}

// The fast paths take exp(scale * v) as 2^(log2(e) * scale * v).
inline float log2e_times(double scale) { return static_cast<float>(1.4426950408889634 * scale); }

template <typename T, int NV>
cudaError_t launch_plain(T* x, int64_t rows, int64_t n, int tpr, float log2e_scale,
                         cudaStream_t stream) {
  const int block = tpr > 32 ? tpr : kSmallBlock;  // above a warp: one row per CTA
  return launch_chunks(rows, block / tpr, [&](int64_t row0, unsigned grid) {
    softmax_rows_plain_kernel<T, NV><<<grid, block, 0, stream>>>(
        x, row0, rows, static_cast<int>(n), tpr, log2e_scale);
  });
}

template <typename T, int TPR>
cudaError_t launch_short(T* x, int64_t rows, int64_t n, float log2e_scale, cudaStream_t stream) {
  constexpr auto kernel = softmax_short_rows_kernel<T, TPR>;
  unsigned grid = 0;
  const cudaError_t err = short_rows_grid<TPR>(kernel, rows, sizeof(T) == 2, &grid);
  if (err != cudaSuccess) return err;
  kernel<<<grid, kSmallBlock, 0, stream>>>(x, rows, static_cast<int>(n), log2e_scale);
  return cudaGetLastError();
}

// softmax_rows_plain_kernel where it applies (the caller has checked 16-byte
// vectors); false where it does not, *err set where it does.
template <typename T>
bool forward_plain(T* x, int64_t rows, int64_t n, acc_t<T> scale, int64_t causal_rows,
                   const MaskLayout& mask, cudaStream_t stream, cudaError_t* err) {
  if constexpr (sizeof(T) == 8) {
    return false;
  } else {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int kMaxNv = 32 / kFloatsPerVector<T>;
    if (mask.data != nullptr || !plain_softmax<T>(causal_rows, scale)) return false;
    int tpr = 0, nv = 0;
    if (!on_chip_plan(n / VEC, kMaxNv, 1, 2, &tpr, &nv)) return false;
    // Rows of 16 to 32 vectors (a vector a thread) walk: H200, bf16 (262144,
    // 128) 38.9 -> 36.9 us; float32 71.6 -> 67.0 with a CTA per four rows
    // (70.0 with the grid capped). Narrower rows ran 1-3% slower that way.
    if (nv == 1 && (tpr == 16 || tpr == 32)) {
      const float l2s = log2e_times(scale);
      *err = tpr == 16 ? launch_short<T, 16>(x, rows, n, l2s, stream)
                       : launch_short<T, 32>(x, rows, n, l2s, stream);
      return true;
    }
    return with_vectors<kMaxNv>(nv, [&](auto nv_tag) {
      *err = launch_plain<T, decltype(nv_tag)::value>(x, rows, n, tpr, log2e_times(scale), stream);
    });
  }
}

template <typename T, int VEC, bool PLAIN>
cudaError_t launch_staged(T* x, int64_t rows, int64_t n, acc_t<T> scale, int64_t causal_rows,
                          const staged::Plan& plan, cudaStream_t stream) {
  return staged::launch_persistent(softmax_staged_kernel<T, VEC, PLAIN>, plan, rows, stream, x,
                                   rows, n, scale, causal_rows, plan);
}

template <typename T, int VEC>
cudaError_t forward_staged(T* x, int64_t rows, int64_t n, acc_t<T> scale, int64_t causal_rows,
                           const staged::Plan& plan, cudaStream_t stream) {
  if constexpr (sizeof(T) != 8) {
    if (plain_softmax<T>(causal_rows, scale)) {
      return launch_staged<T, VEC, true>(x, rows, n, log2e_times(scale), causal_rows, plan,
                                         stream);
    }
  }
  return launch_staged<T, VEC, false>(x, rows, n, scale, causal_rows, plan, stream);
}

template <typename T>
cudaError_t forward(T* x, int64_t outer, int64_t n, int64_t inner, acc_t<T> scale,
                    int64_t causal_rows, const MaskLayout& mask, cudaStream_t stream) {
  if (inner > 1) {
    const int64_t columns = outer * inner;
    return launch_chunks(columns, kColumnThreads, [&](int64_t col0, unsigned grid) {
      softmax_columns_kernel<T>
          <<<grid, kColumnThreads, 0, stream>>>(x, col0, columns, n, inner, scale, mask);
    });
  }
  constexpr int VEC = 16 / sizeof(T);
  if (n % VEC == 0 && aligned16(x)) {
    // The register kernel first: it beat the staged kernel on the rows both
    // can hold (docs/rowwise_tuning.md).
    cudaError_t err = cudaSuccess;
    if (forward_plain<T>(x, outer, n, scale, causal_rows, mask, stream, &err)) return err;
    staged::Plan plan;
    if (mask.data == nullptr &&
        staged::plan_rows(n, sizeof(T), plain_softmax<T>(causal_rows, scale), &plan)) {
      return forward_staged<T, VEC>(x, outer, n, scale, causal_rows, plan, stream);
    }
    return forward_rows<T, VEC>(x, outer, n, scale, causal_rows, mask, stream);
  }
  return forward_rows<T, 1>(x, outer, n, scale, causal_rows, mask, stream);
}

template <typename T, int VEC>
cudaError_t backward_rows(const T* dy, const T* y, T* dx, int64_t rows, int64_t n,
                          acc_t<T> scale, cudaStream_t stream) {
  // About four vectors per thread; up to 512 threads on one row.
  const int64_t nvec = (n + VEC - 1) / VEC;
  const int tpr = std::min(512, pow2_at_least((nvec + 3) / 4));
  const int block = tpr > 32 ? tpr : kSmallBlock;  // above a warp: one row per CTA
  return launch_chunks(rows, block / tpr, [&](int64_t row0, unsigned grid) {
    softmax_backward_rows_kernel<T, VEC>
        <<<grid, block, 0, stream>>>(dy, y, dx, row0, rows, n, tpr, scale);
  });
}

template <typename T>
cudaError_t backward(const T* dy, const T* y, T* dx, int64_t outer, int64_t n,
                     int64_t inner, acc_t<T> scale, cudaStream_t stream) {
  if (inner > 1) {
    const int64_t columns = outer * inner;
    return launch_chunks(columns, kColumnThreads, [&](int64_t col0, unsigned grid) {
      softmax_backward_columns_kernel<T>
          <<<grid, kColumnThreads, 0, stream>>>(dy, y, dx, col0, columns, n, inner, scale);
    });
  }
  constexpr int VEC = 16 / sizeof(T);
  if (n % VEC == 0 && aligned16(dy) && aligned16(y) && aligned16(dx)) {
    return backward_rows<T, VEC>(dy, y, dx, outer, n, scale, stream);
  }
  return backward_rows<T, 1>(dy, y, dx, outer, n, scale, stream);
}

}  // namespace

cudaError_t softmax_forward_cuda(ScalarKind kind, void* x, int64_t outer, int64_t n,
                                 int64_t inner, double scale, int64_t causal_rows,
                                 const MaskLayout& mask, cudaStream_t stream) {
  if (outer == 0 || n == 0 || inner == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    err = forward<T>(static_cast<T*>(x), outer, n, inner, static_cast<acc_t<T>>(scale),
                     causal_rows, mask, stream);
  });
  return err;
}

cudaError_t softmax_backward_cuda(ScalarKind kind, const void* grad_output, const void* y,
                                  void* grad_input, int64_t outer, int64_t n, int64_t inner,
                                  double scale, cudaStream_t stream) {
  if (outer == 0 || n == 0 || inner == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    err = backward<T>(static_cast<const T*>(grad_output), static_cast<const T*>(y),
                      static_cast<T*>(grad_input), outer, n, inner,
                      static_cast<acc_t<T>>(scale), stream);
  });
  return err;
}

}  // namespace make_inplace::kernels
