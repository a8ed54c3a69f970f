// The one list of make_inplace's op schemas. Every build route (setuptools, JIT,
// CMake) compiles this file; backends add kernels with TORCH_LIBRARY_IMPL in
// csrc/cpu/*.cpp and csrc/cuda/*.cu.
//
// Conventions: a mutated tensor is annotated (a!) and mutating ops return ();
// the Python wrappers return the mutated tensor. Results that go to a
// caller-owned buffer take it as a keyword `out`-style mutable argument.
#include <torch/library.h>

#include "make_inplace/version_bump.h"

TORCH_LIBRARY(make_inplace, m) {
  // x <- x @ weight (+ bias), or x @ weight.T with transpose=True.
  m.def(
      "square_matmul_(Tensor(a!) x, Tensor weight, Tensor? bias=None, *, "
      "bool transpose=False, int? workspace_bytes=None) -> ()");
  // x <- softmax(x * scale, dim), optionally causal-masked and/or with an
  // additive mask broadcastable to x.
  m.def(
      "softmax_(Tensor(a!) x, int dim=-1, *, float? scale=None, "
      "bool causal=False, Tensor? mask=None) -> ()");
  // grad_input = scale * y * (grad_output - sum(grad_output * y, dim)).
  m.def(
      "softmax_backward(Tensor grad_output, Tensor output, int dim, "
      "float scale) -> Tensor");
  // The same written over grad, a buffer the caller owns (e.g. its own
  // contiguous copy of an expanded grad_output), so no second buffer is needed.
  m.def(
      "softmax_backward_(Tensor(a!) grad, Tensor output, int dim, "
      "float scale) -> ()");
  // x <- layer_norm(x, normalized_shape, weight, bias, eps).
  m.def(
      "layer_norm_(Tensor(a!) x, int[] normalized_shape, Tensor? weight=None, "
      "Tensor? bias=None, float eps=1e-05) -> ()");
  // The same, also returning the per-row float32 mean and rstd for autograd.
  m.def(
      "layer_norm_stats_(Tensor(a!) x, int[] normalized_shape, "
      "Tensor? weight=None, Tensor? bias=None, float eps=1e-05) "
      "-> (Tensor mean, Tensor rstd)");
  // Gradients rebuilt from the normalized output y (x_hat = (y - bias) / weight).
  m.def(
      "layer_norm_backward(Tensor grad_output, Tensor output, "
      "int[] normalized_shape, Tensor? weight, Tensor? bias, Tensor rstd, "
      "bool[3] output_mask) -> (Tensor grad_input, Tensor grad_weight, "
      "Tensor grad_bias)");
  // out[n, f] = sum_k w_k(points[n]) * feats[n, k, f].
  m.def(
      "trilinear_interpolation(Tensor feats, Tensor points, *, "
      "Tensor(a!) out) -> ()");
  // grad_feats (always) and grad_points (when feats is given), written or,
  // with accumulate=True, added to.
  m.def(
      "trilinear_interpolation_backward(Tensor grad_out, Tensor points, "
      "Tensor? feats, bool accumulate, *, Tensor(a!) grad_feats, "
      "Tensor(b!)? grad_points) -> ()");
  // out[..., i, j] = a[..., i] * b[..., j].
  m.def("outer_product(Tensor a, Tensor b, *, Tensor(a!) out) -> ()");
  m.def(
      "outer_product_backward(Tensor grad_out, Tensor a, Tensor b, "
      "bool accumulate, *, Tensor(a!)? grad_a, Tensor(b!)? grad_b) -> ()");
  // Which backends this build carries, e.g. "cpu" or "cpu,cuda".
  m.def("build_backends() -> str");
}

TORCH_LIBRARY_IMPL(make_inplace, CompositeExplicitAutograd, m) {
  m.impl("build_backends", []() -> std::string {
#ifdef MAKE_INPLACE_WITH_CUDA
    return "cpu,cuda";
#else
    return "cpu";
#endif
  });
}

// C++-registered mutating ops do not bump autograd's version counter by
// themselves; this kernel does it for every tensor the schema marks written,
// so misuse ("modified by an inplace operation") is caught even when the op is
// called through torch.ops directly (the CMake route).
TORCH_LIBRARY_IMPL(make_inplace, ADInplaceOrView, m) {
  for (const char* name :
       {"square_matmul_", "softmax_", "softmax_backward_", "layer_norm_", "layer_norm_stats_",
        "trilinear_interpolation", "trilinear_interpolation_backward",
        "outer_product", "outer_product_backward"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<
                     &make_inplace::bump_versions_then_redispatch>());
  }
}
