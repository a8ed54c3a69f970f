// Trilinear interpolation on the CPU: one point per loop iteration, corner
// weights computed once per point, half types accumulated in float32.
#include "make_inplace/kernels/trilinear.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

#include "make_inplace/kernels/trilinear_math.h"

namespace make_inplace::kernels {
namespace {

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
void forward(TrilinearInput feats_in, TrilinearInput points_in, T* out,
             int64_t n, int64_t f) {
  using A = Acc<T>;
  const T* feats = static_cast<const T*>(feats_in.data);
  const T* points = static_cast<const T*>(points_in.data);
  const int64_t* fs = feats_in.stride;
  const int64_t* ps = points_in.stride;
#pragma omp parallel for
  for (int64_t p = 0; p < n; ++p) {
    const T* pt = points + p * ps[0];
    A w[8];
    trilinear_weights<A>(A(pt[0]), A(pt[ps[1]]), A(pt[2 * ps[1]]), w);
    const T* fp = feats + p * fs[0];
    T* op = out + p * f;
    for (int64_t c = 0; c < f; ++c) {
      A sum = 0;
      for (int k = 0; k < 8; ++k) sum += w[k] * A(fp[k * fs[1] + c * fs[2]]);
      op[c] = static_cast<T>(sum);
    }
  }
}

template <typename T>
void backward(TrilinearInput grad_in, TrilinearInput points_in,
              TrilinearInput feats_in, T* grad_feats, T* grad_points,
              int64_t n, int64_t f, bool accumulate) {
  using A = Acc<T>;
  const T* grad = static_cast<const T*>(grad_in.data);
  const T* points = static_cast<const T*>(points_in.data);
  const T* feats = static_cast<const T*>(feats_in.data);
  const int64_t* gs = grad_in.stride;
  const int64_t* ps = points_in.stride;
  const int64_t* fs = feats_in.stride;
  const bool with_points = grad_points != nullptr;
#pragma omp parallel for
  for (int64_t p = 0; p < n; ++p) {
    const T* pt = points + p * ps[0];
    const A x = A(pt[0]), y = A(pt[ps[1]]), z = A(pt[2 * ps[1]]);
    A w[8], dx[8] = {}, dy[8] = {}, dz[8] = {};
    trilinear_weights<A>(x, y, z, w);
    if (with_points) trilinear_weight_grads<A>(x, y, z, dx, dy, dz);
    const T* gp = grad + p * gs[0];
    T* gf = grad_feats + p * 8 * f;
    A sx = 0, sy = 0, sz = 0;
    for (int64_t c = 0; c < f; ++c) {
      const A g = A(gp[c * gs[1]]);
      for (int k = 0; k < 8; ++k) {
        const A value = w[k] * g;
        T& dst = gf[k * f + c];
        dst = static_cast<T>(accumulate ? A(dst) + value : value);
      }
      if (with_points) {
        const T* fp = feats + p * fs[0] + c * fs[2];
        A ex = 0, ey = 0, ez = 0;
        for (int k = 0; k < 8; ++k) {
          const A v = A(fp[k * fs[1]]);
          ex += dx[k] * v;
          ey += dy[k] * v;
          ez += dz[k] * v;
        }
        sx += g * ex;
        sy += g * ey;
        sz += g * ez;
      }
    }
    if (with_points) {
      T* dst = grad_points + p * 3;
      const A s[3] = {sx, sy, sz};
      for (int d = 0; d < 3; ++d) {
        dst[d] = static_cast<T>(accumulate ? A(dst[d]) + s[d] : s[d]);
      }
    }
  }
}

}  // namespace

#define MAKE_INPLACE_TRILINEAR_CASES(CALL)                       \
  switch (kind) {                                                \
    case ScalarKind::kFloat16: CALL(c10::Half); return 0;        \
    case ScalarKind::kBFloat16: CALL(c10::BFloat16); return 0;   \
    case ScalarKind::kFloat32: CALL(float); return 0;            \
    case ScalarKind::kFloat64: CALL(double); return 0;           \
  }                                                              \
  return 1;

int trilinear_forward_cpu(ScalarKind kind, TrilinearInput feats,
                          TrilinearInput points, void* out, int64_t n,
                          int64_t f) {
#define CALL(T) forward<T>(feats, points, static_cast<T*>(out), n, f)
  MAKE_INPLACE_TRILINEAR_CASES(CALL)
#undef CALL
}

int trilinear_backward_cpu(ScalarKind kind, TrilinearInput grad_out,
                           TrilinearInput points, TrilinearInput feats,
                           void* grad_feats, void* grad_points, int64_t n,
                           int64_t f, bool accumulate) {
#define CALL(T)                                                          \
  backward<T>(grad_out, points, feats, static_cast<T*>(grad_feats),      \
              static_cast<T*>(grad_points), n, f, accumulate)
  MAKE_INPLACE_TRILINEAR_CASES(CALL)
#undef CALL
}

#undef MAKE_INPLACE_TRILINEAR_CASES

}  // namespace make_inplace::kernels
