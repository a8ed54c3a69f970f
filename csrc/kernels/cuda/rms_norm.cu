// rms_norm_ and its backward on CUDA, torch-free.
//
// Forward: rows that fit on chip are held in registers by `tpr` threads (a
// sub-warp or warp for short rows, up to a 512-thread CTA for long ones) as
// 16-byte vectors (16-bit and float32 rows of up to 32 elements per thread
// take rms_norm_rows_plain_kernel): one read and one write per element, the sum of squares
// accumulated in float (double for float64) and reduced over the row's
// threads. 16-bit and float32 rows of 32 KiB and more that the fast path
// cannot hold (sm_90) are staged through a ring of shared-memory slots
// (staged_rows.cuh), split over a cluster where layer_norm_'s are.
// Other long rows: a CTA per row in two passes over global memory (sum of
// squares, then the write); in place, no workspace. RMS has no mean, so
// the one-pass sum of squares loses nothing to cancellation.
// Backward: grad_input row by row in two passes (the row sum of g * x_hat,
// then the write); grad_weight as column sums over row chunks into a
// workspace, then a final sum over the chunks.
#include "make_inplace/kernels/rms_norm.h"
#include "make_inplace/kernels/packed_rows.cuh"
#include "make_inplace/kernels/rowwise_cuda.cuh"
#include "make_inplace/kernels/staged_rows.cuh"

#include <algorithm>

namespace make_inplace::kernels {
namespace {

using namespace rowwise;

constexpr int kLongThreads = 512;
constexpr int kColTile = 32;            // columns per CTA in the grad_weight sums
constexpr int kColRows = 8;             // row lanes per CTA there
constexpr int kTargetBlocks = 132 * 8;  // enough CTAs to fill an H100/H200

// Rows held on chip: n <= kOnChipMaxThreads * NV * VEC, so column indices fit in int.
template <typename T, int VEC, int NV>
__global__ void __launch_bounds__(kOnChipMaxThreads)
    rms_norm_rows_kernel(T* __restrict__ x, const T* __restrict__ w, int64_t row0, int64_t rows,
                         int n, int tpr, acc_t<T> inv_n, acc_t<T> eps, acc_t<T>* __restrict__ rstd_out) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  __shared__ A scratch[32];
  const auto [lane, row, active, end] = on_chip_row(row0, rows, n, tpr);
  T* p = x + (active ? row : 0) * n;

  V buf[NV];
  A sq = 0;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
      buf[k] = *reinterpret_cast<const V*>(p + col);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A v = to_acc(buf[k].v[e]);
        sq += v * v;
      }
    }
  }
  const A rstd = rsqrt_acc(group_reduce(sq, tpr, A(0), scratch, SumOp{}) * inv_n + eps);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
      V wv, out;
      if (w != nullptr) wv = *reinterpret_cast<const V*>(w + col);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A v = to_acc_fresh(buf[k].v[e]) * rstd;
        if (w != nullptr) v *= to_acc(wv.v[e]);
        out.v[e] = from_acc<T>(v);
      }
      store_vec(p + col, out);
    }
  }
  if (active && lane == 0 && rstd_out != nullptr) rstd_out[row] = rstd;
}

// The 16-bit and float32 fast path for rows held on chip: up to 32 floats of
// the row per thread, converted with packed pairs (the general kernel above
// converts element by element); at 32 16-bit elements per thread the row stays
// packed as loaded and the write pass unpacks it again, as in
// layer_norm_rows_plain_kernel.
template <typename T, int NV>
__global__ void __launch_bounds__(kOnChipMaxThreads)
    rms_norm_rows_plain_kernel(T* __restrict__ x, const T* __restrict__ w, int64_t row0, int64_t rows, int n,
                               int tpr, float inv_n, float eps, float* __restrict__ rstd_out) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int F = kFloatsPerVector<T>;
  static_assert(NV * F <= 32, "at most 32 floats of the row per thread");
  using V = Vec<T, VEC>;
  __shared__ float scratch[32];
  const auto [lane, row, active, end] = on_chip_row(row0, rows, n, tpr);
  T* p = x + (active ? row : 0) * n;

  V buf[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    // Lines kept in L2 until the store (global16.cuh): H200, 1-3% faster at
    // every width and type measured (docs/rowwise_tuning.md).
    if (col < end) buf[k] = load_global_16<true, V>(p + col);
  }
  constexpr bool PACKED = sizeof(T) == 2 && NV * F == 32;
  float v[PACKED ? 1 : NV][F];
  float sq = 0;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
      float f[F];
      unpack_vector<T>(buf[k], f);
#pragma unroll
      for (int e = 0; e < F; ++e) {
        if constexpr (!PACKED) v[k][e] = f[e];
        sq += f[e] * f[e];
      }
    }
  }
  const float rstd = rsqrtf(group_reduce(sq, tpr, 0.0f, scratch, SumOp{}) * inv_n + eps);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * tpr + lane) * VEC;
    if (col < end) {
      float f[F];
      if constexpr (PACKED) {
        unpack_vector<T>(buf[k], f);
      } else {
#pragma unroll
        for (int e = 0; e < F; ++e) f[e] = v[k][e];
      }
#pragma unroll
      for (int e = 0; e < F; ++e) f[e] *= rstd;
      if (w != nullptr) {
        float wf[F];
        unpack_vector<T>(*reinterpret_cast<const V*>(w + col), wf);
#pragma unroll
        for (int e = 0; e < F; ++e) f[e] *= wf[e];
      }
      store_vec(p + col, pack_vector<T, V>(f));
    }
  }
  if (active && lane == 0 && rstd_out != nullptr) rstd_out[row] = rstd;
}

// A CTA per row, for rows too long to hold on chip: two passes over global memory.
template <typename T, int VEC>
__global__ void __launch_bounds__(kLongThreads)
    rms_norm_long_kernel(T* __restrict__ x, const T* __restrict__ w, int64_t row0, int64_t n,
                         acc_t<T> inv_n, acc_t<T> eps, acc_t<T>* __restrict__ rstd_out) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  __shared__ A scratch[32];
  const int64_t row = row0 + blockIdx.x;
  T* p = x + row * n;
  const int64_t step = static_cast<int64_t>(blockDim.x) * VEC;
  A sq = 0;
  // Unrolled so each thread has several independent loads in flight.
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < n; col += step) {
    const V in = *reinterpret_cast<const V*>(p + col);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const A v = to_acc(in.v[e]);
      sq += v * v;
    }
  }
  const A rstd = rsqrt_acc(group_reduce(sq, static_cast<int>(blockDim.x), A(0), scratch, SumOp{}) * inv_n + eps);
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * VEC; col < n; col += step) {
    const V in = *reinterpret_cast<const V*>(p + col);
    V wv, out;
    if (w != nullptr) wv = *reinterpret_cast<const V*>(w + col);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      A v = to_acc(in.v[e]) * rstd;
      if (w != nullptr) v *= to_acc(wv.v[e]);
      out.v[e] = from_acc<T>(v);
    }
    store_vec(p + col, out);
  }
  if (threadIdx.x == 0 && rstd_out != nullptr) rstd_out[row] = rstd;
}

// Rows staged in shared memory (staged_rows.cuh), 16-bit types and float:
// the sum of squares as the pieces land, then the write pass from the slots;
// no second read of global memory. A row too long for one ring, or of four
// or more slots whose halves fit one, is split over a cluster whose parts'
// sums meet through distributed shared memory (the plans of layer_norm_'s
// staged kernel). Whether w is given is a template parameter.
template <typename T, bool HAS_W>
__global__ void __launch_bounds__(staged::kMaxThreads)
    rms_norm_staged_kernel(T* __restrict__ x, const T* __restrict__ w, int64_t rows, int64_t n,
                           float inv_n, float eps, float* __restrict__ rstd_out, staged::Plan plan) {
#ifdef MAKE_INPLACE_STAGED_ROWS
  constexpr int VEC = 16 / sizeof(T);
  constexpr int F = kFloatsPerVector<T>;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float scratch[32];
  __shared__ staged::SplitExchange exchange;  // split rows only
  int round = 0;
  const staged::Share share = staged::share_of(plan);
  const int64_t part_base = share.part_base, cluster = share.first_row, clusters = share.row_step;
  staged::RowRing<T> ring(smem, x, rows, n, plan, share);
  ring.start();
  const int step = static_cast<int>(blockDim.x) * VEC;
  const T* wp = HAS_W ? w + part_base : nullptr;
  for (int64_t li = 0; cluster + li * clusters < rows; ++li) {
    const int64_t row = cluster + li * clusters;
    float sq = 0;
    for (int j = 0; j < plan.pieces; ++j) {
      const T* piece = ring.wait(li, j);
      const int count = ring.piece_elems(j);
#pragma unroll 2
      for (int c = static_cast<int>(threadIdx.x) * VEC; c < count; c += step) {
        float f[F];
        unpack_vector<T>(*reinterpret_cast<const V*>(piece + c), f);
#pragma unroll
        for (int e = 0; e < F; ++e) sq = fmaf(f[e], f[e], sq);
      }
    }
    sq = group_reduce(sq, static_cast<int>(blockDim.x), 0.0f, scratch, SumOp{});
    if (plan.split > 1) sq = staged::split_reduce(sq, plan.split, &exchange, &round, SumOp{});
    const float rstd = rsqrtf(sq * inv_n + eps);
    T* out = x + row * n + part_base;
    for (int j = 0; j < plan.pieces; ++j) {
      const T* piece = ring.landed(li, j);
      const int64_t base = static_cast<int64_t>(j) * plan.slot_elems;
      const int count = ring.piece_elems(j);
#pragma unroll 2
      for (int c = static_cast<int>(threadIdx.x) * VEC; c < count; c += step) {
        float f[F], wf[F];
        unpack_vector<T>(*reinterpret_cast<const V*>(piece + c), f);
        if constexpr (HAS_W) unpack_vector<T>(*reinterpret_cast<const V*>(wp + base + c), wf);
#pragma unroll
        for (int e = 0; e < F; ++e) {
          f[e] *= rstd;
          if constexpr (HAS_W) f[e] *= wf[e];
        }
        store_vec(out + base + c, pack_vector<T, V>(f));
      }
    }
    if (threadIdx.x == 0 && part_base == 0 && rstd_out != nullptr) rstd_out[row] = rstd;
    ring.release(li);
  }
#endif
}

// x_hat rebuilt from the output: y / w, |w| clamped up to kRmsNormWeightClamp (see rms_norm.h).
template <typename A>
__device__ __forceinline__ A clamp_weight(A w) {
  const A lo = static_cast<A>(kRmsNormWeightClamp);
  if (w >= A(0)) return w < lo ? lo : w;
  return w > -lo ? -lo : w;
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kOnChipMaxThreads)
    rms_norm_backward_rows_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                                  const T* __restrict__ w, const acc_t<T>* __restrict__ rstd,
                                  int64_t row0, int64_t rows, int64_t n, int tpr, T* __restrict__ dx) {
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
    V wv;
    if (w != nullptr) wv = *reinterpret_cast<const V*>(w + col);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      A yh = to_acc(yv.v[e]);
      g[e] = to_acc(gv.v[e]);
      if (w != nullptr) {
        const A wa = to_acc(wv.v[e]);
        yh /= clamp_weight(wa);
        g[e] *= wa;
      }
      xh[e] = yh;
    }
  };
  A sum_gx = 0;
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(lane) * VEC; col < end; col += step) {
    A g[VEC], xh[VEC];
    load(col, g, xh);
#pragma unroll
    for (int e = 0; e < VEC; ++e) sum_gx += g[e] * xh[e];
  }
  const A mean_gx = group_reduce(sum_gx, tpr, A(0), scratch, SumOp{}) / static_cast<A>(n);
  const A rs = active ? rstd[row] : A(0);
#pragma unroll 4
  for (int64_t col = static_cast<int64_t>(lane) * VEC; col < end; col += step) {
    A g[VEC], xh[VEC];
    load(col, g, xh);
    V out;
#pragma unroll
    for (int e = 0; e < VEC; ++e) out.v[e] = from_acc<T>(rs * (g[e] - xh[e] * mean_gx));
    store_vec(dx + off + col, out);
  }
}

// Partial column sums over one chunk of rows: dw_part[chunk, j] = sum dy * x_hat.
template <typename T>
__global__ void __launch_bounds__(kColTile * kColRows)
    rms_norm_columns_kernel(const T* __restrict__ dy, const T* __restrict__ y, const T* __restrict__ w,
                            int64_t rows, int64_t n, int64_t rows_per_chunk, acc_t<T>* __restrict__ dw_part) {
  using A = acc_t<T>;
  __shared__ A red[kColRows][kColTile + 1];
  const int tx = threadIdx.x % kColTile, ty = threadIdx.x / kColTile;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  A acc = 0;
  if (j < n) {
    const A wc = clamp_weight(to_acc(w[j]));
    for (int64_t r = r0 + ty; r < r1; r += kColRows) acc += to_acc(dy[r * n + j]) * (to_acc(y[r * n + j]) / wc);
  }
  red[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && j < n) {
    for (int k = 1; k < kColRows; ++k) acc += red[k][tx];
    dw_part[blockIdx.y * n + j] = acc;
  }
}

template <typename T>
__global__ void rms_norm_columns_final_kernel(const acc_t<T>* __restrict__ dw_part, int64_t chunks,
                                              int64_t n, T* __restrict__ dw) {
  using A = acc_t<T>;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  A s = 0;
  for (int64_t c = 0; c < chunks; ++c) s += dw_part[c * n + j];
  dw[j] = from_acc<T>(s);
}

template <typename T, int VEC, int NV>
cudaError_t launch_rows(T* x, const T* w, int64_t rows, int64_t n, int tpr, acc_t<T> eps,
                        acc_t<T>* rstd, cudaStream_t stream) {
  using A = acc_t<T>;
  const int block = tpr > 32 ? tpr : kSmallBlock;  // above a warp: one row per CTA
  return launch_chunks(rows, block / tpr, [&](int64_t row0, unsigned grid) {
    rms_norm_rows_kernel<T, VEC, NV><<<grid, block, 0, stream>>>(
        x, w, row0, rows, static_cast<int>(n), tpr, A(1) / static_cast<A>(n), eps, rstd);
  });
}

// rms_norm_rows_plain_kernel where it applies (16-byte vectors, not float64,
// a row of up to 32 floats per thread); false where it does not, *err set
// where it does.
template <typename T>
bool forward_plain(T* x, const T* w, int64_t rows, int64_t n, acc_t<T> eps, acc_t<T>* rstd, cudaStream_t stream,
                   cudaError_t* err) {
  if constexpr (sizeof(T) == 8) {
    return false;
  } else {
    constexpr int VEC = 16 / sizeof(T);
    constexpr int kMaxNv = 32 / kFloatsPerVector<T>;
    int tpr = 0, nv = 0;
    if (!on_chip_plan(n / VEC, kMaxNv, 2, 2, &tpr, &nv)) return false;
    return with_vectors<kMaxNv>(nv, [&](auto nv_tag) {
      const int block = tpr > 32 ? tpr : kSmallBlock;  // above a warp: one row per CTA
      *err = launch_chunks(rows, block / tpr, [&](int64_t row0, unsigned grid) {
        rms_norm_rows_plain_kernel<T, decltype(nv_tag)::value><<<grid, block, 0, stream>>>(
            x, w, row0, rows, static_cast<int>(n), tpr, 1.0f / static_cast<float>(n), eps, rstd);
      });
    });
  }
}

template <typename T, int VEC>
cudaError_t forward_vec(T* x, const T* w, int64_t rows, int64_t n, acc_t<T> eps, acc_t<T>* rstd,
                        cudaStream_t stream) {
  using A = acc_t<T>;
  if constexpr (VEC > 1) {  // VEC == 1: rows not 16-byte aligned, never staged
    cudaError_t err = cudaSuccess;
    if (forward_plain<T>(x, w, rows, n, eps, rstd, stream, &err)) return err;
    if constexpr (sizeof(T) < 8) {
      staged::Plan plan;
      if (staged::plan_norm_rows(n, sizeof(T), true, &plan)) {
        const auto launch = [&](auto has_w) {
          return staged::launch_persistent(rms_norm_staged_kernel<T, decltype(has_w)::value>, plan, rows,
                                           stream, x, w, rows, n, 1.0f / static_cast<float>(n), eps, rstd, plan);
        };
        return w != nullptr ? launch(std::true_type{}) : launch(std::false_type{});
      }
    }
  }
  int tpr = 0, nv = 0;
  if (on_chip_plan((n + VEC - 1) / VEC, max_vectors_per_thread<T>(), 1,
                   max_vectors_per_thread<T>(), &tpr, &nv)) {
    switch (nv) {
      case 1: return launch_rows<T, VEC, 1>(x, w, rows, n, tpr, eps, rstd, stream);
      case 2: return launch_rows<T, VEC, 2>(x, w, rows, n, tpr, eps, rstd, stream);
      case 4: return launch_rows<T, VEC, 4>(x, w, rows, n, tpr, eps, rstd, stream);
      case 8: return launch_rows<T, VEC, 8>(x, w, rows, n, tpr, eps, rstd, stream);
      case 16:
        if constexpr (max_vectors_per_thread<T>() >= 16) {
          return launch_rows<T, VEC, 16>(x, w, rows, n, tpr, eps, rstd, stream);
        }
        break;
    }
    return cudaErrorInvalidValue;  // on_chip_plan never returns nv above the maximum
  }
  return launch_chunks(rows, 1, [&](int64_t row0, unsigned grid) {
    rms_norm_long_kernel<T, VEC><<<grid, kLongThreads, 0, stream>>>(x, w, row0, n, A(1) / static_cast<A>(n), eps, rstd);
  });
}

// Row chunks for the column sums: enough CTAs to fill the GPU, within gridDim.y's limit.
inline int64_t column_chunks(int64_t rows, int64_t n) {
  const int64_t tiles = (n + kColTile - 1) / kColTile;
  const int64_t want = (kTargetBlocks + tiles - 1) / tiles;
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(65535, (rows + kColRows - 1) / kColRows));
  return std::max<int64_t>(1, std::min(want, most));
}

template <typename T, int VEC>
cudaError_t backward_rows(const T* dy, const T* y, const T* w, const acc_t<T>* rstd, int64_t rows,
                          int64_t n, T* dx, cudaStream_t stream) {
  const int64_t nvec = (n + VEC - 1) / VEC;
  const int tpr = std::min(512, pow2_at_least((nvec + 3) / 4));
  const int block = tpr > 32 ? tpr : kSmallBlock;  // above a warp: one row per CTA
  return launch_chunks(rows, block / tpr, [&](int64_t row0, unsigned grid) {
    rms_norm_backward_rows_kernel<T, VEC><<<grid, block, 0, stream>>>(dy, y, w, rstd, row0, rows, n, tpr, dx);
  });
}

template <typename T>
cudaError_t backward(const T* dy, const T* y, const T* w, const acc_t<T>* rstd, int64_t rows,
                     int64_t n, T* dx, T* dw, acc_t<T>* workspace, cudaStream_t stream) {
  if (dx != nullptr) {
    constexpr int VEC = 16 / sizeof(T);
    const bool vec = n % VEC == 0 && aligned16(dy) && aligned16(y) && aligned16(w) && aligned16(dx);
    const cudaError_t err = vec ? backward_rows<T, VEC>(dy, y, w, rstd, rows, n, dx, stream)
                                : backward_rows<T, 1>(dy, y, w, rstd, rows, n, dx, stream);
    if (err != cudaSuccess) return err;
  }
  if (dw == nullptr) return cudaSuccess;
  const int64_t chunks = column_chunks(rows, n);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const dim3 grid(static_cast<unsigned>((n + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  rms_norm_columns_kernel<T><<<grid, kColTile * kColRows, 0, stream>>>(dy, y, w, rows, n, rows_per_chunk, workspace);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  rms_norm_columns_final_kernel<T><<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(workspace, chunks, n, dw);
  return cudaGetLastError();
}

}  // namespace

cudaError_t rms_norm_forward_cuda(ScalarKind kind, void* x, const void* weight, int64_t rows,
                                  int64_t n, double eps, void* rstd, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    constexpr int VEC = 16 / sizeof(T);
    T* xp = static_cast<T*>(x);
    const T* w = static_cast<const T*>(weight);
    A* rp = static_cast<A*>(rstd);
    const bool vec = n % VEC == 0 && aligned16(xp) && aligned16(w);
    err = vec ? forward_vec<T, VEC>(xp, w, rows, n, static_cast<A>(eps), rp, stream)
              : forward_vec<T, 1>(xp, w, rows, n, static_cast<A>(eps), rp, stream);
  });
  return err;
}

int64_t rms_norm_backward_cuda_workspace(ScalarKind kind, int64_t rows, int64_t n, bool weight) {
  if (!weight || rows == 0 || n == 0) return 0;
  const int64_t acc_size = kind == ScalarKind::kFloat64 ? 8 : 4;
  return column_chunks(rows, n) * n * acc_size;
}

cudaError_t rms_norm_backward_cuda(ScalarKind kind, const void* grad_output, const void* y,
                                   const void* weight, const void* rstd, int64_t rows, int64_t n,
                                   void* grad_input, void* grad_weight, void* workspace,
                                   cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    err = backward<T>(static_cast<const T*>(grad_output), static_cast<const T*>(y),
                      static_cast<const T*>(weight), static_cast<const A*>(rstd), rows, n,
                      static_cast<T*>(grad_input), static_cast<T*>(grad_weight),
                      static_cast<A*>(workspace), stream);
  });
  return err;
}

}  // namespace make_inplace::kernels
