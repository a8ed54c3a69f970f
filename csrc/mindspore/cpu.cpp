// The MindSpore AOT entry points on the CPU (see bridge.h for the convention).
// Each checks its arguments, then runs the same torch-free kernel the PyTorch
// op runs. MindSpore allocates the outputs, so the in-place kernels run on the
// output after copying the input into it: the ops are out-of-place here.
#include <cstring>

#include "args.h"
#include "bridge.h"
#include "make_inplace/kernels/outer_product.h"
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
