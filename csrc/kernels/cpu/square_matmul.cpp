// The torch-free CPU row-at-a-time square matmul (see the header).
#include "make_inplace/kernels/square_matmul.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <vector>

namespace make_inplace::kernels {
namespace {

// float for the half types (and float), double for double: the accumulator
// type the PyTorch CPU ops use (at::opmath_type), without including ATen.
template <typename T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };

// Each row's product is accumulated in a row-sized buffer before the row is
// overwritten: the CPU analogue of the GPU kernel holding rows on chip.
template <typename scalar_t>
void rowwise(scalar_t* x, const scalar_t* w, const scalar_t* bias, int64_t rows,
             int64_t n, bool transpose) {
  using acc_t = typename AccType<scalar_t>::type;
#pragma omp parallel
  {
    std::vector<acc_t> acc(n);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      scalar_t* row = x + r * n;
      if (transpose) {  // acc[j] = sum_k row[k] * w[j, k]
        for (int64_t j = 0; j < n; ++j) {
          const scalar_t* wj = w + j * n;
          acc_t s = 0;
          for (int64_t k = 0; k < n; ++k) s += acc_t(row[k]) * acc_t(wj[k]);
          acc[j] = s;
        }
      } else {  // acc[j] = sum_k row[k] * w[k, j]
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t k = 0; k < n; ++k) {
          const acc_t a = row[k];
          const scalar_t* wk = w + k * n;
          for (int64_t j = 0; j < n; ++j) acc[j] += a * acc_t(wk[j]);
        }
      }
      for (int64_t j = 0; j < n; ++j) {
        row[j] = static_cast<scalar_t>(bias ? acc[j] + acc_t(bias[j]) : acc[j]);
      }
    }
  }
}

template <typename scalar_t>
void run(void* x, const void* w, const void* bias, int64_t rows, int64_t n,
         bool transpose) {
  rowwise<scalar_t>(static_cast<scalar_t*>(x), static_cast<const scalar_t*>(w),
                    static_cast<const scalar_t*>(bias), rows, n, transpose);
}

}  // namespace

int square_matmul_rowwise(ScalarKind kind, void* x, const void* w,
                          const void* bias, int64_t rows, int64_t n,
                          bool transpose) {
  switch (kind) {
    case ScalarKind::kFloat16: run<c10::Half>(x, w, bias, rows, n, transpose); return 0;
    case ScalarKind::kBFloat16: run<c10::BFloat16>(x, w, bias, rows, n, transpose); return 0;
    case ScalarKind::kFloat32: run<float>(x, w, bias, rows, n, transpose); return 0;
    case ScalarKind::kFloat64: run<double>(x, w, bias, rows, n, transpose); return 0;
  }
  return -1;
}

}  // namespace make_inplace::kernels
