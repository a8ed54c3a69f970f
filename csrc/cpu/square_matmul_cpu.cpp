// square_matmul_ on the CPU: checks, then the routing policy's CPU plan —
// ATen GEMMs over row panels within the workspace bound, or the row-at-a-time
// kernel when the bound holds too few rows for a panel.
#include <torch/library.h>

#include "make_inplace/kernels/cpu_facts.h"
#include "make_inplace/kernels/square_matmul.h"
#include "make_inplace/square_matmul.h"
#include "make_inplace/square_matmul_route.h"

namespace make_inplace {
namespace {

void square_matmul_cpu(const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, bool transpose,
                       std::optional<int64_t> workspace_bytes) {
  const SquareWeight w = check_square_matmul_args(x, weight, bias, transpose,
                                                  workspace_bytes);
  const square_matmul::Call call = square_matmul_call(x, w, bias, workspace_bytes);
  square_matmul::Device device;
  device.cpu_l2_bytes = kernels::cpu_l2_rule_bytes();
  device.cpu_bf16_dot = kernels::cpu_has_bf16_dot();
  device.cpu_amx = kernels::cpu_has_amx();
  device.cpu_rows_bf16_dot = kernels::square_matmul_rows_bf16_dot();
  const square_matmul::Plan plan = square_matmul::plan(call, device);
  const int64_t n = call.n, rows = call.rows;
  const bool has_bias = bias.has_value() && bias->defined();

  if (plan.route == square_matmul::Route::kCpuRows) {
    // The torch-free kernel (shared with the MindSpore bridge) splits the rows
    // over ATen's thread pool itself (the parallel-for parallel_cpu.cpp
    // registers) and keeps each panel of rows on its thread's stack.
    const int rc = kernels::square_matmul_rowwise(call.kind, x.data_ptr(), w.matrix.const_data_ptr(),
                                                  has_bias ? bias->const_data_ptr() : nullptr, rows, n,
                                                  w.transpose);
    TORCH_CHECK(rc == 0, "make_inplace.square_matmul_: the row kernel failed with code ", rc);
    return;
  }
  if (plan.route != square_matmul::Route::kCpuPanels) return;  // kEmpty: no rows
  const int64_t panel_rows = plan.panels.rows_per_block;
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
