// The MindSpore AOT entry points on CUDA (see bridge.h for the convention):
// the same argument checks as cpu.cpp (args.h), then the same CUDA kernels
// the PyTorch ops launch, on the stream MindSpore passes. MindSpore allocates
// the outputs, so the in-place kernels run on the output after an async
// device copy of the input: the ops are out-of-place here. Nothing here
// allocates device memory; the layer norm backward's workspace is an output
// MindSpore allocates (MakeInplaceLayerNormBackwardWorkspace sizes it).
#include <cuda_runtime.h>

#include "args.h"
#include "bridge.h"
#include "make_inplace/kernels/layer_norm.h"
#include "make_inplace/kernels/outer_product.h"
#include "make_inplace/kernels/softmax.h"
#include "make_inplace/kernels/square_matmul_waves.h"
#include "make_inplace/kernels/trilinear.h"

namespace make_inplace::mindspore {
namespace {

int cuda_result(const Call& c, const char* what, cudaError_t err) {
  if (err != cudaSuccess) {
    return fail(kKernelFail, c.op, "%s failed: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err));
  }
  return kOk;
}

// Copies `bytes` from src to dst on the stream (a no-op for 0 bytes).
int copy_async(const Call& c, void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  if (bytes == 0) return kOk;
  return cuda_result(c, "cudaMemcpyAsync",
                     cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
}

int square_matmul(Call c, bool transpose, bool has_bias, cudaStream_t stream) {
  SquareMatmulArgs a{};
  if (int rc = parse_square_matmul(c, has_bias, &a)) return rc;
  if (a.rows == 0) return kOk;
  if (a.n > kernels::square_matmul_waves_max_width(a.kind)) {
    // The bridge has only the zero-workspace kernel (no cuBLAS): say so
    // rather than run anything else.
    return fail(kBadArgs, c.op,
                "n = %lld is wider than the zero-workspace square matmul handles for %s on this device; "
                "use the PyTorch op (row-panel route) for this width",
                static_cast<long long>(a.n), kind_name(a.kind));
  }
  if (int rc = copy_async(c, a.y, a.x, a.rows * a.n * kernels::element_size(a.kind), stream)) return rc;
  return cuda_result(c, "square_matmul_waves",
                     kernels::square_matmul_waves(a.kind, a.y, a.weight, a.bias, a.rows, a.n, transpose, stream));
}

int trilinear_forward(Call c, cudaStream_t stream) {
  TrilinearArgs a{};
  if (int rc = parse_trilinear_forward(c, &a)) return rc;
  return cuda_result(c, "trilinear_forward_cuda",
                     kernels::trilinear_forward_cuda(a.kind, trilinear_input(c.arg(0)), trilinear_input(c.arg(1)),
                                                     c.arg(2).data, a.n, a.f, stream));
}

int trilinear_backward(Call c, cudaStream_t stream) {
  TrilinearArgs a{};
  if (int rc = parse_trilinear_backward(c, &a)) return rc;
  return cuda_result(c, "trilinear_backward_cuda",
                     kernels::trilinear_backward_cuda(a.kind, trilinear_input(c.arg(0)), trilinear_input(c.arg(1)),
                                                      trilinear_input(c.arg(2)), c.arg(3).data, c.arg(4).data, a.n,
                                                      a.f, /*accumulate=*/false, stream));
}

int outer_product_forward(Call c, cudaStream_t stream) {
  OuterArgs o{};
  if (int rc = parse_outer_forward(c, &o)) return rc;
  return cuda_result(c, "outer_product_forward_cuda",
                     kernels::outer_product_forward_cuda(o.kind, outer_vector(c.arg(0).data, o.n),
                                                         outer_vector(c.arg(1).data, o.m), c.arg(2).data, o.batch,
                                                         o.n, o.m, stream));
}

int outer_product_backward(Call c, cudaStream_t stream) {
  OuterArgs o{};
  if (int rc = parse_outer_backward(c, &o)) return rc;
  return cuda_result(c, "outer_product_backward_cuda",
                     kernels::outer_product_backward_cuda(
                         o.kind, outer_matrix(c.arg(0).data, o.n, o.m), outer_vector(c.arg(1).data, o.n),
                         outer_vector(c.arg(2).data, o.m), c.arg(3).data, c.arg(4).data, o.batch, o.n, o.m,
                         /*accumulate=*/false, stream));
}

int softmax_forward(Call c, bool causal, bool has_mask, cudaStream_t stream) {
  SoftmaxArgs a{};
  if (int rc = parse_softmax_forward(c, causal, has_mask, &a)) return rc;
  const Tensor x = c.arg(0), y = c.arg(has_mask ? 2 : 1);
  if (x.numel() == 0) return kOk;
  if (int rc = copy_async(c, y.data, x.data, x.numel() * kernels::element_size(a.kind), stream)) return rc;
  return cuda_result(c, "softmax_forward_cuda",
                     kernels::softmax_forward_cuda(a.kind, y.data, a.outer, a.n, 1, 1.0, a.causal_rows, a.mask,
                                                   stream));
}

int softmax_backward(Call c, cudaStream_t stream) {
  SoftmaxArgs a{};
  if (int rc = parse_softmax_backward(c, &a)) return rc;
  if (a.outer == 0 || a.n == 0) return kOk;
  return cuda_result(c, "softmax_backward_cuda",
                     kernels::softmax_backward_cuda(a.kind, c.arg(0).data, c.arg(1).data, c.arg(2).data, a.outer,
                                                    a.n, 1, 1.0, stream));
}

int layer_norm_forward(Call c, bool has_weight, bool has_bias, cudaStream_t stream) {
  LayerNormArgs a{};
  int eps_i = 0;
  if (int rc = parse_layer_norm_forward(c, has_weight, has_bias, &a, &eps_i)) return rc;
  if (a.rows == 0) return kOk;
  // eps arrives as a device tensor (no attribute channel): one 8-byte copy
  // to the host, which waits for the stream up to this point.
  double eps = 0;
  if (int rc = cuda_result(c, "cudaMemcpyAsync (eps)",
                           cudaMemcpyAsync(&eps, c.arg(eps_i).data, sizeof(double), cudaMemcpyDeviceToHost, stream))) {
    return rc;
  }
  if (int rc = cuda_result(c, "cudaStreamSynchronize (eps)", cudaStreamSynchronize(stream))) return rc;
  const int y = eps_i + 1;
  if (int rc = copy_async(c, c.arg(y).data, c.arg(0).data, a.rows * a.n * kernels::element_size(a.kind), stream)) {
    return rc;
  }
  return cuda_result(c, "layer_norm_forward_cuda",
                     kernels::layer_norm_forward_cuda(a.kind, c.arg(y).data, a.weight, a.bias, a.rows, a.n, eps,
                                                      c.arg(y + 1).data, c.arg(y + 2).data, stream));
}

int layer_norm_backward(Call c, bool has_weight, bool has_bias, cudaStream_t stream) {
  LayerNormArgs a{};
  int rstd_i = 0;
  LayerNormGrads g{};
  if (int rc = parse_layer_norm_backward(c, has_weight, has_bias, &a, &rstd_i, &g)) return rc;
  void* grad_weight = has_weight ? c.arg(g.grad_weight).data : nullptr;
  void* grad_bias = has_bias ? c.arg(g.grad_bias).data : nullptr;
  if (a.rows == 0) {  // no rows: the parameter gradients are sums of nothing
    const size_t bytes = static_cast<size_t>(a.n * kernels::element_size(a.kind));
    if (grad_weight && bytes) {
      if (int rc = cuda_result(c, "cudaMemsetAsync", cudaMemsetAsync(grad_weight, 0, bytes, stream))) return rc;
    }
    if (grad_bias && bytes) {
      if (int rc = cuda_result(c, "cudaMemsetAsync", cudaMemsetAsync(grad_bias, 0, bytes, stream))) return rc;
    }
    return kOk;
  }
  const Tensor workspace = c.arg(g.workspace);
  const int64_t needed = kernels::layer_norm_backward_cuda_workspace(a.kind, a.rows, a.n, has_weight || has_bias);
  if (workspace.shape[0] < needed) {
    return fail(kBadArgs, c.op, "workspace must hold at least %lld bytes, got %lld", static_cast<long long>(needed),
                static_cast<long long>(workspace.shape[0]));
  }
  return cuda_result(c, "layer_norm_backward_cuda",
                     kernels::layer_norm_backward_cuda(a.kind, c.arg(0).data, c.arg(1).data, a.weight, a.bias,
                                                       c.arg(rstd_i).data, a.rows, a.n, c.arg(g.grad_input).data,
                                                       grad_weight, grad_bias, needed ? workspace.data : nullptr,
                                                       stream));
}

}  // namespace
}  // namespace make_inplace::mindspore

// The MindSpore AOT signature, spelled once; `stream` is MindSpore's cudaStream_t.
#define MAKE_INPLACE_MS_ENTRY(Name, ...)                                                   \
  MAKE_INPLACE_MS_EXPORT int Name(int nparam, void** params, int* ndims, int64_t** shapes, \
                                  const char** dtypes, void* stream_ptr, void* /*extra*/) { \
    using namespace make_inplace::mindspore;                                               \
    const Call c{#Name, nparam, params, ndims, shapes, dtypes};                            \
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);                           \
    return guarded(#Name, [&] { return __VA_ARGS__; });                                    \
  }

MAKE_INPLACE_MS_ENTRY(MakeInplaceSquareMatmul, square_matmul(c, false, false, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSquareMatmulT, square_matmul(c, true, false, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSquareMatmulBias, square_matmul(c, false, true, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSquareMatmulTBias, square_matmul(c, true, true, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceTrilinear, trilinear_forward(c, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceTrilinearBackward, trilinear_backward(c, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceOuterProduct, outer_product_forward(c, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceOuterProductBackward, outer_product_backward(c, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSoftmax, softmax_forward(c, false, false, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSoftmaxCausal, softmax_forward(c, true, false, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSoftmaxMask, softmax_forward(c, false, true, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSoftmaxCausalMask, softmax_forward(c, true, true, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSoftmaxBackward, softmax_backward(c, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNorm, layer_norm_forward(c, false, false, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormWeight, layer_norm_forward(c, true, false, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormBias, layer_norm_forward(c, false, true, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormWeightBias, layer_norm_forward(c, true, true, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormBackward, layer_norm_backward(c, false, false, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormBackwardWeight, layer_norm_backward(c, true, false, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormBackwardBias, layer_norm_backward(c, false, true, stream))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormBackwardWeightBias, layer_norm_backward(c, true, true, stream))

// Bytes of the layer norm backward's workspace output for ScalarKind `kind`.
MAKE_INPLACE_MS_EXPORT int64_t MakeInplaceLayerNormBackwardWorkspace(int kind, int64_t rows, int64_t n,
                                                                     int weight_or_bias) {
  return make_inplace::kernels::layer_norm_backward_cuda_workspace(
      static_cast<make_inplace::kernels::ScalarKind>(kind), rows, n, weight_or_bias != 0);
}
