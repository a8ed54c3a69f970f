#pragma once
// The cuBLAS products of square_matmul_'s panel route: one panel's rows of x
// times W into workspace blocks. cuBLAS is column-major: x's row-major
// (rows x n) panel is the column-major n x rows matrix X^T, so the panel's
// result (X W)^T = W^T X^T is the column-major product of W's row-major
// storage (W^T) and X^T; with transpose, (X W^T)^T = W X^T takes W's storage
// transposed.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>

#include <optional>

#include "make_inplace/square_matmul.h"

namespace make_inplace {

class PanelGemm {
 public:
  // Products on the current stream. `rows_per_block` and `blocks` describe
  // the batched product of a full panel; `aligned` says every matrix it
  // touches starts on 16 bytes (the cuBLASLt plan needs it).
  PanelGemm(const SquareWeight& w, at::ScalarType dtype, int64_t n, int64_t rows_per_block,
            int blocks, bool aligned);
  ~PanelGemm();
  PanelGemm(const PanelGemm&) = delete;
  PanelGemm& operator=(const PanelGemm&) = delete;

  const void* weight() const { return w_; }

  // out (count x n, row-major) = x_rows @ W (or W^T).
  void one(const void* x_rows, void* out, int64_t count) const;

  // `batch` products of rows_per_block rows each, through device arrays of
  // pointers (the weight, the x sub-panels, the blocks). A full panel
  // (batch == blocks) goes through a cuBLASLt plan made once per shape:
  // cublasGemmBatchedEx chose its kernel on every call, about 18 us of host
  // time per panel on an H100, which made panels of n <= 2048 host-bound
  // (benchmarks/results/h100/profile_square_matmul_panels.txt).
  void batched(const void* const* w_array, const void* const* x_array, void* const* out_array,
               int batch) const;

 private:
  const void* alpha() const;
  const void* beta() const;

  cublasHandle_t handle_;
  cublasOperation_t op_w_;
  int n_;
  int64_t rows_per_block_;
  int blocks_;
  cudaDataType_t type_;
  cublasComputeType_t compute_;
  const void* w_;
  float one32_ = 1.f, zero32_ = 0.f;
  double one64_ = 1.0, zero64_ = 0.0;
  cublasMath_t saved_math_mode_;
  struct LtPlan;
  LtPlan* lt_ = nullptr;
};

}  // namespace make_inplace
