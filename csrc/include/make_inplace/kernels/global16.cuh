#pragma once
// 16-byte global accesses in inline PTX: stores kept whole, and loads with an
// L2 cache policy.
//
// One 16-byte global store of a 16-byte struct (a vector of 2-8 elements).
// Why not a plain struct store: inside unrolled runtime loops nvcc splits it
// (and even a uint4 built from it) into per-element or per-pair stores
// (st.global.u16 x 8 for bf16), so each warp store touches up to 8x the
// sectors it writes. The inline PTX keeps it one st.global.v4.
#include <cstdint>
#include <cstring>

namespace make_inplace::kernels {

// kStreaming: st.global.cs (evict first), for outputs written once and not
// read again by the kernel, e.g. outer product's.
template <bool kStreaming = false, typename P>
__device__ __forceinline__ void store_global_16(void* p, const P& v) {
  static_assert(sizeof(P) == 16, "store_global_16 stores 16-byte vectors");
  uint32_t w[4];
  memcpy(w, &v, 16);
  if constexpr (kStreaming) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]),
                 "r"(w[2]), "r"(w[3])
                 : "memory");
  } else {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]),
                 "r"(w[2]), "r"(w[3])
                 : "memory");
  }
}

// One 16-byte global load. kKeepInL2: of a line the same thread stores again
// soon (a row rewritten in place), under an L2 evict_last policy, so that L2
// is asked to keep the line until that store replaces it (sm_80 and later).
template <bool kKeepInL2, typename P>
__device__ __forceinline__ P load_global_16(const void* p) {
  static_assert(sizeof(P) == 16, "load_global_16 loads 16-byte vectors");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kKeepInL2) {
    uint32_t w[4];
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "l"(p), "l"(policy));
    P v;
    memcpy(&v, w, 16);
    return v;
  }
#endif
  return *reinterpret_cast<const P*>(p);
}

}  // namespace make_inplace::kernels
