// softmax_ and its backward on the CPU, torch-free. Rows (inner == 1) and
// strided "columns" (inner > 1) share one loop nest: columns are taken in
// blocks of kBlock so the inner loop walks contiguous memory, with the
// per-column max and sum on the stack (no heap allocation).
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "make_inplace/kernels/softmax.h"

namespace make_inplace::kernels {
namespace {

constexpr int64_t kBlock = 64;

// double accumulation on the CPU: cheap here and keeps wide fp32 rows exact
// to well within float32's rounding.
using acc_t = double;

// max that propagates NaN, so a row holding NaN becomes NaN as in torch.
inline acc_t nan_max(acc_t a, acc_t b) { return (b > a || b != b) ? b : a; }

template <typename T>
void forward(T* x, int64_t outer, int64_t n, int64_t inner, acc_t scale,
             int64_t causal_rows, const MaskLayout& mask) {
  const T* mk = static_cast<const T*>(mask.data);
  const acc_t neg_inf = -std::numeric_limits<acc_t>::infinity();
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < outer; ++o) {
    T* base = x + o * n * inner;
    // Causal: row o's query index is o % causal_rows; columns past it are out.
    const int64_t valid = causal_rows > 0 ? std::min(n, o % causal_rows + 1) : n;
    const int64_t m_outer =
        mk ? mask_offset(mask.outer_rank, mask.outer_sizes, mask.outer_strides, o) : 0;
    for (int64_t i0 = 0; i0 < inner; i0 += kBlock) {
      const int64_t cnt = std::min(kBlock, inner - i0);
      acc_t mx[kBlock], sum[kBlock];
      int64_t m_inner[kBlock];
      for (int64_t c = 0; c < cnt; ++c) {
        mx[c] = neg_inf;
        sum[c] = 0;
        m_inner[c] = mk ? m_outer + mask_offset(mask.inner_rank, mask.inner_sizes,
                                                mask.inner_strides, i0 + c)
                        : 0;
      }
      auto value = [&](int64_t d, int64_t c) -> acc_t {
        if (d >= valid) return neg_inf;
        acc_t v = static_cast<acc_t>(base[d * inner + i0 + c]) * scale;
        if (mk) v += static_cast<acc_t>(mk[m_inner[c] + d * mask.dim_stride]);
        return v;
      };
      for (int64_t d = 0; d < n; ++d)
        for (int64_t c = 0; c < cnt; ++c) mx[c] = nan_max(mx[c], value(d, c));
      for (int64_t d = 0; d < n; ++d)
        for (int64_t c = 0; c < cnt; ++c) sum[c] += std::exp(value(d, c) - mx[c]);
      for (int64_t d = 0; d < n; ++d)
        for (int64_t c = 0; c < cnt; ++c)
          base[d * inner + i0 + c] = static_cast<T>(std::exp(value(d, c) - mx[c]) / sum[c]);
    }
  }
}

template <typename T>
void backward(const T* dy, const T* y, T* dx, int64_t outer, int64_t n,
              int64_t inner, acc_t scale) {
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t off = o * n * inner;
    for (int64_t i0 = 0; i0 < inner; i0 += kBlock) {
      const int64_t cnt = std::min(kBlock, inner - i0);
      acc_t dot[kBlock] = {};
      for (int64_t d = 0; d < n; ++d)
        for (int64_t c = 0; c < cnt; ++c) {
          const int64_t k = off + d * inner + i0 + c;
          dot[c] += static_cast<acc_t>(dy[k]) * static_cast<acc_t>(y[k]);
        }
      for (int64_t d = 0; d < n; ++d)
        for (int64_t c = 0; c < cnt; ++c) {
          const int64_t k = off + d * inner + i0 + c;
          dx[k] = static_cast<T>(scale * static_cast<acc_t>(y[k]) *
                                 (static_cast<acc_t>(dy[k]) - dot[c]));
        }
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

int softmax_forward_cpu(ScalarKind kind, void* x, int64_t outer, int64_t n,
                        int64_t inner, double scale, int64_t causal_rows,
                        const MaskLayout& mask) {
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    forward<T>(static_cast<T*>(x), outer, n, inner, scale, causal_rows, mask);
  });
  return 0;
}

int softmax_backward_cpu(ScalarKind kind, const void* grad_output,
                         const void* y, void* grad_input, int64_t outer,
                         int64_t n, int64_t inner, double scale) {
  dispatch(kind, [&](auto tag) {
    using T = decltype(tag);
    backward<T>(static_cast<const T*>(grad_output), static_cast<const T*>(y),
                static_cast<T*>(grad_input), outer, n, inner, scale);
  });
  return 0;
}

}  // namespace make_inplace::kernels
