// Batched outer product on the CPU. The backward reads grad_out once per
// batch, forming the row sums (grad_a) and the column sums (grad_b) in the
// same sweep; the column sums live in an m-sized accumulator per thread.
#include "make_inplace/kernels/outer_product.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>
#include <vector>

namespace make_inplace::kernels {
namespace {

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
void forward(OuterInput a_in, OuterInput b_in, T* out, int64_t batch,
             int64_t n, int64_t m) {
  using A = Acc<T>;
  const T* a = static_cast<const T*>(a_in.data);
  const T* b = static_cast<const T*>(b_in.data);
  const int64_t rows = batch * n;
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = r / n, i = r - s * n;
    const A ai = A(a[s * a_in.stride[0] + i * a_in.stride[1]]);
    const T* bs = b + s * b_in.stride[0];
    T* dst = out + r * m;
    for (int64_t j = 0; j < m; ++j) {
      dst[j] = static_cast<T>(ai * A(bs[j * b_in.stride[1]]));
    }
  }
}

template <typename T>
void store(T* dst, Acc<T> value, bool accumulate) {
  *dst = static_cast<T>(accumulate ? Acc<T>(*dst) + value : value);
}

template <typename T>
void backward(OuterInput g_in, OuterInput a_in, OuterInput b_in, T* grad_a,
              T* grad_b, int64_t batch, int64_t n, int64_t m,
              bool accumulate) {
  using A = Acc<T>;
  const T* g = static_cast<const T*>(g_in.data);
  const T* a = static_cast<const T*>(a_in.data);
  const T* b = static_cast<const T*>(b_in.data);
  const int64_t* gs = g_in.stride;
#pragma omp parallel
  {
    std::vector<A> cols(grad_b ? m : 0);
#pragma omp for
    for (int64_t s = 0; s < batch; ++s) {
      std::fill(cols.begin(), cols.end(), A(0));
      const T* as = a + s * a_in.stride[0];
      const T* bs = b + s * b_in.stride[0];
      for (int64_t i = 0; i < n; ++i) {
        const T* row = g + s * gs[0] + i * gs[1];
        const A ai = A(as[i * a_in.stride[1]]);
        A row_sum = 0;
        for (int64_t j = 0; j < m; ++j) {
          const A gij = A(row[j * gs[2]]);
          if (grad_a) row_sum += gij * A(bs[j * b_in.stride[1]]);
          if (grad_b) cols[j] += gij * ai;
        }
        if (grad_a) store(grad_a + s * n + i, row_sum, accumulate);
      }
      if (grad_b) {
        for (int64_t j = 0; j < m; ++j) store(grad_b + s * m + j, cols[j], accumulate);
      }
    }
  }
}

}  // namespace

#define MAKE_INPLACE_OUTER_CASES(CALL)                           \
  switch (kind) {                                                \
    case ScalarKind::kFloat16: CALL(c10::Half); return 0;        \
    case ScalarKind::kBFloat16: CALL(c10::BFloat16); return 0;   \
    case ScalarKind::kFloat32: CALL(float); return 0;            \
    case ScalarKind::kFloat64: CALL(double); return 0;           \
  }                                                              \
  return 1;

int outer_product_forward_cpu(ScalarKind kind, OuterInput a, OuterInput b,
                              void* out, int64_t batch, int64_t n, int64_t m) {
#define CALL(T) forward<T>(a, b, static_cast<T*>(out), batch, n, m)
  MAKE_INPLACE_OUTER_CASES(CALL)
#undef CALL
}

int outer_product_backward_cpu(ScalarKind kind, OuterInput grad_out,
                               OuterInput a, OuterInput b, void* grad_a,
                               void* grad_b, int64_t batch, int64_t n,
                               int64_t m, bool accumulate) {
#define CALL(T)                                                            \
  backward<T>(grad_out, a, b, static_cast<T*>(grad_a),                     \
              static_cast<T*>(grad_b), batch, n, m, accumulate)
  MAKE_INPLACE_OUTER_CASES(CALL)
#undef CALL
}

#undef MAKE_INPLACE_OUTER_CASES

}  // namespace make_inplace::kernels
