#pragma once
// Device helpers shared by the row-wise CUDA kernels (softmax, layer norm):
// element conversion to the accumulation type, 16-byte vectors, NaN-aware max
// and reductions over a group of `tpr` threads that own one row (a sub-warp,
// a warp, or a whole CTA).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

#include "make_inplace/kernels/scalar_kind.h"
#include "make_inplace/kernels/global16.cuh"

namespace make_inplace::kernels::rowwise {

template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }

// The same conversion, but opaque to the compiler (volatile asm), for kernels
// that keep a row of 16-bit values in registers and convert them again in each
// pass: with plain conversions the compiler merges the passes' conversions and
// keeps a float copy of the whole row live, doubling the registers and spilling.
__device__ __forceinline__ float to_acc_fresh(__half v) {
  float out;
  asm volatile("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(__half_as_ushort(v)));
  return out;
}
__device__ __forceinline__ float to_acc_fresh(__nv_bfloat16 v) {
  unsigned int out;
  asm volatile("shl.b32 %0, %1, 16;" : "=r"(out) : "r"(static_cast<unsigned int>(__bfloat16_as_ushort(v))));
  return __uint_as_float(out);
}
__device__ __forceinline__ float to_acc_fresh(float v) { return v; }
__device__ __forceinline__ double to_acc_fresh(double v) { return v; }

// A read-only global load the compiler may not merge with an earlier one of
// the same address (same reason as to_acc_fresh: no row-sized float copy).
__device__ __forceinline__ float load_acc_fresh(const __half* p) {
  unsigned short bits;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(bits) : "l"(p));
  return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ float load_acc_fresh(const __nv_bfloat16* p) {
  unsigned short bits;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(bits) : "l"(p));
  return __uint_as_float(static_cast<unsigned int>(bits) << 16);
}
__device__ __forceinline__ float load_acc_fresh(const float* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ double load_acc_fresh(const double* p) {
  double v;
  asm volatile("ld.global.nc.f64 %0, [%1];" : "=d"(v) : "l"(p));
  return v;
}

// Vectors per thread the on-chip kernels may hold: 16 (64 registers of row
// data) except for float64, where 16 vectors of 2 doubles would spill.
template <typename T>
constexpr int max_vectors_per_thread() {
  return sizeof(T) == 8 ? 8 : 16;
}

template <typename T>
__device__ __forceinline__ T from_acc(acc_t<T> v);
template <>
__device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <>
__device__ __forceinline__ double from_acc<double>(double v) { return v; }

// a * b rounded on its own, never contracted into an FMA with what follows: a
// row's passes then compute bit-identical values, so the max element gives
// exp(v - max) = exp(0) = 1 exactly (a pass computing fma(x, scale, -max)
// left exp(rounding error), off by up to 2e-6 in float, 10x that in gradients).
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

__device__ __forceinline__ float fast_exp(float v) { return __expf(v); }
__device__ __forceinline__ double fast_exp(double v) { return exp(v); }
__device__ __forceinline__ float rsqrt_acc(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_acc(double v) { return rsqrt(v); }

template <typename T>
__device__ __forceinline__ acc_t<T> neg_inf() {
  return -std::numeric_limits<acc_t<T>>::infinity();
}

// VEC elements moved as one 16-byte (or narrower, VEC == 1) access.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// Asks for `bytes` at p (16-byte aligned, a multiple of 16) to be brought
// into L2 by a bulk prefetch (sm_90); nothing on older GPUs.
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// CTAs of `kernel` resident at once on the current device with `block`
// threads and `smem` dynamic shared bytes each, into *ctas. The answer is
// fixed per (kernel, device, block, smem), so the runtime is asked once and
// the answer kept: the queries would otherwise cost host time every launch.
template <typename... Params>
cudaError_t resident_ctas(void (*kernel)(Params...), int block, int smem, int64_t* ctas) {
  struct Known {
    const void* kernel;
    int device, block, smem;
    int64_t ctas;
  };
  static std::mutex mutex;
  static std::vector<Known> known;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const void* key = reinterpret_cast<const void*>(kernel);
  const std::lock_guard<std::mutex> lock(mutex);
  for (const Known& k : known) {
    if (k.kernel == key && k.device == device && k.block == block && k.smem == smem) {
      *ctas = k.ctas;
      return cudaSuccess;
    }
  }
  int sms = 0, per_sm = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, smem);
  }
  if (err != cudaSuccess) return err;
  *ctas = static_cast<int64_t>(sms) * per_sm;
  known.push_back({key, device, block, smem, *ctas});
  return cudaSuccess;
}

// Stores a vector of VEC elements; 16-byte ones as one st.global.v4 (global16.cuh).
template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, VEC>& v) {
  if constexpr (sizeof(T) * VEC == 16) {
    store_global_16(p, v);
  } else {
    *reinterpret_cast<Vec<T, VEC>*>(p) = v;
  }
}

// max that propagates NaN, so a row holding NaN becomes NaN as in torch.
template <typename A>
__device__ __forceinline__ A nan_max(A a, A b) {
  return (b > a || b != b) ? b : a;
}

struct SumOp {
  template <typename A>
  __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};
struct MaxOp {
  template <typename A>
  __device__ __forceinline__ A operator()(A a, A b) const { return nan_max(a, b); }
};

template <typename A, typename Op>
__device__ __forceinline__ A warp_reduce(A v, int width, Op op) {
  // xor partners stay inside aligned groups of `width` lanes.
  for (int offset = width / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Reduces v over the `tpr` threads owning one row; every thread of the CTA
// must call it (rows past the end pass the identity). tpr <= 32 reduces with
// shuffles inside a warp; tpr > 32 means one row per CTA (blockDim.x == tpr)
// and goes through `scratch` (>= 32 entries). Every thread gets the result.
template <typename A, typename Op>
__device__ __forceinline__ A group_reduce(A v, int tpr, A identity, A* scratch, Op op) {
  if (tpr <= 32) return warp_reduce(v, tpr, op);
  v = warp_reduce(v, 32, op);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < tpr / 32 ? scratch[lane] : identity;
  v = warp_reduce(v, 32, op);
  __syncthreads();  // scratch is free for the next reduction
  return v;
}

// The row one thread of an on-chip kernel works on: `tpr` threads per row,
// blockDim.x / tpr rows per CTA, counted from row0. A thread past the last
// row is inactive: it touches no column (end == 0) but still takes part in
// its group's reductions.
struct OnChipRow {
  int lane;  // the thread's place among its row's tpr threads
  int64_t row;
  bool active;
  int end;  // columns to touch: n, or 0 when inactive
};

// tpr is a power of two (on_chip_plan): shifts, where a division by a value
// known only at run time took about 40 instructions a thread.
__device__ __forceinline__ OnChipRow on_chip_row(int64_t row0, int64_t rows, int n, int tpr) {
  const int log2_tpr = __ffs(tpr) - 1;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = row0 + (thread >> log2_tpr);
  const bool active = row < rows;
  return {static_cast<int>(threadIdx.x & (tpr - 1)), row, active, active ? n : 0};
}

// Two sums over the `tpr` threads owning one row in one pass: the shuffles
// interleave and a CTA-wide reduction (tpr > 32) needs one round of
// `scratch` (>= 64 entries) and two barriers instead of four.
__device__ __forceinline__ void group_sum2(float& a, float& b, int tpr, float* scratch) {
  const int width = tpr < 32 ? tpr : 32;
  for (int offset = width / 2; offset > 0; offset /= 2) {
    a += __shfl_xor_sync(0xffffffffu, a, offset);
    b += __shfl_xor_sync(0xffffffffu, b, offset);
  }
  if (tpr <= 32) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  a = lane < tpr / 32 ? scratch[lane] : 0.0f;
  b = lane < tpr / 32 ? scratch[32 + lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) {
    a += __shfl_xor_sync(0xffffffffu, a, offset);
    b += __shfl_xor_sync(0xffffffffu, b, offset);
  }
  __syncthreads();  // scratch is free for the next reduction
}

inline int pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

inline bool aligned16(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The CUDA element type behind a ScalarKind.
template <typename F>
void dispatch(ScalarKind kind, F&& f) {
  switch (kind) {
    case ScalarKind::kFloat16: f(__half{}); break;
    case ScalarKind::kBFloat16: f(__nv_bfloat16{}); break;
    case ScalarKind::kFloat32: f(float{}); break;
    case ScalarKind::kFloat64: f(double{}); break;
  }
}

// Threads on one row in the on-chip kernels (512 leaves each 128 registers),
// and the CTA size when several short rows share a CTA.
constexpr int kOnChipMaxThreads = 512;
constexpr int kSmallBlock = 128;

// Threads per row (tpr) and vectors per thread (nv, a power of two up to
// max_nv) for an on-chip kernel holding a row of nvec vectors in registers:
// short rows get a sub-warp or a warp (several rows per CTA) with about
// `short_vecs` vectors per thread, rows of up to 8 vectors a thread a warp
// (or, where the row fills 2, 4 or 8 warps of `warp_vecs` vectors a thread
// exactly, a CTA of those warps), longer ones a CTA with about 8 vectors in
// flight per thread. False when the row does not fit (the caller then streams
// it through global memory).
inline bool on_chip_plan(int64_t nvec, int max_nv, int short_vecs, int warp_vecs, int* tpr,
                         int* nv) {
  const int per_thread = max_nv < 8 ? max_nv : 8;
  if (short_vecs > per_thread) short_vecs = per_thread;
  if (nvec <= 32 * short_vecs) {
    *tpr = pow2_at_least((nvec + short_vecs - 1) / short_vecs);
    *nv = pow2_at_least((nvec + *tpr - 1) / *tpr);
  } else if (nvec <= 32 * per_thread) {
    // H200: 1024 columns 3-4% faster on such warps; rows that leave them
    // partly empty (768 columns) ran up to 10% slower (docs/rowwise_tuning.md).
    const int64_t warps = nvec / (32 * warp_vecs);
    if (warps > 1 && warps * 32 * warp_vecs == nvec && (warps & (warps - 1)) == 0) {
      *tpr = static_cast<int>(32 * warps);
      *nv = warp_vecs;
    } else {
      *tpr = 32;
      *nv = pow2_at_least((nvec + 31) / 32);
    }
  } else if (nvec <= static_cast<int64_t>(kOnChipMaxThreads) * per_thread) {
    *tpr = pow2_at_least((nvec + per_thread - 1) / per_thread);
    if (*tpr < kSmallBlock) *tpr = kSmallBlock;
    *nv = pow2_at_least((nvec + *tpr - 1) / *tpr);
  } else if (nvec <= static_cast<int64_t>(kOnChipMaxThreads) * max_nv) {
    *tpr = kOnChipMaxThreads;
    *nv = max_nv;
  } else {
    return false;
  }
  return true;
}

// Rows per launch capped so gridDim.x stays within CUDA's 2^31 - 1 limit; the
// kernels take a row offset and are launched repeatedly for more.
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;

// Calls launch(first_item, grid) for `items` items, `per_block` per CTA, in as
// many launches as keep gridDim.x within kMaxGridX; returns the first launch
// error.
template <typename Launch>
cudaError_t launch_chunks(int64_t items, int64_t per_block, Launch&& launch) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  for (int64_t b = 0; b < blocks; b += kMaxGridX) {
    launch(b * per_block, static_cast<unsigned>(blocks - b < kMaxGridX ? blocks - b : kMaxGridX));
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace make_inplace::kernels::rowwise
