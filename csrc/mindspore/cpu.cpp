// The MindSpore AOT entry points on the CPU (see bridge.h for the convention).
// Each checks its arguments, then runs the same torch-free kernel the PyTorch
// op runs. MindSpore allocates the outputs, so the in-place kernels run on the
// output after copying the input into it: the ops are out-of-place here.
#include <cstring>

#include "args.h"
#include "bridge.h"
#include "make_inplace/kernels/square_matmul.h"

namespace make_inplace::mindspore {
namespace {

int square_matmul(Call c, bool transpose, bool has_bias) {
  SquareMatmulArgs a;
  if (int rc = parse_square_matmul(c, has_bias, &a)) return rc;
  if (a.rows == 0) return kOk;
  std::memcpy(a.y, a.x, static_cast<size_t>(a.rows * a.n * kernels::element_size(a.kind)));
  if (int rc = kernels::square_matmul_rowwise(a.kind, a.y, a.weight, a.bias, a.rows, a.n, transpose)) {
    return fail(kKernelFail, c.op, "square_matmul_rowwise failed with code %d", rc);
  }
  return kOk;
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
