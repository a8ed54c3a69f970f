// square_matmul_ on CUDA: checks, the device facts the routing policy needs,
// the policy's plan (square_matmul_route.h, docs/routing.md), and its
// execution: the Hopper wgmma kernels, the fp32 FFMA kernel, cuBLAS on row
// panels (square_matmul_cublas.cpp) or the zero-workspace waves kernel.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <mutex>
#include <vector>

#include "make_inplace/kernels/square_matmul_ffma.h"
#include "make_inplace/kernels/square_matmul_waves.h"
#include "make_inplace/kernels/square_matmul_wgmma.h"
#include "make_inplace/kernels/square_matmul_wgmma_rows.h"
#include "make_inplace/launch_check.h"
#include "make_inplace/route_override.h"
#include "make_inplace/square_matmul.h"
#include "make_inplace/square_matmul_cublas.h"
#include "make_inplace/square_matmul_route.h"

namespace make_inplace {
namespace {

using kernels::ScalarKind;
using square_matmul::Route;

// The policy's device facts for (device, dtype, weight layout). None of them
// can change while the process runs (capability, build, occupancy), so each
// is asked once; asking also sets the kernels' attributes their launches need.
square_matmul::Device device_facts(int device, ScalarKind kind, bool transpose) {
  struct Known {
    int device;
    ScalarKind kind;
    bool transpose;
    square_matmul::Device facts;
  };
  static std::mutex mutex;
  static std::vector<Known> known;
  const std::lock_guard<std::mutex> lock(mutex);
  for (const Known& k : known) {
    if (k.device == device && k.kind == kind && k.transpose == transpose) return k.facts;
  }
  square_matmul::Device d;
  d.cuda = true;
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device);
  d.major = prop->major;
  d.minor = prop->minor;
  d.sm90a_built = kernels::square_matmul_wgmma_built();
  d.tensor_maps = kernels::square_matmul_wgmma_tensor_maps();
  const bool half = kind == ScalarKind::kFloat16 || kind == ScalarKind::kBFloat16;
  if (half && d.sm90a_built && d.tensor_maps && d.major == 9 && d.minor == 0) {
    for (int tiles = 1; tiles <= kernels::wgmma::kMaxTilesPerCta; ++tiles) {
      d.wgmma[tiles - 1] =
          kernels::square_matmul_wgmma_residency(kind, transpose, tiles, kernels::wgmma::kColTile);
      d.wgmma_narrow[tiles - 1] =
          kernels::square_matmul_wgmma_residency(kind, transpose, tiles, kernels::wgmma::kNarrowColTile);
    }
    d.wgmma_rows_ctas = kernels::square_matmul_wgmma_rows_residency(kind, transpose);
  }
  if (kind == ScalarKind::kFloat32) {
    for (int tiles = 1; tiles <= kernels::ffma::kMaxTilesPerCta; ++tiles) {
      d.ffma_ctas[tiles - 1] = kernels::square_matmul_ffma_resident_ctas(transpose, tiles);
    }
  }
  d.waves_max_width = kernels::square_matmul_waves_max_width(kind);
  known.push_back({device, kind, transpose, d});
  return d;
}

void square_matmul_cuda(const at::Tensor& x, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, bool transpose,
                        std::optional<int64_t> workspace_bytes) {
  const SquareWeight w = check_square_matmul_args(x, weight, bias, transpose, workspace_bytes);
  const c10::cuda::CUDAGuard guard(x.device());
  const square_matmul::Call call = square_matmul_call(x, w, bias, workspace_bytes);
  if (call.rows == 0) return;
  const square_matmul::Plan plan = square_matmul::plan(
      call, device_facts(x.get_device(), call.kind, call.transpose), route_override().square_matmul);
  TORCH_CHECK(plan.route != Route::kUnsupported, "make_inplace.", square_matmul::unsupported_message(call));

  const void* bias_ptr = bias.has_value() && bias->defined() ? bias->const_data_ptr() : nullptr;
  const auto stream = at::cuda::getCurrentCUDAStream().stream();
  at::Tensor counters;
  if (plan.counter_bytes > 0) counters = at::empty({plan.counter_bytes}, x.options().dtype(at::kByte));
  uint32_t* counter_ptr = counters.defined() ? static_cast<uint32_t*>(counters.data_ptr()) : nullptr;
  switch (plan.route) {
    case Route::kWgmmaCounted:
    case Route::kWgmmaClusters:
    case Route::kWgmmaGrid:
      check_launch(kernels::square_matmul_wgmma(call.kind, x.data_ptr(), w.matrix.const_data_ptr(), bias_ptr,
                                                call.rows, call.n, w.transpose, plan.groups, counter_ptr, stream),
                   "square_matmul_");
      return;
    case Route::kWgmmaRows:
      check_launch(kernels::square_matmul_wgmma_rows(call.kind, x.data_ptr(), w.matrix.const_data_ptr(), bias_ptr,
                                                     call.rows, call.n, w.transpose, plan.groups.groups, stream),
                   "square_matmul_");
      return;
    case Route::kFfmaCounted:
    case Route::kFfmaGrid:
      check_launch(kernels::square_matmul_ffma(x.data_ptr<float>(), w.matrix.const_data_ptr<float>(),
                                               static_cast<const float*>(bias_ptr), call.rows, call.n, w.transpose,
                                               plan.groups, counter_ptr, stream),
                   "square_matmul_");
      return;
    case Route::kPanelsSmallBlocks:
    case Route::kPanelsOneBuffer:
      square_matmul_panels_cublas(x, w, bias, call.rows, call.n, plan.panels);
      return;
    case Route::kWaves:
      check_launch(kernels::square_matmul_waves(call.kind, x.data_ptr(), w.matrix.const_data_ptr(), bias_ptr,
                                                call.rows, call.n, w.transpose, stream),
                   "square_matmul_");
      return;
    default:
      TORCH_INTERNAL_ASSERT(false, "square_matmul_: no CUDA route ", square_matmul::route_name(plan.route));
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CUDA, m) {
  m.impl("square_matmul_", &square_matmul_cuda);
}

}  // namespace make_inplace
