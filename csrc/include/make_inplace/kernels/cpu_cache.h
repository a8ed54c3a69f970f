#pragma once
// The L2 cache of one CPU core, for the CPU routing policy (read once).
#include <cstdint>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace make_inplace::kernels {

// Bytes, or 0 where the platform does not say.
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

}  // namespace make_inplace::kernels
