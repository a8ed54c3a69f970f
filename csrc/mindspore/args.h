#pragma once
// Per-op argument checks of the MindSpore bridge, shared by the CPU and CUDA
// entry points: each parses a Call into the raw pointers and sizes its kernel
// takes, or fails with a message before anything is written.
#include "bridge.h"
#include "make_inplace/kernels/outer_product.h"
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

}  // namespace make_inplace::mindspore
