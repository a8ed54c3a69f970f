// layer_norm_ and its backward on CUDA, torch-free.
//
// Forward: rows that fit on chip are held in registers by `tpr` threads (a
// sub-warp or warp for short rows, up to a 512-thread CTA for long ones):
// one read and one write per element, mean and variance in two passes over
// the registers (no E[x^2] - E[x]^2 cancellation); 16-bit and float32 rows of
// up to 32 elements per thread take layer_norm_rows_plain_kernel (each element
// converted once, packed pairs, statistics about the row's first element with
// a corrected second pass where that loses accuracy; float32 rows of a whole
// 512-thread CTA prefetch the next wave's rows into L2), 16-bit rows of up to
// 64 vectors the same statistics walked row after row by each thread group
// (layer_norm_short_rows_kernel, short_rows.cuh). Longer rows: a CTA per row
// in two passes over global memory, Welford/Chan statistics in the first,
// the write in the second; in place, no workspace. Rows of 32 KiB and more
// that layer_norm_rows_plain_kernel cannot hold (16-byte aligned, sm_90:
// above 16384 columns for 16-bit types and float32, from 4096 for float64)
// are staged through a ring of shared-memory slots by bulk copies instead (staged_rows.cuh): one read and one write, next rows
// loading meanwhile. For 16-bit types and float32 the staged statistics take
// one pass (moments.cuh) and rows longer than a ring (float32 from about
// 51200 columns) are split over a cluster of 2, 4 or 8 CTAs; float64 keeps the corrected
// two-pass statistics and rows of up to one ring.
// Backward: grad_input row by row in two passes (row sums, then write);
// grad_weight / grad_bias as column sums over row chunks into a float
// workspace, then a final sum over the chunks.
#include "make_inplace/kernels/layer_norm.h"
#include "make_inplace/kernels/moments.cuh"
#include "make_inplace/kernels/packed_rows.cuh"
#include "make_inplace/kernels/rowwise_cuda.cuh"
#include "make_inplace/kernels/short_rows.cuh"
#include "make_inplace/kernels/staged_rows.cuh"

#include <type_traits>

namespace make_inplace::kernels {
namespace {

using namespace rowwise;

constexpr int kLongThreads = 512;
constexpr int kColTile = 32;    // columns per CTA in the grad_weight/bias sums
constexpr int kColRows = 8;     // row lanes per CTA there
constexpr int kTargetBlocks = 132 * 8;  // enough CTAs to fill an H100/H200
// E[d]^2 / var above which the register kernel's shifted statistics take a
// second pass: at 16 a float32 variance keeps ~17x its sums' rounding.
constexpr float kShiftLimit = 16.0f;

// Calls launch(has_w, has_b) with std::true_type / std::false_type for which
// of w and b are given: kernels that take them as template flags test
// neither per element.
template <typename T, typename Launch>
cudaError_t with_affine(const T* w, const T* b, Launch&& launch) {
  using Yes = std::true_type;
  using No = std::false_type;
  if (w != nullptr) return b != nullptr ? launch(Yes{}, Yes{}) : launch(Yes{}, No{});
  return b != nullptr ? launch(No{}, Yes{}) : launch(No{}, No{});
}

// Rows held on chip: n <= kOnChipMaxThreads * NV * VEC, so column indices fit in int.
template <typename T, int VEC, int NV>
__global__ void __launch_bounds__(kOnChipMaxThreads)
    layer_norm_rows_kernel(T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                           int64_t row0, int64_t rows, int n, int tpr, acc_t<T> eps,
                           acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  __shared__ A scratch[32];
  const auto [lane, row, active, end] = on_chip_row(row0, rows, n, tpr);
  T* p = x + (active ? row : 0) * n;

  V buf[NV];
  A sum = 0;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
      buf[k] = *reinterpret_cast<const V*>(p + col);
#pragma unroll
      for (int e = 0; e < VEC; ++e) sum += to_acc(buf[k].v[e]);
    }
  }
  const A rough_mean = group_reduce(sum, tpr, A(0), scratch, SumOp{}) / static_cast<A>(n);
  // Corrected two-pass statistics: the first mean carries the rounding of a
  // large sum (rows far from zero: ~1e-5 relative in float32), so the
  // deviations' own mean is folded back in before normalizing.
  A sq = 0, dev = 0;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A d = to_acc_fresh(buf[k].v[e]) - rough_mean;
        sq += d * d;
        dev += d;
      }
    }
  }
  const A dev_mean = group_reduce(dev, tpr, A(0), scratch, SumOp{}) / static_cast<A>(n);
  const A mean = rough_mean + dev_mean;
  const A var = group_reduce(sq, tpr, A(0), scratch, SumOp{}) / static_cast<A>(n) - dev_mean * dev_mean;
  const A rstd = rsqrt_acc(var + eps);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
      V wv, bv, out;
      if (w != nullptr) wv = *reinterpret_cast<const V*>(w + col);
      if (b != nullptr) bv = *reinterpret_cast<const V*>(b + col);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        // x - rough_mean is exact (close operands); rough_mean + dev_mean is not.
        A v = ((to_acc_fresh(buf[k].v[e]) - rough_mean) - dev_mean) * rstd;
        if (w != nullptr) v *= to_acc(wv.v[e]);
        if (b != nullptr) v += to_acc(bv.v[e]);
        out.v[e] = from_acc<T>(v);
      }
      store_vec(p + col, out);
    }
  }
  if (active && lane == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (rstd_out != nullptr) rstd_out[row] = rstd;
  }
}

// layer_norm_rows_kernel on the fewest instructions (packed_rows.cuh), for
// 16-byte vectors of a 16-bit type or float with at most 32 elements per
// thread: each element is converted to float once and kept in registers (at
// 32 16-bit elements, kept packed instead, see below). The statistics are
// taken in one pass over d = x - shift, shift being the row's first element,
// so a row needs one two-value reduction where the corrected two-pass
// statistics needed three, and the write is two FMAs: short rows were
// issue-bound on that work (docs/rowwise_tuning.md). E[d^2] - E[d]^2 loses
// relative accuracy as E[d]^2 / var grows (a first element far out in its
// row); above kShiftLimit the row's warp (or CTA) takes the corrected second
// pass about the shifted mean, which has no such loss.
template <typename T, int NV, bool HAS_W, bool HAS_B>
__global__ void __launch_bounds__(kOnChipMaxThreads)
    layer_norm_rows_plain_kernel(T* __restrict__ x, const T* __restrict__ w,
                                 const T* __restrict__ b, int64_t row0, int64_t rows, int n,
                                 int tpr, float inv_n, float eps, float* __restrict__ mean_out,
                                 float* __restrict__ rstd_out, int64_t prefetch_ahead) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int F = kFloatsPerVector<T>;
  static_assert(NV * F <= 32, "at most 32 floats of the row per thread");
  using V = Vec<T, VEC>;
  __shared__ float scratch[64];
  const auto [lane, row, active, end] = on_chip_row(row0, rows, n, tpr);
  T* p = x + (active ? row : 0) * n;
  // float32 rows of 32 floats a thread (prefetch_ahead > 0 where one CTA is
  // all its SM holds): the row a CTA of the next wave takes goes to L2 now,
  // so DRAM keeps reading while this CTA reduces and stores.
  if constexpr (sizeof(T) == 4 && NV == 8) {
    if (prefetch_ahead > 0 && threadIdx.x == 0 && row + prefetch_ahead < rows) {
      prefetch_l2(p + prefetch_ahead * n, static_cast<unsigned>(n * sizeof(T)));
    }
  }

  V buf[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    // Lines kept in L2 until the store (global16.cuh): H200, float32 rows of
    // up to 4 vectors a thread 1-4% faster; 16-bit rows and 8 vectors a
    // thread 1-6% slower (docs/rowwise_tuning.md).
    if (col < end) buf[k] = load_global_16<sizeof(T) == 4 && NV <= 4, V>(p + col);
  }
  // Every thread of the row reads the first element itself: one cached load
  // instead of a broadcast that would need shared memory for CTA-wide rows.
  const float shift = to_acc(p[0]);
  // 32 elements of a 16-bit row per thread stay packed in buf as loaded and
  // the write pass unpacks them again: 16 words instead of 32 floats keep the
  // registers from limiting occupancy (docs/rowwise_tuning.md).
  constexpr bool PACKED = sizeof(T) == 2 && NV * F == 32;
  float d[PACKED ? 1 : NV][F];
  const auto deviations = [&](int k, float* f) {
    if constexpr (PACKED) {
      unpack_vector<T>(buf[k], f);
#pragma unroll
      for (int e = 0; e < F; ++e) f[e] -= shift;
    } else {
#pragma unroll
      for (int e = 0; e < F; ++e) f[e] = d[k][e];
    }
  };
  float s1 = 0, s2 = 0;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
      float f[F];
      unpack_vector<T>(buf[k], f);
#pragma unroll
      for (int e = 0; e < F; ++e) {
        f[e] -= shift;
        if constexpr (!PACKED) d[k][e] = f[e];
        s1 += f[e];
        s2 += f[e] * f[e];
      }
    }
  }
  group_sum2(s1, s2, tpr, scratch);
  // Multiplies by 1/n: IEEE divisions per row cost several instructions per
  // element at 128 columns.
  const float m = s1 * inv_n;  // mean of d, rounded
  float var = s2 * inv_n - m * m;
  float dm = 0;  // what m's rounding left in the mean of d - m
  float mu = m;   // the mean of the deviations the write pass sees
  // Uniform over the warp (rows of a sub-warp share its shuffles) or, for a
  // row of a whole CTA, over the CTA (every thread holds the row's sums).
  const bool far = m * m > kShiftLimit * var;
  if (tpr > 32 ? far : __any_sync(0xffffffffu, far)) {
    float sq = 0, dev = 0;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int col = (k * tpr + lane) * VEC;
      if (col < end) {
        float f[F];
        deviations(k, f);
#pragma unroll
        for (int e = 0; e < F; ++e) {
          const float c = f[e] - m;
          if constexpr (!PACKED) d[k][e] = c;
          sq = fmaf(c, c, sq);
          dev += c;
        }
      }
    }
    group_sum2(dev, sq, tpr, scratch);
    dm = dev * inv_n;
    var = sq * inv_n - dm * dm;
    // Packed rows unpack x - shift again, whose mean is m + dm: at most
    // sqrt(n) standard deviations (d is 0 at the shift), so folding it into
    // the FMA below errs by at most sqrt(n) * 2^-24 in the normalized result.
    mu = PACKED ? m + dm : dm;
  }
  const float rstd = rsqrtf(fmaxf(var, 0.0f) + eps);
  const float offset = -mu * rstd;  // y = d * rstd + offset, then * w + b
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
      float f[F], wf[F], bf[F];
      deviations(k, f);
      if constexpr (HAS_W) unpack_vector<T>(*reinterpret_cast<const V*>(w + col), wf);
      if constexpr (HAS_B) unpack_vector<T>(*reinterpret_cast<const V*>(b + col), bf);
#pragma unroll
      for (int e = 0; e < F; ++e) {
        float y = fmaf(f[e], rstd, offset);
        if constexpr (HAS_W && HAS_B) {
          y = fmaf(y, wf[e], bf[e]);
        } else if constexpr (HAS_W) {
          y *= wf[e];
        } else if constexpr (HAS_B) {
          y += bf[e];
        }
        f[e] = y;
      }
      store_vec(p + col, pack_vector<T, V>(f));
    }
  }
  if (active && lane == 0) {
    if (mean_out != nullptr) mean_out[row] = shift + (m + dm);
    if (rstd_out != nullptr) rstd_out[row] = rstd;
  }
}

// Returns v, which the compiler then cannot tell is the same every row:
// without it the float16 kernel converted w and b once before the walk and
// held 32 floats (90 registers against 72). bfloat16's conversion is a shift
// or a mask, which the compiler already leaves in the loop.
template <typename T, typename V>
__device__ __forceinline__ V kept_packed(V v) {
  if constexpr (std::is_same_v<T, __half>) {
    Words q = as_words(v);
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(q.w[e]));
    return from_words<V>(q);
  } else {
    return v;
  }
}

// layer_norm_rows_plain_kernel's statistics for 16-bit rows of at most a
// warp and two vectors a thread, walked row after row (short_rows.cuh): w and
// b are loaded once, the row's first element comes from its first lane by a
// shuffle, and the write is two FMAs, y = (d * rstd - mean(d) * rstd) * w + b.
// Where the shifted statistics take their second pass, d becomes d - m there,
// so the mean folded into that FMA is small beside the row's spread.
template <typename T, int TPR, int NV>
__global__ void __launch_bounds__(kSmallBlock)
    layer_norm_short_rows_kernel(T* __restrict__ x, const T* __restrict__ w,
                                 const T* __restrict__ b, int64_t rows, int n, float inv_n,
                                 float eps, float* __restrict__ mean_out,
                                 float* __restrict__ rstd_out) {
  static_assert(sizeof(T) == 2, "16-bit rows");
  constexpr int VEC = 16 / sizeof(T);
  constexpr int F = kFloatsPerVector<T>;
  using V = Vec<T, VEC>;
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  // Kept as loaded: unpacked once for all rows, they took 88 registers
  // against 72 and ran 4% slower (H200, bf16 (262144, 128)). An absent w or
  // b is held as packed ones or zeros: the write then unpacks both instead of
  // selecting per element (bfloat16: 32 selects a row fewer).
  V wv[NV], bv[NV];
  {
    float ones[F], zeros[F];
#pragma unroll
    for (int e = 0; e < F; ++e) ones[e] = 1.0f, zeros[e] = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int col = (k * TPR + lane) * VEC;
      wv[k] = pack_vector<T, V>(ones);
      bv[k] = pack_vector<T, V>(zeros);
      if (col < n && w != nullptr) wv[k] = *reinterpret_cast<const V*>(w + col);
      if (col < n && b != nullptr) bv[k] = *reinterpret_cast<const V*>(b + col);
    }
  }
  walk_short_rows<TPR, NV, true>(x, rows, n, [&](const uint4(&buf)[NV], int64_t row, bool active) {
    const float shift = __shfl_sync(0xffffffffu, first_float<T>(buf[0]), 0, TPR);
    float d[NV][F];
    float s1 = 0, s2 = 0;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      if ((k * TPR + lane) * VEC < n) {
        unpack_vector<T>(buf[k], d[k]);
#pragma unroll
        for (int e = 0; e < F; ++e) {
          d[k][e] -= shift;
          s1 += d[k][e];
          s2 = fmaf(d[k][e], d[k][e], s2);
        }
      }
    }
    group_sum2(s1, s2, TPR, nullptr);
    const float m = s1 * inv_n;
    float var = s2 * inv_n - m * m;
    float mu = m, dm = 0;
    if (__any_sync(0xffffffffu, m * m > kShiftLimit * var)) {
      float sq = 0, dev = 0;
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        if ((k * TPR + lane) * VEC < n) {
#pragma unroll
          for (int e = 0; e < F; ++e) {
            d[k][e] -= m;
            sq = fmaf(d[k][e], d[k][e], sq);
            dev += d[k][e];
          }
        }
      }
      group_sum2(dev, sq, TPR, nullptr);
      dm = dev * inv_n;
      var = sq * inv_n - dm * dm;
      mu = dm;
    }
    const float rstd = rsqrtf(fmaxf(var, 0.0f) + eps);
    const float offset = -mu * rstd;
    T* p = x + row * n;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int col = (k * TPR + lane) * VEC;
      if (active && col < n) {
        float wf[F], bf[F], y[F];
        unpack_vector<T>(kept_packed<T>(wv[k]), wf);
        unpack_vector<T>(kept_packed<T>(bv[k]), bf);
#pragma unroll
        for (int e = 0; e < F; ++e) y[e] = fmaf(fmaf(d[k][e], rstd, offset), wf[e], bf[e]);
        store_vec(p + col, pack_vector<T, V>(y));
      }
    }
    if (active && lane == 0) {
      if (mean_out != nullptr) mean_out[row] = shift + (m + dm);
      if (rstd_out != nullptr) rstd_out[row] = rstd;
    }
  });
}

// Rows staged in shared memory (see staged_rows.cuh): the statistics of
// layer_norm_rows_kernel from the slots, then the write pass from them.
template <typename T, int VEC>
__global__ void __launch_bounds__(staged::kMaxThreads)
    layer_norm_staged_kernel(T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                             int64_t rows, int64_t n, acc_t<T> eps, acc_t<T>* __restrict__ mean_out,
                             acc_t<T>* __restrict__ rstd_out, staged::Plan plan) {
#ifdef MAKE_INPLACE_STAGED_ROWS
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ A scratch[32];
  // Never split (forward_vec plans without allow_split): a CTA per row.
  staged::RowRing<T> ring(smem, x, rows, n, plan, blockIdx.x, gridDim.x);
  ring.start();
  const int step = static_cast<int>(blockDim.x) * VEC;
  const int tpr = static_cast<int>(blockDim.x);
  const A count_n = static_cast<A>(n);
  for (int64_t li = 0; blockIdx.x + li * gridDim.x < rows; ++li) {
    const int64_t row = blockIdx.x + li * gridDim.x;
    A sum = 0;
    for (int j = 0; j < plan.pieces; ++j) {
      const T* piece = ring.wait(li, j);
      const int count = ring.piece_elems(j);
#pragma unroll 4
      for (int c = static_cast<int>(threadIdx.x) * VEC; c < count; c += step) {
        const V in = *reinterpret_cast<const V*>(piece + c);
#pragma unroll
        for (int e = 0; e < VEC; ++e) sum += to_acc(in.v[e]);
      }
    }
    const A rough_mean = group_reduce(sum, tpr, A(0), scratch, SumOp{}) / count_n;
    A sq = 0, dev = 0;
    for (int j = 0; j < plan.pieces; ++j) {
      const T* piece = ring.landed(li, j);
      const int count = ring.piece_elems(j);
#pragma unroll 4
      for (int c = static_cast<int>(threadIdx.x) * VEC; c < count; c += step) {
        const V in = *reinterpret_cast<const V*>(piece + c);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A d = to_acc(in.v[e]) - rough_mean;
          sq += d * d;
          dev += d;
        }
      }
    }
    const A dev_mean = group_reduce(dev, tpr, A(0), scratch, SumOp{}) / count_n;
    const A var = group_reduce(sq, tpr, A(0), scratch, SumOp{}) / count_n - dev_mean * dev_mean;
    const A rstd = rsqrt_acc(var + eps);
    T* out = x + row * n;
    for (int j = 0; j < plan.pieces; ++j) {
      const T* piece = ring.landed(li, j);
      const int64_t base = static_cast<int64_t>(j) * plan.slot_elems;
      const int count = ring.piece_elems(j);
#pragma unroll 4
      for (int c = static_cast<int>(threadIdx.x) * VEC; c < count; c += step) {
        const V in = *reinterpret_cast<const V*>(piece + c);
        V wv, bv, o;
        if (w != nullptr) wv = *reinterpret_cast<const V*>(w + base + c);
        if (b != nullptr) bv = *reinterpret_cast<const V*>(b + base + c);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          A v = ((to_acc(in.v[e]) - rough_mean) - dev_mean) * rstd;
          if (w != nullptr) v *= to_acc(wv.v[e]);
          if (b != nullptr) v += to_acc(bv.v[e]);
          o.v[e] = from_acc<T>(v);
        }
        store_vec(out + base + c, o);
      }
    }
    if (threadIdx.x == 0) {
      if (mean_out != nullptr) mean_out[row] = rough_mean + dev_mean;
      if (rstd_out != nullptr) rstd_out[row] = rstd;
    }
    ring.release(li);
  }
#endif
}

// Rows staged in shared memory for 16-bit types and float (double keeps
// layer_norm_staged_kernel): the statistics in one pass over the pieces as
// they land (moments.cuh), then the write pass from the slots. Whether w
// and b are given are template parameters, so the write pass has no
// branches. A row too long for one ring is split over a cluster of
// plan.split CTAs: each stages and writes its part, and the parts' moments
// meet through distributed shared memory.
template <typename T, bool HAS_W, bool HAS_B>
__global__ void __launch_bounds__(staged::kMaxThreads)
    layer_norm_staged_moments_kernel(T* __restrict__ x, const T* __restrict__ w,
                                     const T* __restrict__ b, int64_t rows, int64_t n,
                                     float inv_n, float eps, float* __restrict__ mean_out,
                                     float* __restrict__ rstd_out, staged::Plan plan) {
#ifdef MAKE_INPLACE_STAGED_ROWS
  constexpr int VEC = 16 / sizeof(T);
  constexpr int F = kFloatsPerVector<T>;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float scratch[96];
  __shared__ staged::SplitMoments exchange;  // split rows only
  int round = 0;
  const staged::Share share = staged::share_of(plan);
  const int64_t part_base = share.part_base, cluster = share.first_row, clusters = share.row_step;
  staged::RowRing<T> ring(smem, x, rows, n, plan, share);
  ring.start();
  const int step = static_cast<int>(blockDim.x) * VEC;
  const T* wp = HAS_W ? w + part_base : nullptr;
  const T* bp = HAS_B ? b + part_base : nullptr;
  for (int64_t li = 0; cluster + li * clusters < rows; ++li) {
    const int64_t row = cluster + li * clusters;
    // Moments of x - shift, the part's first element: the mean is then
    // shift + m.mean, two floats, and x - mean keeps the accuracy of the
    // corrected two-pass formula on rows far from zero (as one float, the
    // mean of a float32 row near 1000 is off by up to 3e-5).
    float shift = to_acc(ring.wait(li, 0)[0]);
    Moments<float> m;
    for (int j = 0; j < plan.pieces; ++j) {
      const T* piece = ring.wait(li, j);
      const int count = ring.piece_elems(j);
#pragma unroll 2
      for (int c = static_cast<int>(threadIdx.x) * VEC; c < count; c += step) {
        float f[F];
        unpack_vector<T>(*reinterpret_cast<const V*>(piece + c), f);
#pragma unroll
        for (int e = 0; e < F; ++e) f[e] -= shift;
        m.add<F>(f);
      }
    }
    m = block_moments(m, scratch);
    if (plan.split > 1) m = staged::split_moments(m, &shift, plan.split, &exchange, &round);
    const float mean = m.mean;  // of x - shift
    const float rstd = rsqrtf(m.m2 * inv_n + eps);
    T* out = x + row * n + part_base;
    for (int j = 0; j < plan.pieces; ++j) {
      const T* piece = ring.landed(li, j);
      const int64_t base = static_cast<int64_t>(j) * plan.slot_elems;
      const int count = ring.piece_elems(j);
#pragma unroll 2
      for (int c = static_cast<int>(threadIdx.x) * VEC; c < count; c += step) {
        float f[F], wf[F], bf[F];
        unpack_vector<T>(*reinterpret_cast<const V*>(piece + c), f);
        if constexpr (HAS_W) unpack_vector<T>(*reinterpret_cast<const V*>(wp + base + c), wf);
        if constexpr (HAS_B) unpack_vector<T>(*reinterpret_cast<const V*>(bp + base + c), bf);
#pragma unroll
        for (int e = 0; e < F; ++e) {
          const float y = ((f[e] - shift) - mean) * rstd;
          if constexpr (HAS_W && HAS_B) {
            f[e] = fmaf(y, wf[e], bf[e]);
          } else if constexpr (HAS_W) {
            f[e] = y * wf[e];
          } else if constexpr (HAS_B) {
            f[e] = y + bf[e];
          } else {
            f[e] = y;
          }
        }
        store_vec(out + base + c, pack_vector<T, V>(f));
      }
    }
    if (threadIdx.x == 0 && part_base == 0) {
      if (mean_out != nullptr) mean_out[row] = shift + mean;
      if (rstd_out != nullptr) rstd_out[row] = rstd;
    }
    ring.release(li);
  }
  if (plan.split > 1) staged::cluster_sync();  // no exit while a peer may still store here
#endif
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kLongThreads)
    layer_norm_long_kernel(T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                           int64_t row0, int64_t n, acc_t<T> eps, acc_t<T>* __restrict__ mean_out,
                           acc_t<T>* __restrict__ rstd_out) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  __shared__ A scratch[96];
  const int64_t row = row0 + blockIdx.x;
  T* p = x + row * n;
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  // Moments of x - shift, the row's first element: the mean is shift + mean,
  // two values, exact to A's precision on rows far from zero too.
  const A shift = to_acc(p[0]);
  Moments<A> mine;
  // Unrolled so each thread has several independent loads in flight.
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < n; col += step) {
    const V in = *reinterpret_cast<const V*>(p + col);
    A v[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = to_acc(in.v[e]) - shift;
    mine.template add<VEC>(v);
  }
  const Moments<A> all = block_moments(mine, scratch);
  const A mean = all.mean;  // of x - shift
  const A rstd = rsqrt_acc(all.m2 / static_cast<A>(n) + eps);
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < n; col += step) {
    const V in = *reinterpret_cast<const V*>(p + col);
    V wv, bv, out;
    if (w != nullptr) wv = *reinterpret_cast<const V*>(w + col);
    if (b != nullptr) bv = *reinterpret_cast<const V*>(b + col);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      A v = ((to_acc(in.v[e]) - shift) - mean) * rstd;
      if (w != nullptr) v *= to_acc(wv.v[e]);
      if (b != nullptr) v += to_acc(bv.v[e]);
      out.v[e] = from_acc<T>(v);
    }
    store_vec(p + col, out);
  }
  if (threadIdx.x == 0) {
    if (mean_out != nullptr) mean_out[row] = shift + mean;
    if (rstd_out != nullptr) rstd_out[row] = rstd;
  }
}

// x_hat rebuilt from the output: (y - b) / w, |w| clamped up to
// kLayerNormWeightClamp (see layer_norm.h).
template <typename A>
__device__ __forceinline__ A clamp_weight(A w) {
  const A lo = static_cast<A>(kLayerNormWeightClamp);
  if (w >= A(0)) return w < lo ? lo : w;
  return w > -lo ? -lo : w;
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kOnChipMaxThreads)
    layer_norm_backward_rows_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                                    const T* __restrict__ w, const T* __restrict__ b,
                                    const acc_t<T>* __restrict__ rstd, int64_t row0,
                                    int64_t rows, int64_t n, int tpr, T* __restrict__ dx) {
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
  // g = dy * w and x_hat for one vector of the row.
  auto load = [&](int64_t col, A* g, A* xh) {
    const V gv = *reinterpret_cast<const V*>(dy + off + col);
    const V yv = *reinterpret_cast<const V*>(y + off + col);
    V wv, bv;
    if (w != nullptr) wv = *reinterpret_cast<const V*>(w + col);
    if (b != nullptr) bv = *reinterpret_cast<const V*>(b + col);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      A yh = to_acc(yv.v[e]);
      g[e] = to_acc(gv.v[e]);
      if (b != nullptr) yh -= to_acc(bv.v[e]);
      if (w != nullptr) {
        const A wa = to_acc(wv.v[e]);
        yh /= clamp_weight(wa);
        g[e] *= wa;
      }
      xh[e] = yh;
    }
  };
  A sum_g = 0, sum_gx = 0;
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(lane) * VEC; col < end; col += step) {
    A g[VEC], xh[VEC];
    load(col, g, xh);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      sum_g += g[e];
      sum_gx += g[e] * xh[e];
    }
  }
  const A mean_g = group_reduce(sum_g, tpr, A(0), scratch, SumOp{}) / static_cast<A>(n);
  const A mean_gx = group_reduce(sum_gx, tpr, A(0), scratch, SumOp{}) / static_cast<A>(n);
  const A rs = active ? rstd[row] : A(0);
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(lane) * VEC; col < end; col += step) {
    A g[VEC], xh[VEC];
    load(col, g, xh);
    V out;
#pragma unroll
    for (int e = 0; e < VEC; ++e) out.v[e] = from_acc<T>(rs * (g[e] - mean_g - xh[e] * mean_gx));
    store_vec(dx + off + col, out);
  }
}

// Partial column sums over one chunk of rows: dw_part[chunk, j] = sum dy * x_hat,
// db_part[chunk, j] = sum dy (either pointer may be null).
template <typename T>
__global__ void __launch_bounds__(kColTile * kColRows)
    layer_norm_columns_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                              const T* __restrict__ w, const T* __restrict__ b, int64_t rows,
                              int64_t n, int64_t rows_per_chunk, acc_t<T>* __restrict__ dw_part,
                              acc_t<T>* __restrict__ db_part) {
  using A = acc_t<T>;
  __shared__ A red_w[kColRows][kColTile + 1];
  __shared__ A red_b[kColRows][kColTile + 1];
  const int tx = threadIdx.x % kColTile, ty = threadIdx.x / kColTile;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  A acc_w = 0, acc_b = 0;
  if (j < n) {
    const A wc = w != nullptr ? clamp_weight(to_acc(w[j])) : A(1);
    const A bj = b != nullptr ? to_acc(b[j]) : A(0);
    for (int64_t r = r0 + ty; r < r1; r += kColRows) {
      const A g = to_acc(dy[r * n + j]);
      acc_b += g;
      if (dw_part != nullptr) acc_w += g * ((to_acc(y[r * n + j]) - bj) / wc);
    }
  }
  red_w[ty][tx] = acc_w;
  red_b[ty][tx] = acc_b;
  __syncthreads();
  if (ty == 0 && j < n) {
    for (int k = 1; k < kColRows; ++k) {
      acc_w += red_w[k][tx];
      acc_b += red_b[k][tx];
    }
    if (dw_part != nullptr) dw_part[blockIdx.y * n + j] = acc_w;
    if (db_part != nullptr) db_part[blockIdx.y * n + j] = acc_b;
  }
}

template <typename T>
__global__ void layer_norm_columns_final_kernel(const acc_t<T>* __restrict__ dw_part,
                                                const acc_t<T>* __restrict__ db_part,
                                                int64_t chunks, int64_t n, T* __restrict__ dw,
                                                T* __restrict__ db) {
  using A = acc_t<T>;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  A sw = 0, sb = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    if (dw != nullptr) sw += dw_part[c * n + j];
    if (db != nullptr) sb += db_part[c * n + j];
  }
  if (dw != nullptr) dw[j] = from_acc<T>(sw);
  if (db != nullptr) db[j] = from_acc<T>(sb);
}

template <typename T, int VEC, int NV>
cudaError_t launch_rows(T* x, const T* w, const T* b, int64_t rows, int64_t n, int tpr,
                        acc_t<T> eps, acc_t<T>* mean, acc_t<T>* rstd, cudaStream_t stream) {
  const int block = tpr > 32 ? tpr : kSmallBlock;  // above a warp: one row per CTA
  return launch_chunks(rows, block / tpr, [&](int64_t row0, unsigned grid) {
    layer_norm_rows_kernel<T, VEC, NV>
        <<<grid, block, 0, stream>>>(x, w, b, row0, rows, static_cast<int>(n), tpr, eps, mean,
                                     rstd);
  });
}

template <typename T, int NV>
cudaError_t launch_plain(T* x, const T* w, const T* b, int64_t rows, int64_t n, int tpr,
                         float eps, float* mean, float* rstd, cudaStream_t stream) {
  const int block = tpr > 32 ? tpr : kSmallBlock;  // above a warp: one row per CTA
  // float32 rows of a whole CTA (8193-16384 columns; 83 registers, one CTA
  // an SM) prefetch the next wave's rows: H100 (4096, 16384) +2%, (4096,
  // 12288) +6%; where two or more CTAs share an SM (16-bit rows, float32 of
  // 8192 columns) it cost the H100 4-6% (docs/rowwise_tuning.md).
  return with_affine(w, b, [&](auto has_w, auto has_b) {
    constexpr auto kernel =
        layer_norm_rows_plain_kernel<T, NV, decltype(has_w)::value, decltype(has_b)::value>;
    int64_t ahead = 0;
    if (sizeof(T) == 4 && tpr == kOnChipMaxThreads) {
      const cudaError_t err = resident_ctas(kernel, block, 0, &ahead);
      if (err != cudaSuccess) return err;
    }
    return launch_chunks(rows, block / tpr, [&](int64_t row0, unsigned grid) {
      kernel<<<grid, block, 0, stream>>>(x, w, b, row0, rows, static_cast<int>(n), tpr,
                                         1.0f / static_cast<float>(n), eps, mean, rstd, ahead);
    });
  });
}

template <typename T, int TPR>
cudaError_t launch_short(T* x, const T* w, const T* b, int64_t rows, int64_t n, float eps,
                         float* mean, float* rstd, cudaStream_t stream) {
  constexpr auto kernel = layer_norm_short_rows_kernel<T, TPR, 2>;
  unsigned grid = 0;
  const cudaError_t err = short_rows_grid<TPR>(kernel, rows, true, &grid);
  if (err != cudaSuccess) return err;
  kernel<<<grid, kSmallBlock, 0, stream>>>(x, w, b, rows, static_cast<int>(n),
                                           1.0f / static_cast<float>(n), eps, mean, rstd);
  return cudaGetLastError();
}

// layer_norm_rows_plain_kernel where it applies (16-byte vectors, not
// float64, a row on chip); false where it does not, *err set where it does.
template <typename T>
bool forward_plain(T* x, const T* w, const T* b, int64_t rows, int64_t n, acc_t<T> eps,
                   acc_t<T>* mean, acc_t<T>* rstd, cudaStream_t stream, cudaError_t* err) {
  if constexpr (sizeof(T) == 8) {
    return false;
  } else {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int kMaxNv = 32 / kFloatsPerVector<T>;
    int tpr = 0, nv = 0;
    // Two vectors per thread on short rows: fewer shuffles per element for
    // its reductions. 16-bit rows of up to 32 elements a thread stay one
    // warp's, kept packed (two warps of 16 a thread ran 22% slower: H200, bf16
    // (262144, 1024)); float32 rows take more warps past 2 vectors a thread.
    if (!on_chip_plan(n / VEC, kMaxNv, 2, sizeof(T) == 2 ? kMaxNv : 2, &tpr, &nv)) return false;
    // float32 rows that fill 128 threads of 8 vectors (4096 columns) take 256
    // of 4: H200 (16384, 4096) 136.3 -> 134.2 us, (32768, 4096) 267.7 ->
    // 264.2; rms_norm_ and softmax_ gained nothing so, 8192 columns on 512 of
    // 4 moved either way (docs/rowwise_tuning.md).
    if (sizeof(T) == 4 && tpr == 128 && nv == 8 && int64_t{tpr} * nv * VEC == n) tpr = 256, nv = 4;
    // 16-bit rows of up to 64 vectors walk (H200, bf16 (262144, 128): 42.5 ->
    // 37.8 us); float32 rows ran 3-6% slower that way.
    if constexpr (sizeof(T) == 2) {
      if (tpr <= 32 && nv <= 2) {
        return with_short_group(tpr, [&](auto tpr_tag) {
          *err = launch_short<T, decltype(tpr_tag)::value>(x, w, b, rows, n, eps, mean, rstd,
                                                           stream);
        });
      }
    }
    return with_vectors<kMaxNv>(nv, [&](auto nv_tag) {
      *err = launch_plain<T, decltype(nv_tag)::value>(x, w, b, rows, n, tpr, eps, mean, rstd,
                                                      stream);
    });
  }
}

template <typename T, int VEC>
cudaError_t forward_staged(T* x, const T* w, const T* b, int64_t rows, int64_t n, acc_t<T> eps,
                           acc_t<T>* mean, acc_t<T>* rstd, const staged::Plan& plan,
                           cudaStream_t stream) {
  if constexpr (sizeof(T) == 8) {
    return staged::launch_persistent(layer_norm_staged_kernel<T, VEC>, plan, rows, stream, x, w,
                                     b, rows, n, eps, mean, rstd, plan);
  } else {
    return with_affine(w, b, [&](auto has_w, auto has_b) {
      return staged::launch_persistent(
          layer_norm_staged_moments_kernel<T, decltype(has_w)::value, decltype(has_b)::value>,
          plan, rows, stream, x, w, b, rows, n, 1.0f / static_cast<float>(n), eps, mean, rstd,
          plan);
    });
  }
}

template <typename T, int VEC>
cudaError_t forward_vec(T* x, const T* w, const T* b, int64_t rows, int64_t n, acc_t<T> eps,
                        acc_t<T>* mean, acc_t<T>* rstd, cudaStream_t stream) {
  if constexpr (VEC > 1) {  // VEC == 1: rows not 16-byte aligned, never staged
    // The register kernel first, up to 16384 columns (32 elements per thread
    // of a 512-thread CTA): with its rows kept packed it beat the staged
    // kernel at 32-64 KiB rows (docs/rowwise_tuning.md).
    cudaError_t err = cudaSuccess;
    if (forward_plain<T>(x, w, b, rows, n, eps, mean, rstd, stream, &err)) return err;
    // The moments kernel (not float64's) splits rows over a 2-CTA cluster.
    staged::Plan plan;
    if (staged::plan_norm_rows(n, sizeof(T), sizeof(T) < 8, &plan)) {
      return forward_staged<T, VEC>(x, w, b, rows, n, eps, mean, rstd, plan, stream);
    }
  }
  int tpr = 0, nv = 0;
  if (on_chip_plan((n + VEC - 1) / VEC, max_vectors_per_thread<T>(), 1,
                   max_vectors_per_thread<T>(), &tpr, &nv)) {
    switch (nv) {
      case 1: return launch_rows<T, VEC, 1>(x, w, b, rows, n, tpr, eps, mean, rstd, stream);
      case 2: return launch_rows<T, VEC, 2>(x, w, b, rows, n, tpr, eps, mean, rstd, stream);
      case 4: return launch_rows<T, VEC, 4>(x, w, b, rows, n, tpr, eps, mean, rstd, stream);
      case 8: return launch_rows<T, VEC, 8>(x, w, b, rows, n, tpr, eps, mean, rstd, stream);
      case 16:
        if constexpr (max_vectors_per_thread<T>() >= 16) {
          return launch_rows<T, VEC, 16>(x, w, b, rows, n, tpr, eps, mean, rstd, stream);
        }
        break;
    }
    return cudaErrorInvalidValue;  // on_chip_plan never returns nv above the maximum
  }
  return launch_chunks(rows, 1, [&](int64_t row0, unsigned grid) {
    layer_norm_long_kernel<T, VEC>
        <<<grid, kLongThreads, 0, stream>>>(x, w, b, row0, n, eps, mean, rstd);
  });
}

// Row chunks for the column sums: enough CTAs to fill the GPU, within
// gridDim.y's limit of 65535.
inline int64_t column_chunks(int64_t rows, int64_t n) {
  const int64_t tiles = (n + kColTile - 1) / kColTile;
  const int64_t want = (kTargetBlocks + tiles - 1) / tiles;
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(65535, (rows + kColRows - 1) / kColRows));
  return std::max<int64_t>(1, std::min(want, most));
}

template <typename T, int VEC>
cudaError_t backward_rows(const T* dy, const T* y, const T* w, const T* b,
                          const acc_t<T>* rstd, int64_t rows, int64_t n, T* dx,
                          cudaStream_t stream) {
  const int64_t nvec = (n + VEC - 1) / VEC;
  const int tpr = std::min(512, pow2_at_least((nvec + 3) / 4));
  const int block = tpr > 32 ? tpr : kSmallBlock;  // above a warp: one row per CTA
  return launch_chunks(rows, block / tpr, [&](int64_t row0, unsigned grid) {
    layer_norm_backward_rows_kernel<T, VEC>
        <<<grid, block, 0, stream>>>(dy, y, w, b, rstd, row0, rows, n, tpr, dx);
  });
}

template <typename T>
cudaError_t backward(const T* dy, const T* y, const T* w, const T* b, const acc_t<T>* rstd,
                     int64_t rows, int64_t n, T* dx, T* dw, T* db, acc_t<T>* workspace,
                     cudaStream_t stream) {
  using A = acc_t<T>;
  if (dx != nullptr) {
    constexpr int VEC = 16 / sizeof(T);
    const bool vec = n % VEC == 0 && aligned16(dy) && aligned16(y) && aligned16(w) &&
                     aligned16(b) && aligned16(dx);
    const cudaError_t err = vec ? backward_rows<T, VEC>(dy, y, w, b, rstd, rows, n, dx, stream)
                                : backward_rows<T, 1>(dy, y, w, b, rstd, rows, n, dx, stream);
    if (err != cudaSuccess) return err;
  }
  if (dw == nullptr && db == nullptr) return cudaSuccess;
  const int64_t chunks = column_chunks(rows, n);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  A* dw_part = dw != nullptr ? workspace : nullptr;
  A* db_part = db != nullptr ? workspace + chunks * n : nullptr;
  const dim3 grid(static_cast<unsigned>((n + kColTile - 1) / kColTile),
                  static_cast<unsigned>(chunks));
  layer_norm_columns_kernel<T><<<grid, kColTile * kColRows, 0, stream>>>(
      dy, y, w, b, rows, n, rows_per_chunk, dw_part, db_part);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  layer_norm_columns_final_kernel<T><<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      dw_part, db_part, chunks, n, dw, db);
  return cudaGetLastError();
}

}  // namespace

cudaError_t layer_norm_forward_cuda(ScalarKind kind, void* x, const void* weight,
                                    const void* bias, int64_t rows, int64_t n, double eps,
                                    void* mean, void* rstd, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    constexpr int VEC = 16 / sizeof(T);
    T* xp = static_cast<T*>(x);
    const T* w = static_cast<const T*>(weight);
    const T* b = static_cast<const T*>(bias);
    A* mp = static_cast<A*>(mean);
    A* rp = static_cast<A*>(rstd);
    const bool vec = n % VEC == 0 && aligned16(xp) && aligned16(w) && aligned16(b);
    err = vec ? forward_vec<T, VEC>(xp, w, b, rows, n, static_cast<A>(eps), mp, rp, stream)
              : forward_vec<T, 1>(xp, w, b, rows, n, static_cast<A>(eps), mp, rp, stream);
  });
  return err;
}

int64_t layer_norm_backward_cuda_workspace(ScalarKind kind, int64_t rows, int64_t n,
                                           bool weight_or_bias) {
  if (!weight_or_bias || rows == 0 || n == 0) return 0;
  const int64_t acc_size = kind == ScalarKind::kFloat64 ? 8 : 4;
  return 2 * column_chunks(rows, n) * n * acc_size;
}

cudaError_t layer_norm_backward_cuda(ScalarKind kind, const void* grad_output, const void* y,
                                     const void* weight, const void* bias, const void* rstd,
                                     int64_t rows, int64_t n, void* grad_input,
                                     void* grad_weight, void* grad_bias, void* workspace,
                                     cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    err = backward<T>(static_cast<const T*>(grad_output), static_cast<const T*>(y),
                      static_cast<const T*>(weight), static_cast<const T*>(bias),
                      static_cast<const A*>(rstd), rows, n, static_cast<T*>(grad_input),
                      static_cast<T*>(grad_weight), static_cast<T*>(grad_bias),
                      static_cast<A*>(workspace), stream);
  });
  return err;
}

}  // namespace make_inplace::kernels
