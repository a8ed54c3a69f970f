// The MindSpore AOT entry points on the CPU (see bridge.h for the convention).
// Each checks its arguments, then runs the same torch-free kernel the PyTorch
// op runs. MindSpore allocates the outputs, so the in-place kernels run on the
// output after copying the input into it: the ops are out-of-place here.
#include <cstring>

#include "args.h"
#include "bridge.h"
#include "make_inplace/kernels/layer_norm.h"
#include "make_inplace/kernels/outer_product.h"
#include "make_inplace/kernels/softmax.h"
#include "make_inplace/kernels/square_matmul.h"
#include "make_inplace/kernels/trilinear.h"

namespace make_inplace::mindspore {
namespace {

int kernel_result(const Call& c, const char* kernel, int rc) {
  if (rc != 0) return fail(kKernelFail, c.op, "%s failed with code %d", kernel, rc);
  return kOk;
}

int square_matmul(Call c, bool transpose, bool has_bias) {
  SquareMatmulArgs a{};
  if (int rc = parse_square_matmul(c, has_bias, &a)) return rc;
  if (a.rows == 0) return kOk;
  std::memcpy(a.y, a.x, static_cast<size_t>(a.rows * a.n * kernels::element_size(a.kind)));
  return kernel_result(c, "square_matmul_rowwise",
                       kernels::square_matmul_rowwise(a.kind, a.y, a.weight, a.bias, a.rows, a.n, transpose));
}

int trilinear_forward(Call c) {
  TrilinearArgs a{};
  if (int rc = parse_trilinear_forward(c, &a)) return rc;
  return kernel_result(c, "trilinear_forward_cpu",
                       kernels::trilinear_forward_cpu(a.kind, trilinear_input(c.arg(0)), trilinear_input(c.arg(1)),
                                                      c.arg(2).data, a.n, a.f));
}

int trilinear_backward(Call c) {
  TrilinearArgs a{};
  if (int rc = parse_trilinear_backward(c, &a)) return rc;
  return kernel_result(c, "trilinear_backward_cpu",
                       kernels::trilinear_backward_cpu(a.kind, trilinear_input(c.arg(0)), trilinear_input(c.arg(1)),
                                                       trilinear_input(c.arg(2)), c.arg(3).data, c.arg(4).data, a.n,
                                                       a.f, /*accumulate=*/false));
}

int outer_product_forward(Call c) {
  OuterArgs o{};
  if (int rc = parse_outer_forward(c, &o)) return rc;
  return kernel_result(c, "outer_product_forward_cpu",
                       kernels::outer_product_forward_cpu(o.kind, outer_vector(c.arg(0).data, o.n),
                                                          outer_vector(c.arg(1).data, o.m), c.arg(2).data, o.batch,
                                                          o.n, o.m));
}

int outer_product_backward(Call c) {
  OuterArgs o{};
  if (int rc = parse_outer_backward(c, &o)) return rc;
  return kernel_result(c, "outer_product_backward_cpu",
                       kernels::outer_product_backward_cpu(
                           o.kind, outer_matrix(c.arg(0).data, o.n, o.m), outer_vector(c.arg(1).data, o.n),
                           outer_vector(c.arg(2).data, o.m), c.arg(3).data, c.arg(4).data, o.batch, o.n, o.m,
                           /*accumulate=*/false));
}

int softmax_forward(Call c, bool causal, bool has_mask) {
  SoftmaxArgs a{};
  if (int rc = parse_softmax_forward(c, causal, has_mask, &a)) return rc;
  const Tensor x = c.arg(0);
  if (x.numel() == 0) return kOk;
  std::memcpy(c.arg(has_mask ? 2 : 1).data, x.data, static_cast<size_t>(x.numel() * kernels::element_size(a.kind)));
  return kernel_result(c, "softmax_forward_cpu",
                       kernels::softmax_forward_cpu(a.kind, c.arg(has_mask ? 2 : 1).data, a.outer, a.n, 1, 1.0,
                                                    a.causal_rows, a.mask));
}

int softmax_backward(Call c) {
  SoftmaxArgs a{};
  if (int rc = parse_softmax_backward(c, &a)) return rc;
  if (a.outer == 0 || a.n == 0) return kOk;
  return kernel_result(c, "softmax_backward_cpu",
                       kernels::softmax_backward_cpu(a.kind, c.arg(0).data, c.arg(1).data, c.arg(2).data, a.outer,
                                                     a.n, 1, 1.0));
}

int layer_norm_forward(Call c, bool has_weight, bool has_bias) {
  LayerNormArgs a{};
  int eps_i = 0;
  if (int rc = parse_layer_norm_forward(c, has_weight, has_bias, &a, &eps_i)) return rc;
  if (a.rows == 0) return kOk;
  const double eps = *static_cast<const double*>(c.arg(eps_i).data);
  const int y = eps_i + 1;
  std::memcpy(c.arg(y).data, c.arg(0).data, static_cast<size_t>(a.rows * a.n * kernels::element_size(a.kind)));
  return kernel_result(c, "layer_norm_forward_cpu",
                       kernels::layer_norm_forward_cpu(a.kind, c.arg(y).data, a.weight, a.bias, a.rows, a.n, eps,
                                                       c.arg(y + 1).data, c.arg(y + 2).data));
}

int layer_norm_backward(Call c, bool has_weight, bool has_bias) {
  LayerNormArgs a{};
  int rstd_i = 0;
  LayerNormGrads g{};
  if (int rc = parse_layer_norm_backward(c, has_weight, has_bias, &a, &rstd_i, &g)) return rc;
  void* grad_weight = has_weight ? c.arg(g.grad_weight).data : nullptr;
  void* grad_bias = has_bias ? c.arg(g.grad_bias).data : nullptr;
  if (a.rows == 0) {  // no rows: the parameter gradients are sums of nothing
    const size_t bytes = static_cast<size_t>(a.n * kernels::element_size(a.kind));
    if (grad_weight) std::memset(grad_weight, 0, bytes);
    if (grad_bias) std::memset(grad_bias, 0, bytes);
    return kOk;
  }
  return kernel_result(c, "layer_norm_backward_cpu",
                       kernels::layer_norm_backward_cpu(a.kind, c.arg(0).data, c.arg(1).data, a.weight, a.bias,
                                                        c.arg(rstd_i).data, a.rows, a.n, c.arg(g.grad_input).data,
                                                        grad_weight, grad_bias));
}

}  // namespace
}  // namespace make_inplace::mindspore

// The MindSpore AOT signature, spelled once.
#define MAKE_INPLACE_MS_ENTRY(Name, ...)                                                   \
  MAKE_INPLACE_MS_EXPORT int Name(int nparam, void** params, int* ndims, int64_t** shapes, \
                                  const char** dtypes, void* /*stream*/, void* /*extra*/) { \
    using namespace make_inplace::mindspore;                                               \
    const Call c{#Name, nparam, params, ndims, shapes, dtypes};                            \
    return guarded(#Name, [&] { return __VA_ARGS__; });                                    \
  }

// y = x @ weight; y = x @ weight^T; y = x @ weight + bias; y = x @ weight^T + bias.
MAKE_INPLACE_MS_ENTRY(MakeInplaceSquareMatmul, square_matmul(c, false, false))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSquareMatmulT, square_matmul(c, true, false))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSquareMatmulBias, square_matmul(c, false, true))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSquareMatmulTBias, square_matmul(c, true, true))

// out = trilinear(feats, points); (grad_out, points, feats) -> (grad_feats, grad_points).
MAKE_INPLACE_MS_ENTRY(MakeInplaceTrilinear, trilinear_forward(c))
MAKE_INPLACE_MS_ENTRY(MakeInplaceTrilinearBackward, trilinear_backward(c))
// out = a[..., :, None] * b[..., None, :]; (grad_out, a, b) -> (grad_a, grad_b).
MAKE_INPLACE_MS_ENTRY(MakeInplaceOuterProduct, outer_product_forward(c))
MAKE_INPLACE_MS_ENTRY(MakeInplaceOuterProductBackward, outer_product_backward(c))

// y = softmax(x) over the last dim; causal; with an additive broadcast mask.
MAKE_INPLACE_MS_ENTRY(MakeInplaceSoftmax, softmax_forward(c, false, false))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSoftmaxCausal, softmax_forward(c, true, false))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSoftmaxMask, softmax_forward(c, false, true))
MAKE_INPLACE_MS_ENTRY(MakeInplaceSoftmaxCausalMask, softmax_forward(c, true, true))
// (grad_output, y) -> grad_input.
MAKE_INPLACE_MS_ENTRY(MakeInplaceSoftmaxBackward, softmax_backward(c))
// (x, [weight], [bias], eps) -> (y, mean, rstd) and the matching backwards.
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNorm, layer_norm_forward(c, false, false))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormWeight, layer_norm_forward(c, true, false))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormBias, layer_norm_forward(c, false, true))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormWeightBias, layer_norm_forward(c, true, true))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormBackward, layer_norm_backward(c, false, false))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormBackwardWeight, layer_norm_backward(c, true, false))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormBackwardBias, layer_norm_backward(c, false, true))
MAKE_INPLACE_MS_ENTRY(MakeInplaceLayerNormBackwardWeightBias, layer_norm_backward(c, true, true))

// Bytes of the layer norm backward's workspace output (none on the CPU).
MAKE_INPLACE_MS_EXPORT int64_t MakeInplaceLayerNormBackwardWorkspace(int /*kind*/, int64_t /*rows*/,
                                                                     int64_t /*n*/, int /*weight_or_bias*/) {
  return 0;
}
