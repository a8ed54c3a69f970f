#pragma once
// Float vectors for the CPU kernels: VecAvx512 (16 lanes), VecAvx2 (8 lanes)
// and VecPortable (1 lane, plain C++). The kernels are templates over one of
// them; every element type (float, c10::Half, c10::BFloat16) is loaded into
// and stored from float lanes, so half types compute in float32. The x86
// members carry their target attribute and are inlined into the entry
// functions of cpu_isa.h, never called from code built for another target.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_isa.h"

#if MAKE_INPLACE_CPU_X86
// GCC 12 flags the _mm512_undefined_* placeholders inside its own reduction
// intrinsics as maybe-uninitialized (GCC bug 105593): silenced for this header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
// Vectors passed by value between the kernels' lambdas are inlined away; GCC's
// note that 64-byte vector arguments changed ABI in GCC 4.6 does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace make_inplace::kernels::cpu {

// exp(x) by 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2 (Cephes expf: within
// 2 ulp). Below ln(FLT_MIN) it returns 0 (no subnormal results); above
// 88.376 (where 2^n would overflow) +inf; NaN stays NaN.
namespace exp_const {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kMin = -87.3365447504f;  // ln(FLT_MIN)
constexpr float kMax = 88.3762626647949f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
}  // namespace exp_const

struct VecPortable {
  static constexpr int kWidth = 1;
  float v;

  static VecPortable broadcast(float a) { return {a}; }
  template <typename T>
  static VecPortable load(const T* p) {
    return {static_cast<float>(*p)};
  }
  template <typename T>
  static VecPortable load(const T* p, int64_t count, float fill) {
    return {count > 0 ? static_cast<float>(*p) : fill};
  }
  // Lanes at or past `count` replaced by `fill`.
  static VecPortable tail(VecPortable a, int64_t count, float fill) { return {count > 0 ? a.v : fill}; }
  template <typename T>
  void store(T* p) const {
    *p = static_cast<T>(v);
  }
  template <typename T>
  void store(T* p, int64_t count) const {
    if (count > 0) *p = static_cast<T>(v);
  }
  friend VecPortable operator+(VecPortable a, VecPortable b) { return {a.v + b.v}; }
  friend VecPortable operator-(VecPortable a, VecPortable b) { return {a.v - b.v}; }
  friend VecPortable operator*(VecPortable a, VecPortable b) { return {a.v * b.v}; }
  friend VecPortable operator/(VecPortable a, VecPortable b) { return {a.v / b.v}; }
  static VecPortable fma(VecPortable a, VecPortable b, VecPortable c) { return {a.v * b.v + c.v}; }
  static VecPortable max(VecPortable a, VecPortable b) { return {b.v > a.v || b.v != b.v ? b.v : a.v}; }
  float sum() const { return v; }
  float max_lane() const { return v; }
  static void transpose(VecPortable (&)[kWidth]) {}
  VecPortable exp() const {
    if (v < exp_const::kMin) return {0.f};
    return {std::exp(v)};
  }
};

#if MAKE_INPLACE_CPU_X86

struct VecAvx2 {
  static constexpr int kWidth = 8;
  __m256 v;

  MAKE_INPLACE_TARGET_AVX2 static VecAvx2 broadcast(float a) { return {_mm256_set1_ps(a)}; }
  MAKE_INPLACE_TARGET_AVX2 static VecAvx2 load(const float* p) { return {_mm256_loadu_ps(p)}; }
  MAKE_INPLACE_TARGET_AVX2 static VecAvx2 load(const c10::Half* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
  }
  MAKE_INPLACE_TARGET_AVX2 static VecAvx2 load(const c10::BFloat16* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
  }
  // The first `count` (0..8) elements; lanes past them hold `fill`.
  template <typename T>
  MAKE_INPLACE_TARGET_AVX2 static VecAvx2 load(const T* p, int64_t count, float fill) {
    T tmp[kWidth];
    std::memset(static_cast<void*>(tmp), 0, sizeof(tmp));
    std::memcpy(static_cast<void*>(tmp), p, static_cast<size_t>(count) * sizeof(T));
    return tail(load(tmp), count, fill);
  }
  MAKE_INPLACE_TARGET_AVX2 static VecAvx2 tail(VecAvx2 a, int64_t count, float fill) {
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 keep = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(count)), _CMP_LT_OQ);
    return {_mm256_blendv_ps(_mm256_set1_ps(fill), a.v, keep)};
  }
  MAKE_INPLACE_TARGET_AVX2 void store(float* p) const { _mm256_storeu_ps(p, v); }
  MAKE_INPLACE_TARGET_AVX2 void store(c10::Half* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  MAKE_INPLACE_TARGET_AVX2 void store(c10::BFloat16* p) const {
    // Round to nearest even, NaN to 0x7FC0: c10::BFloat16's rounding.
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  template <typename T>
  MAKE_INPLACE_TARGET_AVX2 void store(T* p, int64_t count) const {
    T tmp[kWidth];
    store(tmp);
    std::memcpy(static_cast<void*>(p), tmp, static_cast<size_t>(count) * sizeof(T));
  }
  MAKE_INPLACE_TARGET_AVX2 friend VecAvx2 operator+(VecAvx2 a, VecAvx2 b) { return {_mm256_add_ps(a.v, b.v)}; }
  MAKE_INPLACE_TARGET_AVX2 friend VecAvx2 operator-(VecAvx2 a, VecAvx2 b) { return {_mm256_sub_ps(a.v, b.v)}; }
  MAKE_INPLACE_TARGET_AVX2 friend VecAvx2 operator*(VecAvx2 a, VecAvx2 b) { return {_mm256_mul_ps(a.v, b.v)}; }
  MAKE_INPLACE_TARGET_AVX2 friend VecAvx2 operator/(VecAvx2 a, VecAvx2 b) { return {_mm256_div_ps(a.v, b.v)}; }
  MAKE_INPLACE_TARGET_AVX2 static VecAvx2 fma(VecAvx2 a, VecAvx2 b, VecAvx2 c) {
    return {_mm256_fmadd_ps(a.v, b.v, c.v)};
  }
  MAKE_INPLACE_TARGET_AVX2 static VecAvx2 max(VecAvx2 a, VecAvx2 b) { return {_mm256_max_ps(a.v, b.v)}; }
  MAKE_INPLACE_TARGET_AVX2 float sum() const {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  MAKE_INPLACE_TARGET_AVX2 float max_lane() const {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // rows[i][j] <-> rows[j][i].
  MAKE_INPLACE_TARGET_AVX2 static void transpose(VecAvx2 (&rows)[kWidth]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(rows[2 * i].v, rows[2 * i + 1].v);
      t[2 * i + 1] = _mm256_unpackhi_ps(rows[2 * i].v, rows[2 * i + 1].v);
    }
    // u[4 * i + c], 128-bit lane L: column 4 L + c of rows 4 i .. 4 i + 3.
    for (int i = 0; i < 2; ++i) {
      u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; ++c) {
      rows[c].v = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      rows[4 + c].v = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
  MAKE_INPLACE_TARGET_AVX2 VecAvx2 exp() const {
    using namespace exp_const;
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), v);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
    __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(kP0), r, _mm256_set1_ps(kP1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP5));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 out = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    out = _mm256_blendv_ps(out, _mm256_setzero_ps(), _mm256_cmp_ps(v, _mm256_set1_ps(kMin), _CMP_LT_OQ));
    out = _mm256_blendv_ps(out, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(v, _mm256_set1_ps(kMax), _CMP_GT_OQ));
    return {out};
  }
};

struct VecAvx512 {
  static constexpr int kWidth = 16;
  __m512 v;

  MAKE_INPLACE_TARGET_AVX512 static __mmask16 first(int64_t count) {
    return static_cast<__mmask16>((1u << count) - 1u);
  }
  MAKE_INPLACE_TARGET_AVX512 static __m512 widen(__m256i halfs, c10::Half*) { return _mm512_cvtph_ps(halfs); }
  MAKE_INPLACE_TARGET_AVX512 static __m512 widen(__m256i halfs, c10::BFloat16*) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halfs), 16));
  }
  MAKE_INPLACE_TARGET_AVX512 static __m256i narrow(__m512 f, c10::Half*) {
    return _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  MAKE_INPLACE_TARGET_AVX512 static __m256i narrow(__m512 f, c10::BFloat16*) {
    // Round to nearest even, NaN to 0x7FC0: c10::BFloat16's rounding.
    const __m512i u = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    return _mm512_cvtepi32_epi16(r);
  }

  MAKE_INPLACE_TARGET_AVX512 static VecAvx512 broadcast(float a) { return {_mm512_set1_ps(a)}; }
  MAKE_INPLACE_TARGET_AVX512 static VecAvx512 load(const float* p) { return {_mm512_loadu_ps(p)}; }
  template <typename T>
  MAKE_INPLACE_TARGET_AVX512 static VecAvx512 load(const T* p) {
    return {widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), static_cast<T*>(nullptr))};
  }
  // The first `count` (0..16) elements; lanes past them hold `fill`. Masked
  // loads never touch memory past the count.
  MAKE_INPLACE_TARGET_AVX512 static VecAvx512 load(const float* p, int64_t count, float fill) {
    return {_mm512_mask_loadu_ps(_mm512_set1_ps(fill), first(count), p)};
  }
  template <typename T>
  MAKE_INPLACE_TARGET_AVX512 static VecAvx512 load(const T* p, int64_t count, float fill) {
    const __mmask16 m = first(count);
    const __m512 f = widen(_mm256_maskz_loadu_epi16(m, p), static_cast<T*>(nullptr));
    return {_mm512_mask_blend_ps(m, _mm512_set1_ps(fill), f)};
  }
  MAKE_INPLACE_TARGET_AVX512 static VecAvx512 tail(VecAvx512 a, int64_t count, float fill) {
    return {_mm512_mask_blend_ps(first(count), _mm512_set1_ps(fill), a.v)};
  }
  MAKE_INPLACE_TARGET_AVX512 void store(float* p) const { _mm512_storeu_ps(p, v); }
  template <typename T>
  MAKE_INPLACE_TARGET_AVX512 void store(T* p) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v, static_cast<T*>(nullptr)));
  }
  MAKE_INPLACE_TARGET_AVX512 void store(float* p, int64_t count) const { _mm512_mask_storeu_ps(p, first(count), v); }
  template <typename T>
  MAKE_INPLACE_TARGET_AVX512 void store(T* p, int64_t count) const {
    _mm256_mask_storeu_epi16(p, first(count), narrow(v, static_cast<T*>(nullptr)));
  }
  MAKE_INPLACE_TARGET_AVX512 friend VecAvx512 operator+(VecAvx512 a, VecAvx512 b) { return {_mm512_add_ps(a.v, b.v)}; }
  MAKE_INPLACE_TARGET_AVX512 friend VecAvx512 operator-(VecAvx512 a, VecAvx512 b) { return {_mm512_sub_ps(a.v, b.v)}; }
  MAKE_INPLACE_TARGET_AVX512 friend VecAvx512 operator*(VecAvx512 a, VecAvx512 b) { return {_mm512_mul_ps(a.v, b.v)}; }
  MAKE_INPLACE_TARGET_AVX512 friend VecAvx512 operator/(VecAvx512 a, VecAvx512 b) { return {_mm512_div_ps(a.v, b.v)}; }
  MAKE_INPLACE_TARGET_AVX512 static VecAvx512 fma(VecAvx512 a, VecAvx512 b, VecAvx512 c) {
    return {_mm512_fmadd_ps(a.v, b.v, c.v)};
  }
  MAKE_INPLACE_TARGET_AVX512 static VecAvx512 max(VecAvx512 a, VecAvx512 b) { return {_mm512_max_ps(a.v, b.v)}; }
  MAKE_INPLACE_TARGET_AVX512 float sum() const { return _mm512_reduce_add_ps(v); }
  MAKE_INPLACE_TARGET_AVX512 float max_lane() const { return _mm512_reduce_max_ps(v); }
  // rows[i][j] <-> rows[j][i].
  MAKE_INPLACE_TARGET_AVX512 static void transpose(VecAvx512 (&rows)[kWidth]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(rows[2 * i].v, rows[2 * i + 1].v);
      t[2 * i + 1] = _mm512_unpackhi_ps(rows[2 * i].v, rows[2 * i + 1].v);
    }
    // u[4 * i + c], 128-bit lane L: column 4 L + c of rows 4 i .. 4 i + 3.
    for (int i = 0; i < 4; ++i) {
      u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    // Row 4 L + c of the result takes lane L of u[c], u[4 + c], u[8 + c], u[12 + c].
    for (int c = 0; c < 4; ++c) {
      const __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
      const __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
      const __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
      const __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
      rows[c].v = _mm512_shuffle_f32x4(v0, v2, 0x88);
      rows[4 + c].v = _mm512_shuffle_f32x4(v0, v2, 0xDD);
      rows[8 + c].v = _mm512_shuffle_f32x4(v1, v3, 0x88);
      rows[12 + c].v = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
  }
  MAKE_INPLACE_TARGET_AVX512 VecAvx512 exp() const {
    using namespace exp_const;
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), v);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
    __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(kP0), r, _mm512_set1_ps(kP1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP5));
    y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 out = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    out = _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(v, _mm512_set1_ps(kMin), _CMP_LT_OQ), _mm512_setzero_ps());
    out = _mm512_mask_mov_ps(out, _mm512_cmp_ps_mask(v, _mm512_set1_ps(kMax), _CMP_GT_OQ), _mm512_set1_ps(INFINITY));
    return {out};
  }
};

#endif  // MAKE_INPLACE_CPU_X86

// count (<= V::kWidth) elements p[0], p[stride], p[2 * stride], ... in the
// first lanes, 0 in the rest: a gather for strided operands.
template <typename V, typename T>
V load_strided(const T* p, int64_t stride, int64_t count) {
  float tmp[V::kWidth] = {};
  for (int64_t l = 0; l < count; ++l) tmp[l] = static_cast<float>(p[l * stride]);
  return V::load(static_cast<const float*>(tmp));
}

// Runs K::template run<V>(args...) with V the widest vector this CPU runs
// (cpu_isa()); each instantiation is one function compiled for its target with
// everything it calls inlined. Call it per chunk of rows, inside the
// parallel-for: the chunk body is then a direct call, not through a pointer.
template <typename K, typename... A>
void run_portable(A... args) {
  K::template run<VecPortable>(args...);
}
#if MAKE_INPLACE_CPU_X86
template <typename K, typename... A>
MAKE_INPLACE_TARGET_AVX2 MAKE_INPLACE_FLATTEN void run_avx2(A... args) {
  K::template run<VecAvx2>(args...);
}
template <typename K, typename... A>
MAKE_INPLACE_TARGET_AVX512 MAKE_INPLACE_FLATTEN void run_avx512(A... args) {
  K::template run<VecAvx512>(args...);
}
#endif

template <typename K, typename... A>
void run_best(A... args) {
#if MAKE_INPLACE_CPU_X86
  switch (cpu_isa()) {
    case CpuIsa::kAvx512: return run_avx512<K>(args...);
    case CpuIsa::kAvx2: return run_avx2<K>(args...);
    case CpuIsa::kPortable: break;
  }
#endif
  run_portable<K>(args...);
}

}  // namespace make_inplace::kernels::cpu
