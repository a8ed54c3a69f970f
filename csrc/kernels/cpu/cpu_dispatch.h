#pragma once
// Runs a CPU kernel over items on torch's thread pool for a ScalarKind: the
// half types and float32 through the best float32 vectors of this CPU,
// float64 through the portable (double) path.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "cpu_vec.h"
#include "make_inplace/kernels/cpu_parallel.h"
#include "make_inplace/kernels/scalar_kind.h"

namespace make_inplace::kernels::cpu {

inline bool handles(ScalarKind kind) {
  return kind == ScalarKind::kFloat16 || kind == ScalarKind::kBFloat16 || kind == ScalarKind::kFloat32 ||
         kind == ScalarKind::kFloat64;
}

// K<T>::run<V>(&args, begin, end) over [0, items) in chunks of at least
// `grain`. Returns 1 (nothing run) for a kind the CPU kernels do not handle.
template <template <typename> class K, typename Args>
int parallel_for_kind(ScalarKind kind, const Args& args, int64_t items, int64_t grain) {
  if (!handles(kind)) return 1;
  cpu_parallel_for(items, grain, [&](int64_t b, int64_t e) {
    switch (kind) {
      case ScalarKind::kFloat16: return run_best<K<c10::Half>>(&args, b, e);
      case ScalarKind::kBFloat16: return run_best<K<c10::BFloat16>>(&args, b, e);
      case ScalarKind::kFloat32: return run_best<K<float>>(&args, b, e);
      case ScalarKind::kFloat64: return run_portable<K<double>>(&args, b, e);
    }
  });
  return 0;
}

}  // namespace make_inplace::kernels::cpu
