// rms_norm_ and its backward on the CPU, torch-free. Sums accumulate in
// double; rstd is stored in the accumulation type of the kernel contract
// (float, or double for float64) and the output is computed from that stored
// value, so the backward's rebuilt x_hat matches the forward.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "make_inplace/kernels/rms_norm.h"

namespace make_inplace::kernels {
namespace {

template <typename T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
double clamped(T w) {
  const double v = static_cast<double>(w);
  if (v >= 0) return v < kRmsNormWeightClamp ? kRmsNormWeightClamp : v;
  return v > -kRmsNormWeightClamp ? -kRmsNormWeightClamp : v;
}

template <typename T>
void forward(T* x, const T* w, int64_t rows, int64_t n, double eps, stat_t<T>* rstd_out) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* row = x + r * n;
    double sq = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double v = static_cast<double>(row[j]);
      sq += v * v;
    }
    const stat_t<T> rstd = static_cast<stat_t<T>>(1.0 / std::sqrt(sq / static_cast<double>(n) + eps));
    for (int64_t j = 0; j < n; ++j) {
      double v = static_cast<double>(row[j]) * static_cast<double>(rstd);
      if (w) v *= static_cast<double>(w[j]);
      row[j] = static_cast<T>(v);
    }
    if (rstd_out) rstd_out[r] = rstd;
  }
}

template <typename T>
void backward(const T* dy, const T* y, const T* w, const stat_t<T>* rstd, int64_t rows, int64_t n,
              T* dx, T* dw) {
  auto x_hat = [&](int64_t r, int64_t j) {
    double v = static_cast<double>(y[r * n + j]);
    if (w) v /= clamped(w[j]);
    return v;
  };
  if (dx) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      double sum_gx = 0;
      for (int64_t j = 0; j < n; ++j) {
        double g = static_cast<double>(dy[r * n + j]);
        if (w) g *= static_cast<double>(w[j]);
        sum_gx += g * x_hat(r, j);
      }
      const double mean_gx = sum_gx / static_cast<double>(n);
      const double rs = static_cast<double>(rstd[r]);
      for (int64_t j = 0; j < n; ++j) {
        double g = static_cast<double>(dy[r * n + j]);
        if (w) g *= static_cast<double>(w[j]);
        dx[r * n + j] = static_cast<T>(rs * (g - x_hat(r, j) * mean_gx));
      }
    }
  }
  if (dw) {
    std::vector<double> acc(n, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(dy[r * n + j]) * x_hat(r, j);
    }
    for (int64_t j = 0; j < n; ++j) dw[j] = static_cast<T>(acc[j]);
  }
}

template <typename F>
void dispatch(ScalarKind kind, F&& f) {
  switch (kind) {
    case ScalarKind::kFloat16: f(c10::Half{}); break;
    case ScalarKind::kBFloat16: f(c10::BFloat16{}); break;
    case ScalarKind::kFloat32: f(float{}); break;
    case ScalarKind::kFloat64: f(double{}); break;
  }
}

}  // namespace

int rms_norm_forward_cpu(ScalarKind kind, void* x, const void* weight, int64_t rows, int64_t n,
                         double eps, void* rstd) {
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    forward<T>(static_cast<T*>(x), static_cast<const T*>(weight), rows, n, eps,
               static_cast<stat_t<T>*>(rstd));
  });
  return 0;
}

int rms_norm_backward_cpu(ScalarKind kind, const void* grad_output, const void* y,
                          const void* weight, const void* rstd, int64_t rows, int64_t n,
                          void* grad_input, void* grad_weight) {
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    backward<T>(static_cast<const T*>(grad_output), static_cast<const T*>(y),
                static_cast<const T*>(weight), static_cast<const stat_t<T>*>(rstd), rows, n,
                static_cast<T*>(grad_input), static_cast<T*>(grad_weight));
  });
  return 0;
}

}  // namespace make_inplace::kernels
