// layer_norm_ and its backward on the CPU, torch-free. Sums accumulate in
// double (cheap on the CPU; exact enough for every dtype at any width); the
// statistics are stored in the accumulation type of the kernel contract
// (float, or double for float64).
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "make_inplace/kernels/layer_norm.h"

namespace make_inplace::kernels {
namespace {

template <typename T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
double clamped(T w) {
  const double v = static_cast<double>(w);
  if (v >= 0) return v < kLayerNormWeightClamp ? kLayerNormWeightClamp : v;
  return v > -kLayerNormWeightClamp ? -kLayerNormWeightClamp : v;
}

template <typename T>
void forward(T* x, const T* w, const T* b, int64_t rows, int64_t n, double eps,
             stat_t<T>* mean_out, stat_t<T>* rstd_out) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* row = x + r * n;
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += static_cast<double>(row[j]);
    const double mean = sum / static_cast<double>(n);
    double sq = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double d = static_cast<double>(row[j]) - mean;
      sq += d * d;
    }
    // rstd rounded to the stored type first, so the output and the saved rstd
    // the backward uses agree.
    const stat_t<T> rstd =
        static_cast<stat_t<T>>(1.0 / std::sqrt(sq / static_cast<double>(n) + eps));
    for (int64_t j = 0; j < n; ++j) {
      double v = (static_cast<double>(row[j]) - mean) * static_cast<double>(rstd);
      if (w) v *= static_cast<double>(w[j]);
      if (b) v += static_cast<double>(b[j]);
      row[j] = static_cast<T>(v);
    }
    if (mean_out) mean_out[r] = static_cast<stat_t<T>>(mean);
    if (rstd_out) rstd_out[r] = rstd;
  }
}

template <typename T>
void backward(const T* dy, const T* y, const T* w, const T* b,
              const stat_t<T>* rstd, int64_t rows, int64_t n, T* dx, T* dw,
              T* db) {
  // x_hat rebuilt from the output: (y - b) / w, w clamped away from 0.
  auto x_hat = [&](int64_t r, int64_t j) {
    double v = static_cast<double>(y[r * n + j]);
    if (b) v -= static_cast<double>(b[j]);
    if (w) v /= clamped(w[j]);
    return v;
  };
  if (dx) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      double sum_g = 0, sum_gx = 0;
      for (int64_t j = 0; j < n; ++j) {
        double g = static_cast<double>(dy[r * n + j]);
        if (w) g *= static_cast<double>(w[j]);
        sum_g += g;
        sum_gx += g * x_hat(r, j);
      }
      const double mean_g = sum_g / static_cast<double>(n);
      const double mean_gx = sum_gx / static_cast<double>(n);
      const double rs = static_cast<double>(rstd[r]);
      for (int64_t j = 0; j < n; ++j) {
        double g = static_cast<double>(dy[r * n + j]);
        if (w) g *= static_cast<double>(w[j]);
        dx[r * n + j] = static_cast<T>(rs * (g - mean_g - x_hat(r, j) * mean_gx));
      }
    }
  }
  if (dw || db) {
    std::vector<double> acc_w(dw ? n : 0, 0.0), acc_b(db ? n : 0, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        const double g = static_cast<double>(dy[r * n + j]);
        if (dw) acc_w[j] += g * x_hat(r, j);
        if (db) acc_b[j] += g;
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      if (dw) dw[j] = static_cast<T>(acc_w[j]);
      if (db) db[j] = static_cast<T>(acc_b[j]);
    }
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

int layer_norm_forward_cpu(ScalarKind kind, void* x, const void* weight,
                           const void* bias, int64_t rows, int64_t n,
                           double eps, void* mean, void* rstd) {
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    forward<T>(static_cast<T*>(x), static_cast<const T*>(weight),
               static_cast<const T*>(bias), rows, n, eps,
               static_cast<stat_t<T>*>(mean), static_cast<stat_t<T>*>(rstd));
  });
  return 0;
}

int layer_norm_backward_cpu(ScalarKind kind, const void* grad_output,
                            const void* y, const void* weight,
                            const void* bias, const void* rstd, int64_t rows,
                            int64_t n, void* grad_input, void* grad_weight,
                            void* grad_bias) {
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    backward<T>(static_cast<const T*>(grad_output), static_cast<const T*>(y),
                static_cast<const T*>(weight), static_cast<const T*>(bias),
                static_cast<const stat_t<T>*>(rstd), rows, n,
                static_cast<T*>(grad_input), static_cast<T*>(grad_weight),
                static_cast<T*>(grad_bias));
  });
  return 0;
}

}  // namespace make_inplace::kernels
