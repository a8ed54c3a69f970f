// square_matmul_ on the CPU: the row-panel scheme with a bounded workspace,
// and a row-at-a-time kernel when the bound is smaller than one row.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "make_inplace/kernels/square_matmul.h"
#include "make_inplace/square_matmul.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

constexpr int64_t kMinCpuPanelRows = 128;

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
    // The torch-free kernel (shared with the MindSpore bridge) gets chunks of
    // rows from ATen's thread pool; one row's results live in an n-element
    // accumulator per worker, the only memory it uses.
    const kernels::ScalarKind kind = scalar_kind(x.scalar_type());
    char* base = static_cast<char*>(x.data_ptr());
    const void* wp = w.matrix.const_data_ptr();
    const void* bp = has_bias ? bias->const_data_ptr() : nullptr;
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      const int rc = kernels::square_matmul_rowwise(
          kind, base + begin * row_bytes, wp, bp, end - begin, n, w.transpose);
      TORCH_CHECK(rc == 0, "square_matmul_rowwise failed with code ", rc);
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
