#pragma once
// Which vector instruction set the CPU kernels use, chosen once per process at
// run time, without compile flags: each kernel body is a template over a
// vector type (cpu_vec.h) and is compiled three times, into entry functions
// carrying the AVX-512 or AVX2 target attribute (with `flatten`, so the whole
// body is inlined and compiled for that target) and a portable one.
//
// The choice: the widest set the CPU and OS support, capped by torch's own
// ATEN_CPU_CAPABILITY variable when it is set ("default", "avx2", "avx512"),
// so one variable steers both libraries (and tests can reach every path).
#include <cstdlib>
#include <cstring>

#if defined(__GNUC__) && defined(__x86_64__)
#define MAKE_INPLACE_CPU_X86 1
#define MAKE_INPLACE_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define MAKE_INPLACE_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define MAKE_INPLACE_FLATTEN __attribute__((flatten))
#else
#define MAKE_INPLACE_CPU_X86 0
#define MAKE_INPLACE_FLATTEN
#endif

namespace make_inplace::kernels {

enum class CpuIsa : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

inline CpuIsa detect_cpu_isa() {
  CpuIsa best = CpuIsa::kPortable;
#if MAKE_INPLACE_CPU_X86
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wide registers.
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = CpuIsa::kAvx2;
  if (best == CpuIsa::kAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    best = CpuIsa::kAvx512;
  }
#endif
  if (const char* cap = std::getenv("ATEN_CPU_CAPABILITY")) {
    if (std::strcmp(cap, "default") == 0) return CpuIsa::kPortable;
    if (std::strcmp(cap, "avx2") == 0 && best > CpuIsa::kAvx2) return CpuIsa::kAvx2;
  }
  return best;
}

inline CpuIsa cpu_isa() {
  static const CpuIsa isa = detect_cpu_isa();
  return isa;
}

}  // namespace make_inplace::kernels
