// layer_norm_ and its backward on the CPU, torch-free. The forward of float,
// float16 and bfloat16 runs in float32 vectors (cpu_vec.h): two passes for the
// mean and the centred variance, blocks of each row summed in double
// (cpu_rows.h), then one pass writing the output; float64 keeps double math.
// The backward sums in double for every dtype. The statistics are stored in
// the accumulation type of the kernel contract (float, or double for
// float64). Rows, and the backward's column blocks, go to the registered
// parallel-for (cpu_parallel.h); no heap memory.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cpu_rows.h"
#include "make_inplace/kernels/cpu_parallel.h"
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

// float64: double math, one element at a time.
void forward_double(double* x, const double* w, const double* b, int64_t n, double eps, double* mean_out,
                    double* rstd_out, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r) {
    double* row = x + r * n;
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += row[j];
    const double mean = sum / static_cast<double>(n);
    double sq = 0;
    for (int64_t j = 0; j < n; ++j) sq += (row[j] - mean) * (row[j] - mean);
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(n) + eps);
    for (int64_t j = 0; j < n; ++j) {
      double v = (row[j] - mean) * rstd;
      if (w) v *= w[j];
      if (b) v += b[j];
      row[j] = v;
    }
    if (mean_out) mean_out[r] = mean;
    if (rstd_out) rstd_out[r] = rstd;
  }
}

struct ForwardCall {
  void* x;
  const void* w;
  const void* b;
  int64_t n;
  double eps;
  float* mean;
  float* rstd;
};

// float, float16, bfloat16: float32 vectors.
template <typename T>
struct Forward {
  template <typename V>
  static void run(const ForwardCall* c, int64_t begin, int64_t end) {
    const T* w = static_cast<const T*>(c->w);
    const T* b = static_cast<const T*>(c->b);
    const int64_t n = c->n;
    for (int64_t r = begin; r < end; ++r) {
      T* row = static_cast<T*>(c->x) + r * n;
      // Summed shifted by the row's first element, so float lanes add values
      // of the row's spread, not of its mean (1e3 + N(0, 1) stays accurate).
      const float shift = static_cast<float>(row[0]);
      const V vshift = V::broadcast(shift);
      const double mean =
          shift + cpu::row_sum<V>(row, n, [&](const V& v) { return v - vshift; }) / static_cast<double>(n);
      // The mean as a float plus a float remainder: x - hi is exact for x near
      // the mean.
      const float hi = static_cast<float>(mean);
      const V mean_hi = V::broadcast(hi), mean_lo = V::broadcast(static_cast<float>(mean - hi));
      auto centred = [&](const V& v) { return (v - mean_hi) - mean_lo; };
      const double sq = cpu::row_sum<V>(row, n, [&](const V& v) { return centred(v) * centred(v); });
      // rstd rounded to the stored type first, so the output and the saved
      // rstd the backward uses agree.
      const float rstd = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(n) + c->eps));
      const V vrstd = V::broadcast(rstd);
      cpu::row_map<V>(row, row, n, [&](const V& v, int64_t j, int64_t count) {
        V y = centred(v) * vrstd;
        if (w) y = y * cpu::load_n<V>(w + j, count);
        if (b) y = y + cpu::load_n<V>(b + j, count);
        return y;
      });
      if (c->mean) c->mean[r] = static_cast<float>(mean);
      if (c->rstd) c->rstd[r] = rstd;
    }
  }
};

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
    cpu_parallel_for(rows, cpu_grain(4 * n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
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
    });
  }
  if (dw || db) {
    // Column blocks in parallel, each summing over every row into stack
    // accumulators.
    constexpr int64_t kCols = 256;
    const int64_t blocks = (n + kCols - 1) / kCols;
    cpu_parallel_for(blocks, cpu_grain(4 * rows * kCols), [&](int64_t begin, int64_t end) {
      for (int64_t blk = begin; blk < end; ++blk) {
        const int64_t j0 = blk * kCols, cnt = std::min(kCols, n - j0);
        double acc_w[kCols] = {}, acc_b[kCols] = {};
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cnt; ++c) {
            const double g = static_cast<double>(dy[r * n + j0 + c]);
            if (dw) acc_w[c] += g * x_hat(r, j0 + c);
            if (db) acc_b[c] += g;
          }
        }
        for (int64_t c = 0; c < cnt; ++c) {
          if (dw) dw[j0 + c] = static_cast<T>(acc_w[c]);
          if (db) db[j0 + c] = static_cast<T>(acc_b[c]);
        }
      }
    });
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
  const int64_t grain = cpu_grain(4 * n);
  if (kind == ScalarKind::kFloat64) {
    cpu_parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
      forward_double(static_cast<double*>(x), static_cast<const double*>(weight),
                     static_cast<const double*>(bias), n, eps, static_cast<double*>(mean),
                     static_cast<double*>(rstd), begin, end);
    });
    return 0;
  }
  const ForwardCall call{x, weight, bias, n, eps, static_cast<float*>(mean), static_cast<float*>(rstd)};
  cpu_parallel_for(rows, grain, [&](int64_t begin, int64_t end) {
    switch (kind) {
      case ScalarKind::kFloat16: return cpu::run_best<Forward<c10::Half>>(&call, begin, end);
      case ScalarKind::kBFloat16: return cpu::run_best<Forward<c10::BFloat16>>(&call, begin, end);
      case ScalarKind::kFloat32: return cpu::run_best<Forward<float>>(&call, begin, end);
      case ScalarKind::kFloat64: return;
    }
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
