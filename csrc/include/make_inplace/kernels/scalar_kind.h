#pragma once
// The element types make_inplace's kernels take, without any torch types, so
// the same kernels serve the PyTorch ops and the plain C ABI (MindSpore bridge).
namespace make_inplace::kernels {

enum class ScalarKind : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kFloat64 = 3 };

inline int element_size(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kFloat16:
    case ScalarKind::kBFloat16: return 2;
    case ScalarKind::kFloat32: return 4;
    case ScalarKind::kFloat64: return 8;
  }
  return 0;
}

}  // namespace make_inplace::kernels
