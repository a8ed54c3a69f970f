#pragma once
// square_matmul_'s panel route on CUDA: for each panel of rows, cuBLAS
// writes panel @ W into the workspace blocks of a PanelPlan, then a copy
// kernel moves the results over the panel (adding the bias), all on the
// current stream.
#include <ATen/ATen.h>

#include <optional>

#include "make_inplace/square_matmul.h"
#include "make_inplace/square_matmul_workspace.h"

namespace make_inplace {

// x (rows x n, contiguous, on the current device), w and bias as checked by
// check_square_matmul_args; plan.rows_per_block >= 1. Allocates the plan's
// workspace (plan.workspace_bytes()) and nothing else.
void square_matmul_panels_cublas(const at::Tensor& x, const SquareWeight& w, const std::optional<at::Tensor>& bias,
                                 int64_t rows, int64_t n, const square_matmul::PanelPlan& plan);

}  // namespace make_inplace
