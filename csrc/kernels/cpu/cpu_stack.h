#pragma once
// How much stack the calling thread has left, for kernels that keep large
// buffers on the stack only where they fit (threads of other pools and
// runtimes may have small stacks).
#include <cstdint>

#if defined(__linux__) && defined(__GLIBC__)
#include <pthread.h>
#endif

namespace make_inplace::kernels::cpu {

// Bytes between this frame and the low end of the thread's stack; -1 where
// that is unknown. The stack's bounds are looked up once per thread (for the
// main thread glibc reads /proc/self/maps).
inline int64_t stack_room() {
#if defined(__linux__) && defined(__GLIBC__)
  thread_local const char* const low = [] {
    const char* bottom = nullptr;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* addr = nullptr;
      size_t size = 0;
      if (pthread_attr_getstack(&attr, &addr, &size) == 0) bottom = static_cast<const char*>(addr);
      pthread_attr_destroy(&attr);
    }
    return bottom;
  }();
  const char here = 0;
  const char* const sp = &here;
  if (low == nullptr) return -1;
  return sp > low ? static_cast<int64_t>(sp - low) : 0;
#else
  return -1;
#endif
}

}  // namespace make_inplace::kernels::cpu
