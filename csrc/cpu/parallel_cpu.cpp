// Hands the torch-free CPU kernels at::parallel_for when the extension loads,
// so they split rows over torch's thread pool and honour torch.set_num_threads
// (from any thread) and torch's no-nesting rule inside its own parallel regions.
#include <ATen/Parallel.h>

#include "make_inplace/kernels/cpu_parallel.h"

namespace make_inplace {
namespace {

void aten_parallel_for(int64_t n, int64_t grain, kernels::CpuRangeBody body, const void* ctx) {
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) { body(ctx, begin, end); });
}

const bool registered = [] {
  kernels::set_cpu_parallel_for(&aten_parallel_for);
  return true;
}();

}  // namespace
}  // namespace make_inplace
