// The one list of make_inplace's op schemas. Every build route (setuptools, JIT,
// CMake) compiles this file; backends add kernels with TORCH_LIBRARY_IMPL in
// csrc/cpu/*.cpp and csrc/cuda/*.cpp. Add an op by adding its schema to
// kSchemas: it is defined from there, and a mutating one gets the
// version-counter kernel too.
//
// Conventions: a mutated tensor is annotated (a!) and mutating ops return ();
// the Python wrappers return the mutated tensor. Results that go to a
// caller-owned buffer take it as a keyword `out`-style mutable argument. Other
// options stay positional: from Python each keyword argument costs ~0.4 us of
// host time per call, a positional one next to nothing.
#include <torch/library.h>

#include <cstring>
#include <string>

#include "make_inplace/version_bump.h"

namespace {

constexpr const char* kSchemas[] = {
    // x <- x @ weight (+ bias), or x @ weight.T with transpose=True.
    "square_matmul_(Tensor(a!) x, Tensor weight, Tensor? bias=None, "
    "bool transpose=False, int? workspace_bytes=None) -> ()",
    // x <- softmax(x * scale, dim), optionally causal-masked and/or with an
    // additive mask broadcastable to x.
    "softmax_(Tensor(a!) x, int dim=-1, float? scale=None, "
    "bool causal=False, Tensor? mask=None) -> ()",
    // grad_input = scale * y * (grad_output - sum(grad_output * y, dim)).
    "softmax_backward(Tensor grad_output, Tensor output, int dim, "
    "float scale) -> Tensor",
    // The same written over grad, a buffer the caller owns (e.g. its own
    // contiguous copy of an expanded grad_output), so no second buffer is needed.
    "softmax_backward_(Tensor(a!) grad, Tensor output, int dim, "
    "float scale) -> ()",
    // x <- layer_norm(x, normalized_shape, weight, bias, eps).
    "layer_norm_(Tensor(a!) x, int[] normalized_shape, Tensor? weight=None, "
    "Tensor? bias=None, float eps=1e-05) -> ()",
    // The same, also returning the per-row float32 mean and rstd for autograd.
    "layer_norm_stats_(Tensor(a!) x, int[] normalized_shape, "
    "Tensor? weight=None, Tensor? bias=None, float eps=1e-05) "
    "-> (Tensor mean, Tensor rstd)",
    // Gradients rebuilt from the normalized output y (x_hat = (y - bias) / weight).
    "layer_norm_backward(Tensor grad_output, Tensor output, "
    "int[] normalized_shape, Tensor? weight, Tensor? bias, Tensor rstd, "
    "bool[3] output_mask) -> (Tensor grad_input, Tensor grad_weight, "
    "Tensor grad_bias)",
    // x <- rms_norm(x, normalized_shape, weight, eps) (eps None: finfo(x.dtype).eps).
    "rms_norm_(Tensor(a!) x, int[] normalized_shape, Tensor? weight=None, "
    "float? eps=None) -> ()",
    // The same, also returning the per-row rstd (float32; float64 for float64 x) for autograd.
    "rms_norm_stats_(Tensor(a!) x, int[] normalized_shape, Tensor? weight=None, "
    "float? eps=None) -> Tensor rstd",
    // Gradients rebuilt from the normalized output y (x_hat = y / weight).
    "rms_norm_backward(Tensor grad_output, Tensor output, int[] normalized_shape, "
    "Tensor? weight, Tensor rstd, bool[2] output_mask) -> (Tensor grad_input, "
    "Tensor grad_weight)",
    // out[n, f] = sum_k w_k(points[n]) * feats[n, k, f].
    "trilinear_interpolation(Tensor feats, Tensor points, *, "
    "Tensor(a!) out) -> ()",
    // grad_feats (always) and grad_points (when feats is given), written or,
    // with accumulate=True, added to.
    "trilinear_interpolation_backward(Tensor grad_out, Tensor points, "
    "Tensor? feats, bool accumulate, *, Tensor(a!) grad_feats, "
    "Tensor(b!)? grad_points) -> ()",
    // out[..., i, j] = a[..., i] * b[..., j].
    "outer_product(Tensor a, Tensor b, *, Tensor(a!) out) -> ()",
    "outer_product_backward(Tensor grad_out, Tensor a, Tensor b, "
    "bool accumulate, *, Tensor(a!)? grad_a, Tensor(b!)? grad_b) -> ()",
    // Which backends this build carries, e.g. "cpu" or "cpu,cuda".
    "build_backends() -> str",
    // Private: the routing policy's plan for a described call, and the one
    // switch that forces a route (make_inplace._testing, docs/routing.md).
    "_square_matmul_route(int rows, int n, ScalarType dtype, *, str device, bool transpose, "
    "int? workspace_bytes, bool x_aligned, bool weight_aligned, bool bias_aligned, bool allow_tf32, "
    "int capability_major, int capability_minor, bool sm90a, bool tensor_maps, int wgmma_ctas, "
    "int[] wgmma_clusters, int ffma_ctas, int waves_max_width, str forced, "
    "int tiles_per_cta, int col_tile, bool panels_batched, int? cpu_l2_bytes, bool? cpu_bf16_dot, "
    "bool? cpu_amx, bool? cpu_rows_bf16_dot) "
    "-> (str, int, int, int, int, int, int, int, int, bool)",
    "_set_route_override(str square_matmul_route, int tiles_per_cta, int col_tile, bool panels_batched, "
    "bool staged_rows) -> ()",
    "_route_override() -> (str, int, int, bool, bool)",
};

// Only a mutable alias annotation such as (a!) puts a '!' in a schema.
bool mutates(const char* schema) { return std::strchr(schema, '!') != nullptr; }

std::string op_name(const char* schema) { return std::string(schema, std::strchr(schema, '(')); }

}  // namespace

TORCH_LIBRARY(make_inplace, m) {
  for (const char* schema : kSchemas) m.def(schema);
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
  for (const char* schema : kSchemas) {
    if (!mutates(schema)) continue;
    const std::string name = op_name(schema);
    m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&make_inplace::bump_versions_then_redispatch>());
  }
}
