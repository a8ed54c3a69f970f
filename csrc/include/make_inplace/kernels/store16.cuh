#pragma once
// One 16-byte global store of a 16-byte struct (a vector of 2-8 elements).
//
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

}  // namespace make_inplace::kernels
