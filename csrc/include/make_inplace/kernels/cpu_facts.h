#pragma once
// What the CPU routing policy knows of this CPU (read once per process).
#include <cstdint>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace make_inplace::kernels {

// One core's L2 cache in bytes, or 0 where the platform does not say.
inline int64_t cpu_l2_cache_bytes() {
  static const int64_t bytes = [] {
#if defined(__linux__) && defined(_SC_LEVEL2_CACHE_SIZE)
    const long size = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return size > 0 ? static_cast<int64_t>(size) : int64_t{0};
#else
    return int64_t{0};
#endif
  }();
  return bytes;
}

// Whether the CPU is Intel's: MKL, torch's CPU GEMM on x86, runs its widest
// kernels there only.
inline bool cpu_is_intel() {
#if defined(__GNUC__) && defined(__x86_64__)
  static const bool intel = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") != 0;
  }();
  return intel;
#else
  return false;
#endif
}

// Whether the CPU has bfloat16 dot products (AVX512-BF16; every CPU with AMX
// has them too), which torch's bfloat16 GEMM (oneDNN) runs on. Without them
// that GEMM converts in software and square_matmul_'s row kernel, converting
// to float32 lanes, is several times faster (docs/notes/cpu_kernels.md).
// True where it cannot tell (not x86-64): torch's GEMM, as before.
inline bool cpu_has_bf16_dot() {
#if defined(__GNUC__) && defined(__x86_64__)
  static const bool bf16 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return bf16;
#else
  return true;
#endif
}

// Whether the CPU has AMX tiles for bfloat16, which torch's bfloat16 GEMM
// (oneDNN) runs on; false where it cannot tell.
inline bool cpu_has_amx() {
#if defined(__GNUC__) && defined(__x86_64__)
  static const bool amx = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("amx-bf16") != 0;
  }();
  return amx;
#else
  return false;
#endif
}

// The L2 size square_matmul_'s CPU routing weighs, 0 for none. The L2 rule
// is for MKL at its best (Intel); elsewhere MKL runs narrower kernels and the
// row kernel keeps its lead past L2 (AMD Zen 5, 1 MiB L2: 1.45-1.72x
// torch.matmul at n = 768-1024; docs/notes/cpu_kernels.md).
inline int64_t cpu_l2_rule_bytes() { return cpu_is_intel() ? cpu_l2_cache_bytes() : 0; }

}  // namespace make_inplace::kernels
