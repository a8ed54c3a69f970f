// square_matmul_'s panel route on CUDA (square_matmul_cublas.h): cuBLAS
// GEMMs of row panels into a bounded workspace, each followed by a copy kernel
// over the panel, all on the current stream. (Overlapping one panel's copy
// with the next panel's GEMM on a second stream measured slower: the copy
// finds no free SM while the GEMM runs; docs/square_matmul.md.)
#include "make_inplace/square_matmul_cublas.h"

#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <vector>

#include "make_inplace/kernels/square_matmul_panels.h"
#include "make_inplace/launch_check.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

using kernels::PanelBlocks;

// cuBLAS is column-major: x's row-major (rows x n) panel is the column-major
// n x rows matrix X^T, so the panel's result (X W)^T = W^T X^T is the
// column-major product of W's row-major storage (W^T) and X^T; with
// transpose, (X W^T)^T = W X^T takes W's storage transposed.
struct PanelGemm {
  cublasHandle_t handle;
  cublasOperation_t op_w;
  int n;
  cudaDataType_t type;
  cublasComputeType_t compute;
  const void* w;
  float alpha32 = 1.f, beta32 = 0.f;
  double alpha64 = 1.0, beta64 = 0.0;
  const void* alpha() const { return compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&alpha64) : &alpha32; }
  const void* beta() const { return compute == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&beta64) : &beta32; }

  void one(const void* x_rows, void* out, int64_t count) const {
    TORCH_CUDABLAS_CHECK(cublasGemmEx(handle, op_w, CUBLAS_OP_N, n, static_cast<int>(count), n,
                                      alpha(), w, type, n, x_rows, type, n, beta(), out, type, n,
                                      compute, CUBLAS_GEMM_DEFAULT));
  }

  // `batch` products of rows_per_block rows; the pointer arrays are on the device.
  void batched(const void* const* w_array, const void* const* x_array, void* const* out_array,
               int64_t rows_per_block, int batch) const {
    TORCH_CUDABLAS_CHECK(cublasGemmBatchedEx(
        handle, op_w, CUBLAS_OP_N, n, static_cast<int>(rows_per_block), n, alpha(), w_array,
        type, n, x_array, type, n, beta(), out_array, type, n, batch, compute,
        CUBLAS_GEMM_DEFAULT));
  }
};

PanelGemm make_panel_gemm(const SquareWeight& w, at::ScalarType dtype, int64_t n) {
  PanelGemm g{};
  g.handle = at::cuda::getCurrentCUDABlasHandle();  // on the current stream
  g.op_w = w.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.n = static_cast<int>(n);
  g.w = w.matrix.const_data_ptr();
  g.alpha32 = 1.f, g.beta32 = 0.f, g.alpha64 = 1.0, g.beta64 = 0.0;
  switch (dtype) {
    case at::kHalf: g.type = CUDA_R_16F, g.compute = CUBLAS_COMPUTE_32F; break;
    case at::kBFloat16: g.type = CUDA_R_16BF, g.compute = CUBLAS_COMPUTE_32F; break;
    case at::kFloat:
      g.type = CUDA_R_32F;
      g.compute = at::globalContext().allowTF32CuBLAS() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                        : CUBLAS_COMPUTE_32F;
      break;
    default: g.type = CUDA_R_64F, g.compute = CUBLAS_COMPUTE_64F; break;
  }
  return g;
}

// Half types accumulate in float32 all the way: split-K partial sums too.
class NoReducedPrecisionReduction {
 public:
  explicit NoReducedPrecisionReduction(cublasHandle_t handle) : handle_(handle) {
    TORCH_CUDABLAS_CHECK(cublasGetMathMode(handle_, &saved_));
    TORCH_CUDABLAS_CHECK(cublasSetMathMode(
        handle_, static_cast<cublasMath_t>(saved_ | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  ~NoReducedPrecisionReduction() { cublasSetMathMode(handle_, saved_); }

 private:
  cublasHandle_t handle_;
  cublasMath_t saved_;
};

}  // namespace

void square_matmul_panels_cublas(const at::Tensor& x, const SquareWeight& w, const std::optional<at::Tensor>& bias,
                                 int64_t rows, int64_t n, const square_matmul::PanelPlan& plan) {
  TORCH_INTERNAL_ASSERT(plan.rows_per_block >= 1 && plan.blocks >= 1 && plan.blocks <= PanelBlocks::kMax);
  const int64_t row_bytes = n * static_cast<int64_t>(x.element_size());
  const int blocks = plan.blocks;
  const auto byte_options = x.options().dtype(at::kByte);
  std::vector<at::Tensor> storage;
  std::vector<char*> block(blocks);
  if (plan.small_blocks) {
    for (int b = 0; b < blocks; ++b) {
      storage.push_back(at::empty({plan.block_bytes}, byte_options));
      block[b] = static_cast<char*>(storage.back().data_ptr());
    }
  } else {  // one allocation, so one segment holds every block
    storage.push_back(at::empty({blocks * plan.block_bytes}, byte_options));
    for (int b = 0; b < blocks; ++b) {
      block[b] = static_cast<char*>(storage[0].data_ptr()) + b * plan.block_bytes;
    }
  }

  const auto main = at::cuda::getCurrentCUDAStream();
  const PanelGemm gemm = make_panel_gemm(w, x.scalar_type(), n);
  std::optional<NoReducedPrecisionReduction> fp32_sums;
  if (x.element_size() == 2) fp32_sums.emplace(gemm.handle);
  const bool batched = plan.batched && blocks > 1;

  // Pointer arrays for the batched GEMM, in block 0's tail, written by a
  // small kernel (no host staging): the weight once per block, every block, then
  // the x pointers of a run of sub-panels (rows_per_block rows each),
  // rewritten when a panel goes past the run. The writes and the GEMMs are
  // all on the main stream, so a rewrite never overtakes a GEMM still
  // reading the previous run.
  const void** w_array = nullptr;
  void** out_array = nullptr;
  const void** x_array = nullptr;
  int64_t x_run_first = 0, x_run_capacity = 0, x_run_count = 0;
  const char* x_bytes = static_cast<const char*>(x.const_data_ptr());
  const int64_t sub_panel_bytes = plan.rows_per_block * row_bytes;
  auto write_x_run = [&](const void** dst, const PanelBlocks& fixed, int fixed_count,
                         int64_t first_sub_panel) {
    const int64_t total = (rows + plan.rows_per_block - 1) / plan.rows_per_block;
    x_run_first = first_sub_panel;
    x_run_count = std::min(x_run_capacity, total - first_sub_panel);
    check_launch(kernels::write_panel_pointers(dst, fixed, fixed_count,
                                                 x_bytes + first_sub_panel * sub_panel_bytes,
                                                 sub_panel_bytes, x_run_count, main.stream()), "square_matmul_");
  };
  if (batched) {
    const int64_t tail_offset = (sub_panel_bytes + 15) / 16 * 16;
    const int64_t capacity = (plan.block_bytes - tail_offset) / static_cast<int64_t>(sizeof(void*));
    TORCH_INTERNAL_ASSERT(2 * blocks <= PanelBlocks::kMax && capacity >= 3 * blocks);
    char* tail = block[0] + tail_offset;
    w_array = reinterpret_cast<const void**>(tail);
    out_array = reinterpret_cast<void**>(tail + blocks * sizeof(void*));
    x_array = reinterpret_cast<const void**>(tail + 2 * blocks * sizeof(void*));
    x_run_capacity = capacity - 2 * blocks;
    PanelBlocks fixed{};
    for (int b = 0; b < blocks; ++b) fixed.ptr[b] = gemm.w, fixed.ptr[blocks + b] = block[b];
    write_x_run(w_array, fixed, 2 * blocks, 0);
  }

  const bool has_bias = bias.has_value() && bias->defined();
  const auto kind = scalar_kind(x.scalar_type());
  const int64_t panel_rows = plan.panel_rows();
  for (int64_t start = 0; start < rows; start += panel_rows) {
    const int64_t count = std::min(panel_rows, rows - start);
    const int64_t full = count / plan.rows_per_block;
    const int64_t rest = count % plan.rows_per_block;
    const int64_t first_sub_panel = start / plan.rows_per_block;
    if (batched && full > 1) {
      if (first_sub_panel + full > x_run_first + x_run_count) {
        write_x_run(x_array, PanelBlocks{}, 0, first_sub_panel);
      }
      gemm.batched(w_array, x_array + (first_sub_panel - x_run_first), out_array,
                   plan.rows_per_block, static_cast<int>(full));
    } else {
      for (int64_t b = 0; b < full; ++b) {
        gemm.one(x_bytes + (start + b * plan.rows_per_block) * row_bytes, block[b],
                 plan.rows_per_block);
      }
    }
    if (rest > 0) gemm.one(x_bytes + (start + full * plan.rows_per_block) * row_bytes, block[full], rest);

    // The GEMM above is done with the panel's rows before this copy, on the
    // same stream, overwrites them; the next GEMM reuses the blocks after it.
    PanelBlocks blocks_of_panel{};
    const int used = static_cast<int>(full + (rest > 0 ? 1 : 0));
    for (int b = 0; b < used; ++b) blocks_of_panel.ptr[b] = block[b];
    check_launch(kernels::copy_panel_blocks(
        kind, static_cast<char*>(x.data_ptr()) + start * row_bytes, blocks_of_panel, used,
        plan.rows_per_block, count, n, has_bias ? bias->const_data_ptr() : nullptr,
        main.stream()), "square_matmul_");
  }
}


}  // namespace make_inplace
