#pragma once
// The MindSpore AOT calling convention, parsed and checked with plain C types.
//
// MindSpore calls an AOT custom op as
//   extern "C" int Name(int nparam, void** params, int* ndims,
//                       int64_t** shapes, const char** dtypes, void* stream,
//                       void* extra)
// with inputs first, then outputs; stream is null on CPU. A non-zero return
// makes MindSpore raise "Return value ... is N" without any text of ours, so
// every failure also writes a readable message (naming the op, the argument,
// the expected and the actual value) to stderr and keeps it for
// MakeInplaceLastError(). MindSpore's libraries use the old C++ ABI: nothing
// but C types crosses this boundary, and no exception escapes it.
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>

#include "make_inplace/kernels/scalar_kind.h"

namespace make_inplace::mindspore {

using kernels::ScalarKind;

// Codes returned to MindSpore (non-zero: it raises).
enum Status : int {
  kOk = 0,
  kBadArgs = 1,     // wrong count, shape or dtype
  kKernelFail = 2,  // a kernel or CUDA launch reported an error
  kInternal = 3,    // an exception (e.g. std::bad_alloc) caught at the boundary
};

// Marks the C entry points MindSpore looks up (the library is built with
// hidden visibility, so nothing else is exported).
#define MAKE_INPLACE_MS_EXPORT extern "C" __attribute__((visibility("default")))

// Keeps `text` as the last error message (see last_error.cpp).
void set_last_error(const char* text);

// Formats a message, stores and prints it, returns `code`.
inline int fail(int code, const char* op, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
inline int fail(int code, const char* op, const char* fmt, ...) {
  char body[768];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(body, sizeof(body), fmt, args);
  va_end(args);
  char text[1024];
  std::snprintf(text, sizeof(text), "make_inplace MindSpore op %s: %s", op, body);
  set_last_error(text);
  std::fprintf(stderr, "%s\n", text);
  return code;
}

// One tensor argument as MindSpore passes it.
struct Tensor {
  void* data;
  int ndim;
  const int64_t* shape;
  const char* dtype;

  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
};

// The parsed call: `inputs` then `outputs`, by position.
struct Call {
  const char* op;
  int nparam;
  void** params;
  int* ndims;
  int64_t** shapes;
  const char** dtypes;

  Tensor arg(int i) const { return {params[i], ndims[i], shapes[i], dtypes[i]}; }
};

// Shape as "(2, 3)" for messages.
struct ShapeText {
  char text[160];
  explicit ShapeText(const Tensor& t) {
    int at = std::snprintf(text, sizeof(text), "(");
    for (int d = 0; d < t.ndim && at < int(sizeof(text)) - 24; ++d) {
      at += std::snprintf(text + at, sizeof(text) - at, d ? ", %lld" : "%lld",
                          static_cast<long long>(t.shape[d]));
    }
    std::snprintf(text + at, sizeof(text) - at, t.ndim == 1 ? ",)" : ")");
  }
};

inline int check_nparam(const Call& c, int expected) {
  if (c.nparam != expected) {
    return fail(kBadArgs, c.op, "expected %d tensors (inputs then outputs), got %d",
                expected, c.nparam);
  }
  return kOk;
}

// The float dtype of argument `i`; integer and bool dtypes are errors.
inline int float_kind(const Call& c, int i, const char* name, ScalarKind* kind) {
  const char* d = c.dtypes[i];
  if (std::strcmp(d, "float16") == 0) { *kind = ScalarKind::kFloat16; return kOk; }
  if (std::strcmp(d, "bfloat16") == 0) { *kind = ScalarKind::kBFloat16; return kOk; }
  if (std::strcmp(d, "float32") == 0) { *kind = ScalarKind::kFloat32; return kOk; }
  if (std::strcmp(d, "float64") == 0) { *kind = ScalarKind::kFloat64; return kOk; }
  return fail(kBadArgs, c.op,
              "%s must be float16, bfloat16, float32 or float64, got %s", name, d);
}

inline const char* kind_name(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kFloat16: return "float16";
    case ScalarKind::kBFloat16: return "bfloat16";
    case ScalarKind::kFloat32: return "float32";
    case ScalarKind::kFloat64: return "float64";
  }
  return "?";
}

// Argument `i` has the dtype `kind` (all tensors of an op share one dtype).
inline int check_dtype(const Call& c, int i, const char* name, ScalarKind kind,
                       const char* like) {
  ScalarKind k = kind;
  if (float_kind(c, i, name, &k) != kOk) return kBadArgs;
  if (k != kind) {
    return fail(kBadArgs, c.op, "%s must have the dtype of %s (%s), got %s", name,
                like, kind_name(kind), c.dtypes[i]);
  }
  return kOk;
}

// Argument `i` has exactly the shape of argument `j`.
inline int check_same_shape(const Call& c, int i, const char* name, int j,
                            const char* like) {
  const Tensor a = c.arg(i), b = c.arg(j);
  bool same = a.ndim == b.ndim;
  for (int d = 0; same && d < a.ndim; ++d) same = a.shape[d] == b.shape[d];
  if (!same) {
    return fail(kBadArgs, c.op, "%s must have the shape of %s %s, got %s", name,
                like, ShapeText(b).text, ShapeText(a).text);
  }
  return kOk;
}

// Runs `body` (returning a Status), turning any exception into kInternal so
// none crosses into MindSpore.
template <typename Body>
int guarded(const char* op, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return fail(kInternal, op, "internal error: %s", e.what());
  } catch (...) {
    return fail(kInternal, op, "internal error (unknown exception)");
  }
}

}  // namespace make_inplace::mindspore
