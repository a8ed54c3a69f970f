#pragma once
// Few-instruction element handling for the row-wise kernels' fast paths.
//
// Why: the general on-chip softmax and layer norm kernels were issue-bound
// (docs/rowwise_tuning.md): each element went through a bounds test, a conversion per pass, a
// four-instruction NaN-aware max and two exponentials. Here a 16-byte vector
// of 16-bit values is handled as 32-bit pairs: the row max is a packed
// max.NaN over raw pairs (no conversion), a pair converts to two floats in
// two integer instructions (bf16) or two cvt (fp16), and two floats pack back
// in one cvt.rn.*x2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "make_inplace/kernels/rowwise_cuda.cuh"

namespace make_inplace::kernels::rowwise {

// 16 bytes as four 32-bit words.
struct Words {
  uint32_t w[4];
};

// Takes v by value: a reference bound to global memory lowered the copy to
// sixteen byte loads.
template <typename V>
__device__ __forceinline__ Words as_words(const V v) {
  static_assert(sizeof(V) == 16, "16-byte vectors only");
  Words out;
  memcpy(&out, &v, 16);
  return out;
}

template <typename V>
__device__ __forceinline__ V from_words(const Words& words) {
  V out;
  memcpy(&out, &words, 16);
  return out;
}

// The two floats of a pair of 16-bit values (element 0 in the low half).
__device__ __forceinline__ void unpack_pair(__nv_bfloat16, uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack_pair(__half, uint32_t w, float& lo, float& hi) {
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;\n}"
      : "=f"(lo), "=f"(hi)
      : "r"(w));
}

// Two floats rounded to nearest-even into a pair (lo in the low half).
__device__ __forceinline__ uint32_t pack_pair(__nv_bfloat16, float lo, float hi) {
  uint32_t w;
  asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(w) : "f"(lo), "f"(hi));
  return w;
}
__device__ __forceinline__ uint32_t pack_pair(__half, float lo, float hi) {
  uint32_t w;
  asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(w) : "f"(lo), "f"(hi));
  return w;
}

// NaN-propagating max of two pairs, lane by lane (sm_80+).
__device__ __forceinline__ uint32_t max_pair(__nv_bfloat16, uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t max_pair(__half, uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ float max_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

// 2^v, approximate (2 ulp), subnormal results flushed to zero: the
// exponential __expf also compiles to.
__device__ __forceinline__ float exp2_approx(float v) {
  float d;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(d) : "f"(v));
  return d;
}

// Running NaN-propagating max over 16-byte vectors of T, kept packed for
// 16-bit types until the end.
template <typename T>
struct VectorMax {
  static constexpr bool kPacked = sizeof(T) == 2;
  uint32_t pair = std::is_same_v<T, __half> ? 0xfc00fc00u : 0xff80ff80u;  // (-inf, -inf)
  float value = -std::numeric_limits<float>::infinity();

  template <typename V>
  __device__ __forceinline__ void add(const V& v) {
    if constexpr (kPacked) {
      const Words q = as_words(v);
      pair = max_pair(T{}, pair, max_pair(T{}, max_pair(T{}, q.w[0], q.w[1]),
                                          max_pair(T{}, q.w[2], q.w[3])));
    } else {
      const Words q = as_words(v);
#pragma unroll
      for (int e = 0; e < 4; ++e) value = max_nan(value, __uint_as_float(q.w[e]));
    }
  }

  __device__ __forceinline__ float result() const {
    if constexpr (kPacked) {
      float lo, hi;
      unpack_pair(T{}, pair, lo, hi);
      return max_nan(lo, hi);
    } else {
      return value;
    }
  }
};

// The 2 * 4 (16-bit T) or 4 (float) floats of a 16-byte vector.
template <typename T>
constexpr int kFloatsPerVector = 16 / sizeof(T);

template <typename T, typename V>
__device__ __forceinline__ void unpack_vector(const V v, float* out) {
  const Words q = as_words(v);
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int e = 0; e < 4; ++e) unpack_pair(T{}, q.w[e], out[2 * e], out[2 * e + 1]);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) out[e] = __uint_as_float(q.w[e]);
  }
}

// Element 0 of a 16-byte vector of T, as a float.
template <typename T, typename V>
__device__ __forceinline__ float first_float(const V v) {
  const Words q = as_words(v);
  if constexpr (sizeof(T) == 2) {
    float lo, hi;
    unpack_pair(T{}, q.w[0], lo, hi);
    return lo;
  } else {
    return __uint_as_float(q.w[0]);
  }
}

template <typename T, typename V>
__device__ __forceinline__ V pack_vector(const float* in) {
  Words q;
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int e = 0; e < 4; ++e) q.w[e] = pack_pair(T{}, in[2 * e], in[2 * e + 1]);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) q.w[e] = __float_as_uint(in[e]);
  }
  return from_words<V>(q);
}

// Calls f(std::integral_constant<int, NV>{}) for the on_chip_plan result
// nv (a power of two up to kMaxNv), so each fast path instantiates its
// kernel once per NV; false for any other nv.
template <int kMaxNv, typename F>
bool with_vectors(int nv, F&& f) {
  switch (nv) {
    case 1: f(std::integral_constant<int, 1>{}); return true;
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 4: f(std::integral_constant<int, 4>{}); return true;
    case 8:
      if constexpr (kMaxNv >= 8) {
        f(std::integral_constant<int, 8>{});
        return true;
      }
      break;
  }
  return false;
}

}  // namespace make_inplace::kernels::rowwise
