// square_matmul_ on the CPU: the row-panel scheme with a bounded workspace,
// and a row-at-a-time kernel when the bound is smaller than one row.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "make_inplace/square_matmul.h"

namespace make_inplace {
namespace {

constexpr int64_t kMinCpuPanelRows = 128;

// Each row's product is accumulated in a row-sized buffer before the row is
// overwritten: the CPU analogue of the GPU kernel holding rows on chip. This
// buffer (n accumulators per worker thread) is the only memory it uses.
template <typename scalar_t>
void rowwise_square_matmul(scalar_t* x, const scalar_t* w, const scalar_t* bias,
                           int64_t rows, int64_t n, bool transpose) {
  using acc_t = at::opmath_type<scalar_t>;
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(n);
    for (int64_t r = begin; r < end; ++r) {
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
  });
}

void square_matmul_cpu(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, bool transpose,
                       std::optional<int64_t> workspace_bytes) {
  const SquareWeight w = check_square_matmul_args(x, weight, bias, transpose,
                                                  workspace_bytes);
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  if (rows == 0) return;
  const bool has_bias = bias.has_value() && bias->defined();
  const int64_t row_bytes = n * static_cast<int64_t>(x.element_size());
  const int64_t panel_rows =
      std::min(rows, workspace_bound(x, workspace_bytes) / row_bytes);

  // Panels of a few rows turn into many tiny GEMM calls whose threading
  // overhead dominates; the row kernel is faster there and uses less memory.
  if (panel_rows < std::min<int64_t>(rows, kMinCpuPanelRows)) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kHalf, at::kBFloat16, x.scalar_type(), "square_matmul_cpu", [&] {
          rowwise_square_matmul<scalar_t>(
              x.data_ptr<scalar_t>(), w.matrix.const_data_ptr<scalar_t>(),
              has_bias ? bias->const_data_ptr<scalar_t>() : nullptr, rows, n,
              w.transpose);
        });
    return;
  }
  const at::Tensor x2d = x.view({rows, n});
  const at::Tensor mat = w.transpose ? w.matrix.t() : w.matrix;
  at::Tensor workspace = at::empty({panel_rows, n}, x.options());
  for (int64_t start = 0; start < rows; start += panel_rows) {
    const int64_t count = std::min(panel_rows, rows - start);
    at::Tensor panel = x2d.narrow(0, start, count);
    at::Tensor result = workspace.narrow(0, 0, count);
    if (has_bias) {
      at::addmm_out(result, *bias, panel, mat);
    } else {
      at::mm_out(result, panel, mat);
    }
    panel.copy_(result);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CPU, m) {
  m.impl("square_matmul_", &square_matmul_cpu);
}

}  // namespace make_inplace
