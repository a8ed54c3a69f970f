#pragma once
// Maps torch dtypes to the kernels' torch-free ScalarKind.
#include <ATen/ATen.h>

#include "make_inplace/kernels/scalar_kind.h"

namespace make_inplace {

inline kernels::ScalarKind scalar_kind(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return kernels::ScalarKind::kFloat16;
    case at::kBFloat16: return kernels::ScalarKind::kBFloat16;
    case at::kFloat: return kernels::ScalarKind::kFloat32;
    case at::kDouble: return kernels::ScalarKind::kFloat64;
    default: TORCH_CHECK(false, "unsupported dtype ", t);
  }
}

}  // namespace make_inplace
