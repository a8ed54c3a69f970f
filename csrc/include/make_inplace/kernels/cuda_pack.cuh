#pragma once
// Device helpers shared by the memory-bound CUDA kernels (trilinear,
// outer_product): accumulation types, 16-byte packs, launch sizing.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "make_inplace/kernels/packed_rows.cuh"
#include "make_inplace/kernels/scalar_kind.h"
#include "make_inplace/kernels/global16.cuh"

namespace make_inplace::kernels::cuda_detail {

// Half types accumulate in float32, float64 in float64.
template <typename T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <typename T> using acc_t = typename AccType<T>::type;

__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }

template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> x);
template <> __device__ __forceinline__ __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_acc<double>(double x) { return x; }

// V consecutive elements moved as one load/store (16 bytes when V = 16 / sizeof(T)).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T>
constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

// Loads V elements at p, p + stride, ...: one vector load when the caller has
// established contiguity and alignment (contiguous = true), else a gather.
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, int64_t stride, bool contiguous) {
  Pack<T, V> r;
  if (V > 1 && contiguous) {
    r = *reinterpret_cast<const Pack<T, V>*>(p);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) r.v[e] = p[e * stride];
  }
  return r;
}

// 16-byte packs go out as one st.global.v4 (global16.cuh says why);
// kStreaming makes it st.global.cs.
template <typename T, int V, bool kStreaming = false>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& x) {
  if constexpr (sizeof(T) * V == 16) {
    store_global_16<kStreaming>(p, x);
  } else {
    *reinterpret_cast<Pack<T, V>*>(p) = x;
  }
}

// The V elements of a pack in the accumulation type, and back. 16-byte packs
// of a 16-bit type go as word pairs (packed_rows.cuh): converted element by
// element, the outer product's bf16 backward held 80 registers where pairs
// need 64, and the trilinear forward loaded bf16 corners two at a time.
template <typename T, int V>
__device__ __forceinline__ void unpack(const Pack<T, V>& pack, acc_t<T>* out) {
  if constexpr (sizeof(T) == 2 && V * sizeof(T) == 16) {
    rowwise::unpack_vector<T>(pack, out);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) out[e] = to_acc(pack.v[e]);
  }
}

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> pack_from(const acc_t<T>* in) {
  if constexpr (sizeof(T) == 2 && V * sizeof(T) == 16) {
    return rowwise::pack_vector<T, Pack<T, V>>(in);
  } else {
    Pack<T, V> r;
#pragma unroll
    for (int e = 0; e < V; ++e) r.v[e] = from_acc<T>(in[e]);
    return r;
  }
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Streaming multiprocessors of the current device (132 if it cannot be read).
inline int sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms <= 0) {
    return 132;
  }
  return sms;
}

// Grid-stride launches are capped at a few resident waves of 256-thread
// blocks: enough to fill every SM, few enough that the grid never overflows.
inline int64_t grid_for(int64_t work_items, int64_t per_block) {
  const int64_t needed = (work_items + per_block - 1) / per_block;
  return std::max<int64_t>(1, std::min<int64_t>(needed, int64_t{sm_count()} * 8));
}

// Smallest power of two >= x, at most `cap` (a power of two), at least 1.
inline int pow2_at_least(int64_t x, int cap) {
  int p = 1;
  while (p < cap && p < x) p *= 2;
  return p;
}

// Runs fn(T{}) with the CUDA element type of `kind`.
template <typename Fn>
cudaError_t dispatch_kind(ScalarKind kind, Fn&& fn) {
  switch (kind) {
    case ScalarKind::kFloat16: return fn(__half{});
    case ScalarKind::kBFloat16: return fn(__nv_bfloat16{});
    case ScalarKind::kFloat32: return fn(float{});
    case ScalarKind::kFloat64: return fn(double{});
  }
  return cudaErrorInvalidValue;
}

// Sum over the `group` lanes (a power of two dividing 32) that share a
// segment of the warp; every lane of the warp must call it.
template <typename A>
__device__ __forceinline__ A group_sum(A x, int group) {
  for (int offset = group / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

}  // namespace make_inplace::kernels::cuda_detail
