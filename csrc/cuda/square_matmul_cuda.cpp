// square_matmul_ on CUDA. Two ways to write x <- x @ W over x:
//  * panels: for each panel of rows, the vendor GEMM writes panel @ W into a
//    bounded workspace, and a copy on a side stream moves it over the panel
//    while the GEMM of the next panel runs (two workspace halves, events).
//  * fused: one kernel that holds results on chip until the rows they
//    replace are consumed (no workspace at all).
// The panel route is taken when the workspace bound allows panels big enough
// for the GEMM to fill the GPU; otherwise the fused kernel runs.
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "make_inplace/kernels/square_matmul_fused.h"
#include "make_inplace/square_matmul.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

// The caching allocator rounds requests: up to 1 MiB comes from a 2 MiB
// segment, 1-10 MiB from a 20 MiB segment, and from 10 MiB up it rounds to
// 2 MiB. To keep the *reserved* memory within the bound on a cold allocator,
// only sizes whose segment fits the bound are used (see c10's
// AllocatorConfig.h: kSmallSize, kMinLargeAlloc, kRoundLarge).
constexpr int64_t kMiB = int64_t{1} << 20;

int64_t allocator_exact_workspace(int64_t bound) {
  if (bound >= 10 * kMiB) return bound / (2 * kMiB) * (2 * kMiB);
  if (bound >= 2 * kMiB) return kMiB;
  return 0;
}

// Below this many result elements per panel (96 tiles of 128x128, about
// three quarters of an H100/H200's 132 SMs) the GEMM of one panel no longer
// fills the GPU and launches dominate. At 132 tiles, fp32 (16384, 4096) and
// (65536, 768) (512 and 2048-row panels, 128 and 96 tiles) fell to the fused
// FFMA kernel at 0.5x of cuBLAS.
constexpr int64_t kMinPanelElements = int64_t{96} * 128 * 128;

void panel_square_matmul(const at::Tensor& x, const SquareWeight& w,
                         const std::optional<at::Tensor>& bias, int64_t rows,
                         int64_t n, int64_t workspace_size) {
  const int64_t half_rows =
      std::min(rows, workspace_size / 2 / (n * static_cast<int64_t>(x.element_size())));
  const int64_t panels = (rows + half_rows - 1) / half_rows;
  const at::Tensor x2d = x.view({rows, n});
  const at::Tensor mat = w.transpose ? w.matrix.t() : w.matrix;
  const bool has_bias = bias.has_value() && bias->defined();
  // One allocation split in two halves, so one segment holds both.
  at::Tensor workspace = at::empty({std::min<int64_t>(2, panels), half_rows, n},
                                   x.options());
  const auto main = at::cuda::getCurrentCUDAStream();
  const auto side = at::cuda::getStreamFromPool(false, x.device().index());
  at::cuda::CUDAEvent gemm_done[2], copy_done[2];
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t start = p * half_rows;
    const int64_t count = std::min(half_rows, rows - start);
    const int slot = static_cast<int>(p % 2);
    if (p >= 2) copy_done[slot].block(main);  // the slot's last copy is done
    at::Tensor result = workspace[slot].narrow(0, 0, count);
    const at::Tensor panel = x2d.narrow(0, start, count);
    if (has_bias) {
      at::addmm_out(result, *bias, panel, mat);
    } else {
      at::mm_out(result, panel, mat);
    }
    gemm_done[slot].record(main);
    gemm_done[slot].block(side);
    C10_CUDA_CHECK(cudaMemcpyAsync(panel.data_ptr(), result.data_ptr(),
                                   result.nbytes(), cudaMemcpyDeviceToDevice,
                                   side.stream()));
    copy_done[slot].record(side);
  }
  // The workspace is freed on the main stream, which must first see every copy.
  for (int slot = 0; slot < 2 && slot < panels; ++slot) copy_done[slot].block(main);
}

void square_matmul_cuda(const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, bool transpose,
                        std::optional<int64_t> workspace_bytes) {
  const SquareWeight w =
      check_square_matmul_args(x, weight, bias, transpose, workspace_bytes);
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  const c10::cuda::CUDAGuard guard(x.device());
  if (rows == 0) return;

  const int64_t row_bytes = n * static_cast<int64_t>(x.element_size());
  const int64_t workspace_size =
      allocator_exact_workspace(workspace_bound(x, workspace_bytes));
  const int64_t half_rows = std::min(rows, workspace_size / 2 / row_bytes);
  const auto kind = scalar_kind(x.scalar_type());
  const bool fused_ok = kernels::square_matmul_fused_supports(kind, n);
  const bool panels_fill_gpu =
      half_rows * n >= kMinPanelElements || half_rows == rows;
  if (half_rows >= 1 && (panels_fill_gpu || !fused_ok)) {
    panel_square_matmul(x, w, bias, rows, n, workspace_size);
    return;
  }
  TORCH_CHECK(fused_ok, "square_matmul_: x's width n = ", n,
              " is too wide for the zero-workspace kernel on this GPU and "
              "workspace_bytes allows less than one row (", row_bytes,
              " bytes) of workspace; pass a larger workspace_bytes");
  const bool has_bias = bias.has_value() && bias->defined();
  C10_CUDA_CHECK(kernels::square_matmul_fused(
      kind, x.data_ptr(), w.matrix.const_data_ptr(),
      has_bias ? bias->const_data_ptr() : nullptr, rows, n, w.transpose,
      at::globalContext().allowTF32CuBLAS(),
      at::cuda::getCurrentCUDAStream().stream()));
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CUDA, m) {
  m.impl("square_matmul_", &square_matmul_cuda);
}

}  // namespace make_inplace
