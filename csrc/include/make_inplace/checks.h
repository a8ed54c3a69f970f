#pragma once
// Argument checks shared by every op. Each message names the argument, what
// was expected and what was given. Ops run all their checks before writing
// anything, so a rejected call leaves every tensor unchanged.
#include <ATen/ATen.h>

#include <algorithm>
#include <string>

namespace make_inplace {

// Every check message starts with "make_inplace.<op>: ", so an error names the
// op whichever route (Python wrapper, torch.ops, CPU or CUDA binding) raised it.
#define MAKE_INPLACE_CHECK(op, cond, ...) \
  TORCH_CHECK(cond, "make_inplace.", op, ": ", __VA_ARGS__)

inline bool is_supported_float(at::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat ||
         t == at::kDouble;
}

inline void check_float_dtype(const char* op, const at::Tensor& t, const char* name) {
  MAKE_INPLACE_CHECK(op, is_supported_float(t.scalar_type()), name,
              " must have dtype float16, bfloat16, float32 or float64, got ",
              t.scalar_type());
}

inline void check_same_dtype(const char* op, const at::Tensor& t, const char* name,
                             const at::Tensor& ref, const char* ref_name) {
  MAKE_INPLACE_CHECK(op, t.scalar_type() == ref.scalar_type(), name,
              " must have the same dtype as ", ref_name, " (",
              ref.scalar_type(), "), got ", t.scalar_type());
}

inline void check_same_device(const char* op, const at::Tensor& t, const char* name,
                              const at::Tensor& ref, const char* ref_name) {
  MAKE_INPLACE_CHECK(op, t.device() == ref.device(), name,
              " must be on the same device as ", ref_name, " (", ref.device(),
              "), got ", t.device(), "; move it with .to(", ref_name, ".device)");
}

inline void check_contiguous(const char* op, const at::Tensor& t, const char* name,
                             const char* why) {
  MAKE_INPLACE_CHECK(op, t.is_contiguous(), name, " must be contiguous (", why,
              "), got sizes ", t.sizes(), " and strides ", t.strides());
}

inline void check_dim(const char* op, const at::Tensor& t, const char* name, int64_t dim) {
  MAKE_INPLACE_CHECK(op, t.dim() == dim, name, " must have ", dim,
              " dimension(s), got shape ", t.sizes());
}

// [first, last) byte addresses a tensor can touch; empty tensors touch none.
struct ByteSpan {
  uintptr_t first = 0;
  uintptr_t last = 0;
};

inline ByteSpan byte_span(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return {};
  intptr_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const intptr_t step = static_cast<intptr_t>(t.stride(d)) * (t.size(d) - 1);
    if (step < 0) lo += step; else hi += step;
  }
  const auto base = reinterpret_cast<intptr_t>(t.data_ptr());
  const auto item = static_cast<intptr_t>(t.element_size());
  return {static_cast<uintptr_t>(base + lo * item),
          static_cast<uintptr_t>(base + (hi + 1) * item)};
}

// Conservative: tensors whose address ranges intersect are treated as sharing
// memory, since a kernel that writes one while reading the other would race.
inline void check_no_overlap(const char* op, const at::Tensor& written, const char* written_name,
                             const at::Tensor& read, const char* read_name) {
  if (!written.defined() || !read.defined()) return;
  if (written.device() != read.device()) return;
  const ByteSpan a = byte_span(written), b = byte_span(read);
  const bool overlap = a.first < a.last && b.first < b.last &&
                       a.first < b.last && b.first < a.last;
  MAKE_INPLACE_CHECK(op, !overlap, read_name, " must not share memory with ",
              written_name, ", which the op writes; pass a separate tensor (e.g. ",
              read_name, ".clone())");
}

}  // namespace make_inplace
