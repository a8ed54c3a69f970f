#pragma once
// How the torch-free CPU kernels split rows over threads. The library that
// links them supplies the parallel-for: the PyTorch extension registers one
// over at::parallel_for when it loads (so torch.set_num_threads, nesting inside
// torch's own parallel regions and torch's thread pool all apply); without a
// registration (the MindSpore bridge) the kernels use OpenMP when compiled with
// it, else run serially.
#include <cstdint>

namespace make_inplace::kernels {

// Runs body(ctx, begin, end) over chunks that cover [0, n) exactly once,
// possibly in parallel; a chunk holds at least `grain` items unless n is
// smaller. Must return only when every chunk is done.
using CpuRangeBody = void (*)(const void* ctx, int64_t begin, int64_t end);
using CpuParallelFor = void (*)(int64_t n, int64_t grain, CpuRangeBody body, const void* ctx);

// Sets the parallel-for every CPU kernel of this library uses; nullptr
// restores the built-in one (OpenMP or serial). Call it once, before any
// kernel runs (library load time).
void set_cpu_parallel_for(CpuParallelFor parallel_for);

// Runs body over [0, n) through the registered parallel-for.
void cpu_parallel_run(int64_t n, int64_t grain, CpuRangeBody body, const void* ctx);

// f(begin, end) over chunks of [0, n) through the registered parallel-for.
template <typename F>
void cpu_parallel_for(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  cpu_parallel_run(
      n, grain < 1 ? 1 : grain,
      [](const void* ctx, int64_t begin, int64_t end) { (*static_cast<const F*>(ctx))(begin, end); }, &f);
}

// Items per chunk so that one chunk does about kCpuGrainWork element-steps of
// work (torch's at::internal::GRAIN_SIZE): smaller work runs on one thread,
// where waking the pool would cost more than it saves.
constexpr int64_t kCpuGrainWork = 32768;

inline int64_t cpu_grain(int64_t work_per_item) {
  return work_per_item >= kCpuGrainWork ? 1 : kCpuGrainWork / (work_per_item < 1 ? 1 : work_per_item);
}

}  // namespace make_inplace::kernels
