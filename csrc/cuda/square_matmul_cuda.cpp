// square_matmul_ on CUDA. Two ways to write x <- x @ W over x:
//  * panels: for each panel of rows, cuBLAS writes panel @ W into workspace
//    blocks, then a copy kernel moves the results over the panel (adding the
//    bias), on the current stream. (Two halves with the copy of one on a side
//    stream under the GEMM of the other measured slower on an H100: the copy
//    kernel finds no free SM while the GEMM runs, and half-size GEMMs fill
//    the GPU less; benchmarks/results/h100/sweep_square_matmul_panels.txt.)
//  * fused: one kernel that holds results on chip until the rows they
//    replace are consumed (no workspace at all): wgmma on Hopper for 16-bit
//    types (square_matmul_wgmma), mma.sync/FFMA/DFMA elsewhere
//    (square_matmul_fused).
//  * ffma: fp32 without TF32 on CUDA cores, one kernel over all of x with a
//    counter per 128-row block (square_matmul_ffma).
// The Hopper kernel runs whenever it takes the case and there are enough
// tiles to fill the GPU, whatever the workspace bound: it needs none and is
// faster than panels. Otherwise the panel route is taken when the workspace
// bound allows panels big enough for the GEMM to fill the GPU, and the fused
// kernel runs when it does not.
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "make_inplace/kernels/square_matmul_ffma.h"
#include "make_inplace/kernels/square_matmul_fused.h"
#include "make_inplace/kernels/square_matmul_panels.h"
#include "make_inplace/kernels/square_matmul_wgmma.h"
#include "make_inplace/launch_check.h"
#include "make_inplace/square_matmul.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

using kernels::PanelBlocks;

// The caching allocator rounds requests: up to 1 MiB comes from the small
// pool's 2 MiB segments (two 1 MiB blocks share one), 1-10 MiB from a 20 MiB
// segment, and from 10 MiB up it rounds to 2 MiB (c10's AllocatorConfig.h:
// kSmallSize, kSmallBuffer, kMinLargeAlloc, kLargeBuffer, kRoundLarge). To
// keep the *reserved* memory within the bound on a cold allocator, a bound of
// 10 MiB or more gets one buffer rounded down to 2 MiB, and a bound of 2-10
// MiB gets separate 1 MiB blocks, two per 2 MiB of bound; the GEMM then
// writes several blocks in one batched call.
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kSmallBlockBytes = kMiB;
// Block 0 of the small blocks keeps cuBLAS's device pointer arrays in its
// last bytes (no allocation of their own, which would cost a segment).
constexpr int64_t kPointerTailBytes = 4096;

// Below this many 128x128 result tiles per panel (about three quarters of an
// H100/H200's 132 SMs) one panel's GEMM no longer fills the GPU and launches
// dominate; the fused kernel runs instead.
constexpr int64_t kMinPanelTiles = 96;

// The fused kernel's speed as a share of cuBLAS's on an H100 (mma.sync for
// 16-bit types, FFMA otherwise). A panel made of 1 MiB blocks of r rows
// keeps about r / (128 * ceil(r / 128)) of cuBLAS's 128-row tiles busy; when
// that share is below the fused kernel's, the fused kernel is faster
// (measured: fp32 (4097, 8192), r = 31, 0.38x vs fused 0.45x; bf16 r = 63,
// 0.45x vs 0.24x).
double fused_share_of_cublas(int64_t element_size) { return element_size == 2 ? 0.3 : 0.5; }

// Below this many 128 x 256 result tiles the Hopper kernel leaves most SMs
// idle (one cluster per 128-row block), and square_matmul_fused's 16-row
// tiles spread small row counts better. MAKE_INPLACE_WGMMA_MIN_TILES
// overrides it (tests use 0 to send every shape the kernel takes to it).
constexpr int64_t kWgmmaMinTiles = 128;

// The fp32 FFMA kernel needs this many 128 x 128 result tiles to beat the
// older routes (H100, TF32 off): counted, 256 tiles (4096 x 1024, every CTA
// of the grid busy) run at 0.96x torch.matmul; clusters, which fit fewer
// CTAs at once, reach 0.61x at 256 tiles against the fused kernel's 0.65x,
// and 0.73x at 512 (16384 x 512) against its 0.54x
// (benchmarks/results/h100/sweep_square_matmul_ffma.txt).
// MAKE_INPLACE_FFMA_MIN_TILES overrides both (tests use 0 to send every shape
// the kernel takes to it).
constexpr int64_t kFfmaCountedMinTiles = 256;
constexpr int64_t kFfmaClusterMinTiles = 512;
// The width from which fp32 keeps the panel route when its buffer is
// contiguous (see square_matmul_cuda). MAKE_INPLACE_FFMA_PANELS_FROM_N
// overrides it (sweeps).
constexpr int64_t kFfmaPanelsFromN = 4096;

// Switches for comparisons, read per call so one process can sweep them
// (benchmarks/sweep_square_matmul_panels.py).
int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoll(v) : fallback;
}

struct PanelPlan {
  bool small_blocks = false;   // separate 1 MiB allocations, else one buffer
  int blocks = 0;              // GEMM outputs of one panel
  int64_t block_bytes = 0;
  int64_t rows_per_block = 0;  // 0: no panel route within the bound
  int64_t panel_rows() const { return rows_per_block * blocks; }
};

PanelPlan plan_panels(int64_t bound, int64_t row_bytes, int64_t rows) {
  PanelPlan p;
  if (bound >= 10 * kMiB) {
    p.blocks = 1;
    p.block_bytes = bound / (2 * kMiB) * (2 * kMiB);
    p.rows_per_block = p.block_bytes / row_bytes;
  } else if (bound >= 2 * kMiB) {
    p.small_blocks = true;
    p.blocks = static_cast<int>(std::min<int64_t>(2 * (bound / (2 * kMiB)), PanelBlocks::kMax));
    p.block_bytes = kSmallBlockBytes;
    p.rows_per_block = (kSmallBlockBytes - kPointerTailBytes) / row_bytes;
  }
  // cuBLAS takes int sizes; more rows than x has would only waste workspace.
  p.rows_per_block = std::min<int64_t>({p.rows_per_block, rows, int64_t{1} << 30});
  if (p.rows_per_block >= 1) {
    p.blocks = static_cast<int>(
        std::min<int64_t>(p.blocks, (rows + p.rows_per_block - 1) / p.rows_per_block));
  }
  return p;
}

// Whether the panels beat the fused kernel: they must fill the GPU (or hold
// all of x at once), and small blocks must keep enough of each tile busy.
bool panels_pay(const PanelPlan& p, int64_t rows, int64_t n, int64_t element_size) {
  if (p.rows_per_block < 1) return false;
  const int64_t min_tiles = env_int("MAKE_INPLACE_PANEL_MIN_TILES", kMinPanelTiles);
  const bool fills_gpu = p.panel_rows() * n >= min_tiles * 128 * 128 || p.panel_rows() >= rows;
  const int64_t tile_rows = (p.rows_per_block + 127) / 128 * 128;
  const bool tiles_busy = !p.small_blocks || static_cast<double>(p.rows_per_block) / tile_rows >=
                                                 fused_share_of_cublas(element_size);
  return fills_gpu && tiles_busy;
}

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

void panel_square_matmul(const at::Tensor& x, const SquareWeight& w,
                         const std::optional<at::Tensor>& bias, int64_t rows,
                         int64_t n, const PanelPlan& plan) {
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
  // MAKE_INPLACE_PANEL_BATCHED=0 (for comparisons): one GEMM per block.
  const bool batched = blocks > 1 && env_int("MAKE_INPLACE_PANEL_BATCHED", 1) != 0;

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

void square_matmul_cuda(const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, bool transpose,
                        std::optional<int64_t> workspace_bytes) {
  const SquareWeight w =
      check_square_matmul_args(x, weight, bias, transpose, workspace_bytes);
  const int64_t n = x.size(-1);
  const int64_t rows = x.numel() / n;
  const c10::cuda::CUDAGuard guard(x.device());
  if (rows == 0) return;

  const auto kind = scalar_kind(x.scalar_type());
  const bool has_bias = bias.has_value() && bias->defined();
  const auto stream = at::cuda::getCurrentCUDAStream().stream();
  const int64_t tiles = (rows + 127) / 128 * ((n + 255) / 256);
  if (tiles >= env_int("MAKE_INPLACE_WGMMA_MIN_TILES", kWgmmaMinTiles) &&
      kernels::square_matmul_wgmma_supports(kind, rows, n, x.const_data_ptr(), w.matrix.const_data_ptr(),
                                            w.transpose)) {
    // With a bound of 2 MiB or more, a counter per row-block (at most 1 MiB,
    // from the small pool's 2 MiB segments) lets plain CTAs fill every SM;
    // otherwise clusters own the row-blocks and nothing is allocated.
    // MAKE_INPLACE_WGMMA_COUNTERS=0 forces the clusters (sweeps).
    at::Tensor counters;
    const int64_t counter_bytes = kernels::square_matmul_wgmma_counter_bytes(rows);
    if (workspace_bound(x, workspace_bytes) >= 2 * kMiB && counter_bytes <= kSmallBlockBytes &&
        env_int("MAKE_INPLACE_WGMMA_COUNTERS", 1) != 0) {
      counters = at::empty({counter_bytes}, x.options().dtype(at::kByte));
    }
    check_launch(kernels::square_matmul_wgmma(
        kind, x.data_ptr(), w.matrix.const_data_ptr(), has_bias ? bias->const_data_ptr() : nullptr, rows, n,
        w.transpose, stream, counters.defined() ? static_cast<uint32_t*>(counters.data_ptr()) : nullptr), "square_matmul_");
    return;
  }

  const int64_t bound = workspace_bound(x, workspace_bytes);
  const int64_t row_bytes = n * static_cast<int64_t>(x.element_size());
  const PanelPlan plan = plan_panels(bound, row_bytes, rows);

  // fp32 without TF32: cuBLAS would run SGEMM too, but only on panels of
  // the workspace, each one wave of the GPU; the FFMA kernel runs the whole
  // product as one in-place kernel. Its row-block counters come from the
  // small pool (at most 1 MiB, in a 2 MiB segment), hence the 2 MiB floor on
  // the bound; below it, clusters need no memory at all (n <= 2048, sm_90).
  if (x.scalar_type() == at::kFloat && !at::globalContext().allowTF32CuBLAS()) {
    const int64_t counter_bytes = kernels::square_matmul_ffma_counter_bytes(rows);
    const bool counted = bound >= 2 * kMiB && counter_bytes <= kSmallBlockBytes;
    const int64_t tiles_128 = (rows + 127) / 128 * ((n + 127) / 128);
    // From n = 4096 on, one contiguous panel buffer (a bound of 10 MiB or
    // more) keeps cuBLAS ahead: the copy weighs 1/n of the GEMM, while the
    // FFMA kernel's groups of 32 CTAs fill 256 of an H100's 264 slots.
    const bool panels_ahead = n >= env_int("MAKE_INPLACE_FFMA_PANELS_FROM_N", kFfmaPanelsFromN) &&
                              !plan.small_blocks && panels_pay(plan, rows, n, sizeof(float));
    const void* bias_ptr = has_bias ? bias->const_data_ptr() : nullptr;
    const int64_t min_tiles =
        env_int("MAKE_INPLACE_FFMA_MIN_TILES", counted ? kFfmaCountedMinTiles : kFfmaClusterMinTiles);
    if (tiles_128 >= min_tiles && !panels_ahead &&
        kernels::square_matmul_ffma_supports(rows, n, x.const_data_ptr(), w.matrix.const_data_ptr(), bias_ptr,
                                             w.transpose, counted)) {
      at::Tensor counters;
      if (counted) counters = at::empty({counter_bytes}, x.options().dtype(at::kByte));
      check_launch(kernels::square_matmul_ffma(
          x.data_ptr<float>(), w.matrix.const_data_ptr<float>(), static_cast<const float*>(bias_ptr), rows, n,
          w.transpose, counted ? static_cast<uint32_t*>(counters.data_ptr()) : nullptr, stream), "square_matmul_");
      return;
    }
  }

  const bool fused_ok = kernels::square_matmul_fused_supports(kind, n);
  if (plan.rows_per_block >= 1 &&
      (panels_pay(plan, rows, n, x.element_size()) || !fused_ok)) {
    panel_square_matmul(x, w, bias, rows, n, plan);
    return;
  }
  TORCH_CHECK(fused_ok, "square_matmul_: x's width n = ", n,
              " is too wide for the zero-workspace kernel on this GPU and "
              "workspace_bytes allows less than one row (", row_bytes,
              " bytes) of workspace; pass a larger workspace_bytes");
  check_launch(kernels::square_matmul_fused(
      kind, x.data_ptr(), w.matrix.const_data_ptr(),
      has_bias ? bias->const_data_ptr() : nullptr, rows, n, w.transpose,
      at::globalContext().allowTF32CuBLAS(), stream), "square_matmul_");
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CUDA, m) {
  m.impl("square_matmul_", &square_matmul_cuda);
}

}  // namespace make_inplace
