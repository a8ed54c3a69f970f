// The registered parallel-for of the CPU kernels (see cpu_parallel.h) and the
// built-in one used when none is registered.
#include "make_inplace/kernels/cpu_parallel.h"

#include <algorithm>
#include <atomic>

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace make_inplace::kernels {
namespace {

// Built-in: one contiguous chunk per OpenMP thread, as many threads as
// omp_get_max_threads() allows and the grain warrants; serial inside an
// enclosing parallel region (no nested teams) or without OpenMP.
void builtin_parallel_for(int64_t n, int64_t grain, CpuRangeBody body, const void* ctx) {
#if defined(_OPENMP)
  const int64_t most = std::max<int64_t>(1, (n + grain - 1) / grain);
  const int64_t threads = std::min<int64_t>(omp_get_max_threads(), most);
  if (threads > 1 && !omp_in_parallel()) {
#pragma omp parallel num_threads(static_cast<int>(threads))
    {
      const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
      const int64_t chunk = (n + team - 1) / team;
      const int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
      if (begin < end) body(ctx, begin, end);
    }
    return;
  }
#endif
  body(ctx, 0, n);
}

std::atomic<CpuParallelFor> registered{nullptr};

}  // namespace

void set_cpu_parallel_for(CpuParallelFor parallel_for) { registered.store(parallel_for); }

void cpu_parallel_run(int64_t n, int64_t grain, CpuRangeBody body, const void* ctx) {
  const CpuParallelFor f = registered.load(std::memory_order_relaxed);
  (f ? f : builtin_parallel_for)(n, grain, body, ctx);
}

}  // namespace make_inplace::kernels
