// cuBLAS / cuBLASLt calls of square_matmul_'s panel route (square_matmul_gemm.h).
#include "make_inplace/square_matmul_gemm.h"

#include <ATen/Context.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace make_inplace {
namespace {

// MAKE_INPLACE_PANEL_LT=0 (for comparisons): full panels through
// cublasGemmBatchedEx instead of the cuBLASLt plan.
bool lt_enabled() {
  const char* v = std::getenv("MAKE_INPLACE_PANEL_LT");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// The kernel cuBLASLt's heuristic picks for one product shape, found once per
// process: the query costs more host time than the product it plans.
using AlgoKey = std::tuple<int, int, int, int, int, int64_t, int, size_t>;

std::optional<cublasLtMatmulAlgo_t> find_algo(const AlgoKey& key, cublasLtHandle_t handle,
                                              cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t w,
                                              cublasLtMatrixLayout_t x, cublasLtMatrixLayout_t out,
                                              size_t workspace_size, bool fp32_reduction) {
  static std::mutex mutex;
  static std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto hit = cache.find(key);
  if (hit != cache.end()) return hit->second;

  cublasLtMatmulPreference_t pref = nullptr;
  TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_workspace = workspace_size;
  TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
  if (fp32_reduction) {  // split-K partial sums in the compute type (fp32), never in bf16/fp16
    const uint32_t mask = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask)));
  }
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    const uint32_t bytes = 16;
    TORCH_CUDABLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle, op, w, x, out, out, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  std::optional<cublasLtMatmulAlgo_t> algo;
  if (status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    algo = result.algo;
  }
  cache.emplace(key, algo);
  return algo;
}

cublasLtMatrixLayout_t pointer_array_layout(cudaDataType_t type, int64_t rows, int64_t cols,
                                            int64_t ld, int batch) {
  cublasLtMatrixLayout_t layout = nullptr;
  TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  const int32_t count = batch;
  const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
  TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
  TORCH_CUDABLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      layout, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
  return layout;
}

}  // namespace

struct PanelGemm::LtPlan {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, out = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void* workspace = nullptr;
  size_t workspace_size = 0;
  ~LtPlan() {
    for (auto layout : {w, x, out}) {
      if (layout != nullptr) cublasLtMatrixLayoutDestroy(layout);
    }
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

PanelGemm::PanelGemm(const SquareWeight& w, at::ScalarType dtype, int64_t n, int64_t rows_per_block,
                     int blocks, bool aligned)
    : handle_(at::cuda::getCurrentCUDABlasHandle()),  // on the current stream
      op_w_(w.transpose ? CUBLAS_OP_T : CUBLAS_OP_N),
      n_(static_cast<int>(n)),
      rows_per_block_(rows_per_block),
      blocks_(blocks),
      w_(w.matrix.const_data_ptr()) {
  switch (dtype) {
    case at::kHalf: type_ = CUDA_R_16F, compute_ = CUBLAS_COMPUTE_32F; break;
    case at::kBFloat16: type_ = CUDA_R_16BF, compute_ = CUBLAS_COMPUTE_32F; break;
    case at::kFloat:
      type_ = CUDA_R_32F;
      compute_ = at::globalContext().allowTF32CuBLAS() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      break;
    default: type_ = CUDA_R_64F, compute_ = CUBLAS_COMPUTE_64F; break;
  }
  // Half types accumulate in float32 all the way: split-K partial sums too.
  const bool half = type_ == CUDA_R_16F || type_ == CUDA_R_16BF;
  TORCH_CUDABLAS_CHECK(cublasGetMathMode(handle_, &saved_math_mode_));
  if (half) {
    TORCH_CUDABLAS_CHECK(cublasSetMathMode(
        handle_, static_cast<cublasMath_t>(saved_math_mode_ | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  }
  if (blocks < 2 || !aligned || !lt_enabled()) return;

  auto plan = std::make_unique<LtPlan>();
  plan->handle = at::cuda::getCurrentCUDABlasLtHandle();
  plan->workspace = at::cuda::getCUDABlasLtWorkspace();
  plan->workspace_size = at::cuda::getCUDABlasLtWorkspaceSize();
  const cudaDataType_t scale = compute_ == CUBLAS_COMPUTE_64F ? CUDA_R_64F : CUDA_R_32F;
  TORCH_CUDABLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, compute_, scale));
  const int32_t op_w = op_w_, op_x = CUBLAS_OP_N;
  TORCH_CUDABLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_w, sizeof(op_w)));
  TORCH_CUDABLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_x, sizeof(op_x)));
  plan->w = pointer_array_layout(type_, n, n, n, blocks);
  plan->x = pointer_array_layout(type_, n, rows_per_block, n, blocks);
  plan->out = pointer_array_layout(type_, n, rows_per_block, n, blocks);
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  const AlgoKey key{device, static_cast<int>(type_), static_cast<int>(compute_), op_w, n_,
                    rows_per_block, blocks, plan->workspace_size};
  const auto algo = find_algo(key, plan->handle, plan->op, plan->w, plan->x, plan->out,
                              plan->workspace_size, half);
  if (!algo) return;  // no cuBLASLt kernel for this shape: cublasGemmBatchedEx serves
  plan->algo = *algo;
  lt_ = plan.release();
}

PanelGemm::~PanelGemm() {
  delete lt_;
  cublasSetMathMode(handle_, saved_math_mode_);
}

const void* PanelGemm::alpha() const {
  return compute_ == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&one64_) : &one32_;
}
const void* PanelGemm::beta() const {
  return compute_ == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&zero64_) : &zero32_;
}

void PanelGemm::one(const void* x_rows, void* out, int64_t count) const {
  TORCH_CUDABLAS_CHECK(cublasGemmEx(handle_, op_w_, CUBLAS_OP_N, n_, static_cast<int>(count), n_,
                                    alpha(), w_, type_, n_, x_rows, type_, n_, beta(), out, type_,
                                    n_, compute_, CUBLAS_GEMM_DEFAULT));
}

void PanelGemm::batched(const void* const* w_array, const void* const* x_array,
                        void* const* out_array, int batch) const {
  if (lt_ != nullptr && batch == blocks_) {
    TORCH_CUDABLAS_CHECK(cublasLtMatmul(lt_->handle, lt_->op, alpha(), w_array, lt_->w, x_array,
                                        lt_->x, beta(), out_array, lt_->out, const_cast<void**>(out_array), lt_->out,
                                        &lt_->algo, lt_->workspace, lt_->workspace_size,
                                        at::cuda::getCurrentCUDAStream().stream()));
    return;
  }
  TORCH_CUDABLAS_CHECK(cublasGemmBatchedEx(handle_, op_w_, CUBLAS_OP_N, n_,
                                           static_cast<int>(rows_per_block_), n_, alpha(), w_array,
                                           type_, n_, x_array, type_, n_, beta(), out_array, type_,
                                           n_, batch, compute_, CUBLAS_GEMM_DEFAULT));
}

}  // namespace make_inplace
