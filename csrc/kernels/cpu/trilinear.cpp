// Trilinear interpolation on the CPU, torch-free: one point per step, its
// corner weights computed once. When the feature axis is contiguous the
// features run in float32 vectors (cpu_vec.h), else element by element
// through the strides; half types accumulate in float32, float64 in double.
// Points go to the registered parallel-for (cpu_parallel.h); no heap memory.
#include "make_inplace/kernels/trilinear.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

#include "cpu_dispatch.h"
#include "cpu_rows.h"
#include "make_inplace/kernels/cpu_parallel.h"
#include "make_inplace/kernels/trilinear_math.h"

namespace make_inplace::kernels {
namespace {

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

struct ForwardCall {
  TrilinearInput feats, points;
  void* out;
  int64_t f;
};

struct BackwardCall {
  TrilinearInput grad, points, feats;
  void* grad_feats;
  void* grad_points;
  int64_t f;
  bool accumulate;
};

// out[p, c] = sum_k w_k feats[p, k, c] for points [begin, end).
template <typename T>
struct Forward {
  template <typename V>
  static void run(const ForwardCall* call, int64_t begin, int64_t end) {
    using A = Acc<T>;
    constexpr int64_t W = V::kWidth;
    const T* feats = static_cast<const T*>(call->feats.data);
    const T* points = static_cast<const T*>(call->points.data);
    const int64_t* fs = call->feats.stride;
    const int64_t* ps = call->points.stride;
    const int64_t f = call->f;
    const bool vector = !std::is_same_v<T, double> && fs[2] == 1;
    for (int64_t p = begin; p < end; ++p) {
      const T* pt = points + p * ps[0];
      A w[8];
      trilinear_weights<A>(A(pt[0]), A(pt[ps[1]]), A(pt[2 * ps[1]]), w);
      const T* fp = feats + p * fs[0];
      T* op = static_cast<T*>(call->out) + p * f;
      if constexpr (!std::is_same_v<T, double>) {
        if (vector) {
          V vw[8];
          for (int k = 0; k < 8; ++k) vw[k] = V::broadcast(w[k]);
          for (int64_t c = 0; c < f; c += W) {
            const int64_t count = std::min(W, f - c);
            V sum = vw[0] * cpu::load_n<V>(fp + c, count);
            for (int k = 1; k < 8; ++k) sum = V::fma(vw[k], cpu::load_n<V>(fp + k * fs[1] + c, count), sum);
            if (count == W) {
              sum.store(op + c);
            } else {
              sum.store(op + c, count);
            }
          }
          continue;
        }
      }
      for (int64_t c = 0; c < f; ++c) {
        A sum = 0;
        for (int k = 0; k < 8; ++k) sum += w[k] * A(fp[k * fs[1] + c * fs[2]]);
        op[c] = static_cast<T>(sum);
      }
    }
  }
};

// grad_feats[p, k, c] (+)= w_k grad[p, c]; grad_points[p] (+)= sum_c grad[p, c]
// d out[p, c] / d points[p] when grad_points is given.
template <typename T>
struct Backward {
  template <typename V>
  static void run(const BackwardCall* call, int64_t begin, int64_t end) {
    using A = Acc<T>;
    constexpr int64_t W = V::kWidth;
    const T* grad = static_cast<const T*>(call->grad.data);
    const T* points = static_cast<const T*>(call->points.data);
    const T* feats = static_cast<const T*>(call->feats.data);
    const int64_t* gs = call->grad.stride;
    const int64_t* ps = call->points.stride;
    const int64_t* fs = call->feats.stride;
    const int64_t f = call->f;
    const bool accumulate = call->accumulate;
    T* grad_points = static_cast<T*>(call->grad_points);
    const bool with_points = grad_points != nullptr;
    const bool vector = !std::is_same_v<T, double> && gs[1] == 1 && (!with_points || fs[2] == 1);
    for (int64_t p = begin; p < end; ++p) {
      const T* pt = points + p * ps[0];
      const A x = A(pt[0]), y = A(pt[ps[1]]), z = A(pt[2 * ps[1]]);
      A w[8], dx[8] = {}, dy[8] = {}, dz[8] = {};
      trilinear_weights<A>(x, y, z, w);
      if (with_points) trilinear_weight_grads<A>(x, y, z, dx, dy, dz);
      const T* gp = grad + p * gs[0];
      const T* fp = with_points ? feats + p * fs[0] : nullptr;
      T* gf = static_cast<T*>(call->grad_feats) + p * 8 * f;
      A s[3] = {0, 0, 0};
      bool done = false;
      if constexpr (!std::is_same_v<T, double>) {
        if (vector) {
          V sx = V::broadcast(0.f), sy = V::broadcast(0.f), sz = V::broadcast(0.f);
          for (int64_t c = 0; c < f; c += W) {
            const int64_t count = std::min(W, f - c);
            const V g = cpu::load_n<V>(gp + c, count);
            for (int k = 0; k < 8; ++k) {
              T* dst = gf + k * f + c;
              V value = V::broadcast(w[k]) * g;
              if (accumulate) value = value + cpu::load_n<V>(dst, count);
              if (count == W) {
                value.store(dst);
              } else {
                value.store(dst, count);
              }
            }
            if (with_points) {
              V ex = V::broadcast(0.f), ey = V::broadcast(0.f), ez = V::broadcast(0.f);
              for (int k = 0; k < 8; ++k) {
                const V v = cpu::load_n<V>(fp + k * fs[1] + c, count);
                ex = V::fma(V::broadcast(dx[k]), v, ex);
                ey = V::fma(V::broadcast(dy[k]), v, ey);
                ez = V::fma(V::broadcast(dz[k]), v, ez);
              }
              sx = V::fma(g, ex, sx);
              sy = V::fma(g, ey, sy);
              sz = V::fma(g, ez, sz);
            }
          }
          s[0] = sx.sum();
          s[1] = sy.sum();
          s[2] = sz.sum();
          done = true;
        }
      }
      if (!done) {
        for (int64_t c = 0; c < f; ++c) {
          const A g = A(gp[c * gs[1]]);
          for (int k = 0; k < 8; ++k) {
            const A value = w[k] * g;
            T& dst = gf[k * f + c];
            dst = static_cast<T>(accumulate ? A(dst) + value : value);
          }
          if (with_points) {
            const T* fc = fp + c * fs[2];
            A ex = 0, ey = 0, ez = 0;
            for (int k = 0; k < 8; ++k) {
              const A v = A(fc[k * fs[1]]);
              ex += dx[k] * v;
              ey += dy[k] * v;
              ez += dz[k] * v;
            }
            s[0] += g * ex;
            s[1] += g * ey;
            s[2] += g * ez;
          }
        }
      }
      if (with_points) {
        T* dst = grad_points + p * 3;
        for (int d = 0; d < 3; ++d) dst[d] = static_cast<T>(accumulate ? A(dst[d]) + s[d] : s[d]);
      }
    }
  }
};

}  // namespace

int trilinear_forward_cpu(ScalarKind kind, TrilinearInput feats, TrilinearInput points, void* out, int64_t n,
                          int64_t f) {
  return cpu::parallel_for_kind<Forward>(kind, ForwardCall{feats, points, out, f}, n, cpu_grain(9 * f));
}

int trilinear_backward_cpu(ScalarKind kind, TrilinearInput grad_out, TrilinearInput points, TrilinearInput feats,
                           void* grad_feats, void* grad_points, int64_t n, int64_t f, bool accumulate) {
  const BackwardCall call{grad_out, points, feats, grad_feats, grad_points, f, accumulate};
  return cpu::parallel_for_kind<Backward>(kind, call, n, cpu_grain(18 * f));
}

}  // namespace make_inplace::kernels
