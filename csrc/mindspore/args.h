#pragma once
// Per-op argument checks of the MindSpore bridge, shared by the CPU and CUDA
// entry points: each parses a Call into the raw pointers and sizes its kernel
// takes, or fails with a message before anything is written.
#include "bridge.h"
#include "make_inplace/kernels/layer_norm.h"
#include "make_inplace/kernels/outer_product.h"
#include "make_inplace/kernels/softmax.h"
#include "make_inplace/kernels/trilinear.h"

namespace make_inplace::mindspore {

// Square matmul: inputs x (..., n), weight (n, n) [, bias (n,)]; output y with
// x's shape. y = x @ weight (+ bias), or x @ weight^T.
struct SquareMatmulArgs {
  ScalarKind kind;
  const void* x;
  const void* weight;
  const void* bias;  // null without bias
  void* y;
  int64_t rows;
  int64_t n;
};

inline int parse_square_matmul(const Call& c, bool has_bias, SquareMatmulArgs* a) {
  const int nin = has_bias ? 3 : 2;
  if (int rc = check_nparam(c, nin + 1)) return rc;
  const Tensor x = c.arg(0), w = c.arg(1), y = c.arg(nin);
  if (int rc = float_kind(c, 0, "x", &a->kind)) return rc;
  if (x.ndim < 1) return fail(kBadArgs, c.op, "x must have at least one dimension (..., n), got a 0-dim tensor");
  const int64_t n = x.size(-1);
  if (n < 1) return fail(kBadArgs, c.op, "x's last dimension n must be at least 1, got shape %s", ShapeText(x).text);
  if (w.ndim != 2 || w.shape[0] != n || w.shape[1] != n) {
    return fail(kBadArgs, c.op, "weight must have shape (%lld, %lld) to match x's last dimension, got %s",
                static_cast<long long>(n), static_cast<long long>(n), ShapeText(w).text);
  }
  if (int rc = check_dtype(c, 1, "weight", a->kind, "x")) return rc;
  if (has_bias) {
    const Tensor b = c.arg(2);
    if (b.ndim != 1 || b.shape[0] != n) {
      return fail(kBadArgs, c.op, "bias must have shape (%lld,), got %s", static_cast<long long>(n),
                  ShapeText(b).text);
    }
    if (int rc = check_dtype(c, 2, "bias", a->kind, "x")) return rc;
  }
  if (int rc = check_dtype(c, nin, "output", a->kind, "x")) return rc;
  if (int rc = check_same_shape(c, nin, "output", 0, "x")) return rc;
  a->x = x.data;
  a->weight = w.data;
  a->bias = has_bias ? c.arg(2).data : nullptr;
  a->y = y.data;
  a->n = n;
  a->rows = x.numel() / n;
  return kOk;
}

// Argument `i` is a tensor of rank `ndim` whose dimensions equal `dims`, where
// a negative entry accepts any size ("(n, 8, f)" for messages in `text`).
inline int check_shape(const Call& c, int i, const char* name, int ndim,
                       const int64_t* dims, const char* text) {
  const Tensor t = c.arg(i);
  bool ok = t.ndim == ndim;
  for (int d = 0; ok && d < ndim; ++d) ok = dims[d] < 0 || t.shape[d] == dims[d];
  if (!ok) return fail(kBadArgs, c.op, "%s must have shape %s, got %s", name, text, ShapeText(t).text);
  return kOk;
}

// Trilinear interpolation: feats (N, 8, F), points (N, 3), out (N, F);
// backward: grad_out (N, F), points, feats -> grad_feats (N, 8, F), grad_points (N, 3).
struct TrilinearArgs {
  ScalarKind kind;
  int64_t n, f;
};

inline int parse_trilinear_feats_points(const Call& c, int feats_i, int points_i, TrilinearArgs* a) {
  if (int rc = float_kind(c, feats_i, "feats", &a->kind)) return rc;
  const Tensor feats = c.arg(feats_i);
  if (feats.ndim != 3 || feats.shape[1] != 8) {
    return fail(kBadArgs, c.op, "feats must have shape (N, 8, F), got %s", ShapeText(feats).text);
  }
  a->n = feats.shape[0];
  a->f = feats.shape[2];
  char text[96];
  std::snprintf(text, sizeof(text), "(%lld, 3) to match feats", static_cast<long long>(a->n));
  const int64_t points_dims[2] = {a->n, 3};
  if (int rc = check_shape(c, points_i, "points", 2, points_dims, text)) return rc;
  return check_dtype(c, points_i, "points", a->kind, "feats");
}

inline int parse_trilinear_forward(const Call& c, TrilinearArgs* a) {
  if (int rc = check_nparam(c, 3)) return rc;
  if (int rc = parse_trilinear_feats_points(c, 0, 1, a)) return rc;
  const int64_t out_dims[2] = {a->n, a->f};
  if (int rc = check_shape(c, 2, "output", 2, out_dims, "(N, F) of feats")) return rc;
  return check_dtype(c, 2, "output", a->kind, "feats");
}

inline int parse_trilinear_backward(const Call& c, TrilinearArgs* a) {
  if (int rc = check_nparam(c, 5)) return rc;
  if (int rc = parse_trilinear_feats_points(c, 2, 1, a)) return rc;
  const int64_t grad_dims[2] = {a->n, a->f};
  if (int rc = check_shape(c, 0, "grad_out", 2, grad_dims, "(N, F) of feats")) return rc;
  if (int rc = check_dtype(c, 0, "grad_out", a->kind, "feats")) return rc;
  if (int rc = check_same_shape(c, 3, "grad_feats", 2, "feats")) return rc;
  if (int rc = check_dtype(c, 3, "grad_feats", a->kind, "feats")) return rc;
  if (int rc = check_same_shape(c, 4, "grad_points", 1, "points")) return rc;
  return check_dtype(c, 4, "grad_points", a->kind, "feats");
}

// Contiguous strided views for the trilinear kernels.
inline kernels::TrilinearInput trilinear_input(const Tensor& t) {
  kernels::TrilinearInput in{t.data, {0, 0, 0}};
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    in.stride[d] = stride;
    stride *= t.shape[d];
  }
  return in;
}

// Outer product: a (..., n), b (..., m) with the same leading dims, out
// (..., n, m); backward: grad_out, a, b -> grad_a, grad_b.
struct OuterArgs {
  ScalarKind kind;
  int64_t batch, n, m;
};

inline int parse_outer_ab(const Call& c, int a_i, int b_i, OuterArgs* o) {
  if (int rc = float_kind(c, a_i, "a", &o->kind)) return rc;
  if (int rc = check_dtype(c, b_i, "b", o->kind, "a")) return rc;
  const Tensor a = c.arg(a_i), b = c.arg(b_i);
  if (a.ndim < 1) return fail(kBadArgs, c.op, "a must have shape (..., n), got a 0-dim tensor");
  if (b.ndim < 1) return fail(kBadArgs, c.op, "b must have shape (..., m), got a 0-dim tensor");
  bool same = a.ndim == b.ndim;
  for (int d = 0; same && d < a.ndim - 1; ++d) same = a.shape[d] == b.shape[d];
  if (!same) {
    return fail(kBadArgs, c.op, "a and b must have the same leading dimensions, got %s and %s",
                ShapeText(a).text, ShapeText(b).text);
  }
  o->n = a.size(-1);
  o->m = b.size(-1);
  o->batch = 1;
  for (int d = 0; d < a.ndim - 1; ++d) o->batch *= a.shape[d];
  return kOk;
}

// Argument `i` has shape (leading dims of a..., n, m).
inline int check_outer_shape(const Call& c, int i, const char* name, int a_i, const OuterArgs& o) {
  const Tensor t = c.arg(i), a = c.arg(a_i);
  bool ok = t.ndim == a.ndim + 1;
  for (int d = 0; ok && d < a.ndim - 1; ++d) ok = t.shape[d] == a.shape[d];
  ok = ok && t.size(-2) == o.n && t.size(-1) == o.m;
  if (!ok) {
    return fail(kBadArgs, c.op, "%s must have shape (..., %lld, %lld) with the leading dimensions of a %s, got %s",
                name, static_cast<long long>(o.n), static_cast<long long>(o.m), ShapeText(a).text,
                ShapeText(t).text);
  }
  return check_dtype(c, i, name, o.kind, "a");
}

inline int parse_outer_forward(const Call& c, OuterArgs* o) {
  if (int rc = check_nparam(c, 3)) return rc;
  if (int rc = parse_outer_ab(c, 0, 1, o)) return rc;
  return check_outer_shape(c, 2, "output", 0, *o);
}

inline int parse_outer_backward(const Call& c, OuterArgs* o) {
  if (int rc = check_nparam(c, 5)) return rc;
  if (int rc = parse_outer_ab(c, 1, 2, o)) return rc;
  if (int rc = check_outer_shape(c, 0, "grad_out", 1, *o)) return rc;
  if (int rc = check_same_shape(c, 3, "grad_a", 1, "a")) return rc;
  if (int rc = check_dtype(c, 3, "grad_a", o->kind, "a")) return rc;
  if (int rc = check_same_shape(c, 4, "grad_b", 2, "b")) return rc;
  return check_dtype(c, 4, "grad_b", o->kind, "a");
}

// Contiguous views for the outer product kernels: (batch, n) operands and
// the (batch, n, m) gradient, strides per dimension of the view.
inline kernels::OuterInput outer_vector(const void* data, int64_t n) { return {data, {n, 1, 0}}; }
inline kernels::OuterInput outer_matrix(const void* data, int64_t n, int64_t m) {
  return {data, {n * m, m, 1}};
}

// Softmax over the last dimension of x (..., n): y = softmax(x + mask), with
// causal masking (element j of row r out when j > r % x.shape[-2]) and an
// additive mask of x's rank whose dims equal x's or are 1 (broadcast, read
// through zero strides). Scale is applied by the caller (the Python wrapper
// multiplies x): MindSpore's AOT ABI has no plain-C channel for attributes.
struct SoftmaxArgs {
  ScalarKind kind;
  int64_t outer, n;
  int64_t causal_rows;
  kernels::MaskLayout mask;
};

inline int parse_softmax_forward(const Call& c, bool causal, bool has_mask, SoftmaxArgs* a) {
  const int nin = has_mask ? 2 : 1;
  if (int rc = check_nparam(c, nin + 1)) return rc;
  if (int rc = float_kind(c, 0, "x", &a->kind)) return rc;
  const Tensor x = c.arg(0);
  if (x.ndim < 1) return fail(kBadArgs, c.op, "x must have at least one dimension, got a 0-dim tensor");
  a->n = x.size(-1);
  a->outer = a->n == 0 ? 0 : x.numel() / a->n;
  a->causal_rows = 0;
  if (causal) {
    if (x.ndim < 2) return fail(kBadArgs, c.op, "causal softmax needs x with at least 2 dims (..., L, S), got %s", ShapeText(x).text);
    a->causal_rows = x.size(-2);
  }
  if (has_mask) {
    const Tensor m = c.arg(1);
    if (int rc = check_dtype(c, 1, "mask", a->kind, "x")) return rc;
    bool ok = m.ndim == x.ndim;
    for (int d = 0; ok && d < x.ndim; ++d) ok = m.shape[d] == x.shape[d] || m.shape[d] == 1;
    if (!ok) {
      return fail(kBadArgs, c.op, "mask must have x's rank with each dim equal to x's or 1 (x %s), got %s",
                  ShapeText(x).text, ShapeText(m).text);
    }
    if (x.ndim - 1 > kernels::kMaskMaxDims) {
      return fail(kBadArgs, c.op, "a mask needs x with at most %d dims, got %d", kernels::kMaskMaxDims + 1, x.ndim);
    }
    // Contiguous strides of the mask, zero along broadcast dims.
    int64_t strides[16] = {};
    int64_t stride = 1;
    for (int d = m.ndim - 1; d >= 0; --d) {
      strides[d] = m.shape[d] == 1 ? 0 : stride;
      stride *= m.shape[d];
    }
    a->mask.data = m.data;
    a->mask.outer_rank = x.ndim - 1;
    for (int d = 0; d < x.ndim - 1; ++d) {
      a->mask.outer_sizes[d] = x.shape[d];
      a->mask.outer_strides[d] = strides[d];
    }
    a->mask.dim_stride = strides[x.ndim - 1];
    a->mask.inner_rank = 0;
  }
  if (int rc = check_dtype(c, nin, "output", a->kind, "x")) return rc;
  return check_same_shape(c, nin, "output", 0, "x");
}

// Softmax backward over the last dim: (grad_output, y) -> grad_input.
inline int parse_softmax_backward(const Call& c, SoftmaxArgs* a) {
  if (int rc = check_nparam(c, 3)) return rc;
  if (int rc = float_kind(c, 1, "y", &a->kind)) return rc;
  const Tensor y = c.arg(1);
  if (y.ndim < 1) return fail(kBadArgs, c.op, "y must have at least one dimension, got a 0-dim tensor");
  if (int rc = check_dtype(c, 0, "grad_output", a->kind, "y")) return rc;
  if (int rc = check_same_shape(c, 0, "grad_output", 1, "y")) return rc;
  if (int rc = check_dtype(c, 2, "grad_input", a->kind, "y")) return rc;
  if (int rc = check_same_shape(c, 2, "grad_input", 1, "y")) return rc;
  a->n = y.size(-1);
  a->outer = a->n == 0 ? 0 : y.numel() / a->n;
  return kOk;
}

// Layer norm over the last dim of x (rows, n) (the Python wrapper flattens
// normalized_shape), eps as a (1,) float64 input (no attribute channel; see
// softmax above). Forward: x, [weight (n,)], [bias (n,)], eps -> y, mean
// (rows,), rstd (rows,) in the accumulation type (float32, float64 for
// float64). Backward: grad_output, y, [weight], [bias], rstd -> grad_input,
// [grad_weight], [grad_bias], workspace (uint8, the bytes
// MakeInplaceLayerNormBackwardWorkspace gives).
struct LayerNormArgs {
  ScalarKind kind;
  int64_t rows, n;
  const void* weight;
  const void* bias;
};

inline const char* acc_dtype(ScalarKind kind) {
  return kind == ScalarKind::kFloat64 ? "float64" : "float32";
}

// Argument `i` is a (count,) vector of dtype `dtype`.
inline int check_vector(const Call& c, int i, const char* name, int64_t count, const char* dtype) {
  const Tensor t = c.arg(i);
  if (t.ndim != 1 || t.shape[0] != count) {
    return fail(kBadArgs, c.op, "%s must have shape (%lld,), got %s", name, static_cast<long long>(count),
                ShapeText(t).text);
  }
  if (std::strcmp(t.dtype, dtype) != 0) return fail(kBadArgs, c.op, "%s must be %s, got %s", name, dtype, t.dtype);
  return kOk;
}

// x-like (rows, n) argument `i` named `name` (2-D), setting rows and n when `first`.
inline int check_rows(const Call& c, int i, const char* name, LayerNormArgs* a, bool first) {
  const Tensor t = c.arg(i);
  if (first) {
    if (int rc = float_kind(c, i, name, &a->kind)) return rc;
    if (t.ndim != 2) return fail(kBadArgs, c.op, "%s must be 2-D (rows, n), got %s", name, ShapeText(t).text);
    a->rows = t.shape[0];
    a->n = t.shape[1];
    return kOk;
  }
  if (int rc = check_dtype(c, i, name, a->kind, "x")) return rc;
  if (t.ndim != 2 || t.shape[0] != a->rows || t.shape[1] != a->n) {
    return fail(kBadArgs, c.op, "%s must have shape (%lld, %lld), got %s", name, static_cast<long long>(a->rows),
                static_cast<long long>(a->n), ShapeText(t).text);
  }
  return kOk;
}

// weight and bias (when present) at positions from `i`; returns the next position.
inline int parse_affine(const Call& c, int* i, bool has_weight, bool has_bias, LayerNormArgs* a) {
  a->weight = a->bias = nullptr;
  if (has_weight) {
    if (int rc = check_vector(c, *i, "weight", a->n, kind_name(a->kind))) return rc;
    a->weight = c.arg((*i)++).data;
  }
  if (has_bias) {
    if (int rc = check_vector(c, *i, "bias", a->n, kind_name(a->kind))) return rc;
    a->bias = c.arg((*i)++).data;
  }
  return kOk;
}

inline int parse_layer_norm_forward(const Call& c, bool has_weight, bool has_bias, LayerNormArgs* a,
                                    int* eps_i) {
  const int nin = 2 + has_weight + has_bias;
  if (int rc = check_nparam(c, nin + 3)) return rc;
  if (int rc = check_rows(c, 0, "x", a, true)) return rc;
  int i = 1;
  if (int rc = parse_affine(c, &i, has_weight, has_bias, a)) return rc;
  if (int rc = check_vector(c, i, "eps", 1, "float64")) return rc;
  *eps_i = i;
  if (int rc = check_rows(c, nin, "output", a, false)) return rc;
  if (int rc = check_vector(c, nin + 1, "mean", a->rows, acc_dtype(a->kind))) return rc;
  return check_vector(c, nin + 2, "rstd", a->rows, acc_dtype(a->kind));
}

// Positions of the backward's outputs.
struct LayerNormGrads {
  int grad_input, grad_weight, grad_bias, workspace;  // -1: absent
};

inline int parse_layer_norm_backward(const Call& c, bool has_weight, bool has_bias, LayerNormArgs* a,
                                     int* rstd_i, LayerNormGrads* g) {
  const int nin = 3 + has_weight + has_bias;
  const int nout = 2 + has_weight + has_bias;
  if (int rc = check_nparam(c, nin + nout)) return rc;
  if (int rc = check_rows(c, 1, "y", a, true)) return rc;
  if (int rc = check_rows(c, 0, "grad_output", a, false)) return rc;
  int i = 2;
  if (int rc = parse_affine(c, &i, has_weight, has_bias, a)) return rc;
  if (int rc = check_vector(c, i, "rstd", a->rows, acc_dtype(a->kind))) return rc;
  *rstd_i = i;
  int o = nin;
  g->grad_input = o++;
  if (int rc = check_rows(c, g->grad_input, "grad_input", a, false)) return rc;
  g->grad_weight = has_weight ? o++ : -1;
  if (has_weight) {
    if (int rc = check_vector(c, g->grad_weight, "grad_weight", a->n, kind_name(a->kind))) return rc;
  }
  g->grad_bias = has_bias ? o++ : -1;
  if (has_bias) {
    if (int rc = check_vector(c, g->grad_bias, "grad_bias", a->n, kind_name(a->kind))) return rc;
  }
  g->workspace = o;
  if (c.arg(o).ndim != 1 || std::strcmp(c.arg(o).dtype, "uint8") != 0) {
    return fail(kBadArgs, c.op, "workspace must be a 1-D uint8 tensor, got %s of %s", ShapeText(c.arg(o)).text,
                c.arg(o).dtype);
  }
  return kOk;
}

}  // namespace make_inplace::mindspore
