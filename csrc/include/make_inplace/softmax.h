#pragma once
// softmax_ / softmax_backward: argument checks and the (outer, n, inner) plan,
// shared by the CPU and CUDA bindings. Every check runs before any write.
#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "make_inplace/checks.h"
#include "make_inplace/kernels/softmax.h"

namespace make_inplace {

struct SoftmaxPlan {
  int64_t outer = 1, n = 1, inner = 1;
  int64_t causal_rows = 0;  // 0: not causal
  double scale = 1.0;
  kernels::MaskLayout mask;
};

inline int64_t wrap_softmax_dim(const at::Tensor& x, int64_t dim,
                                const char* op) {
  const int64_t rank = std::max<int64_t>(x.dim(), 1);
  MAKE_INPLACE_CHECK(op, dim >= -rank && dim < rank, "dim must be in [", -rank,
              ", ", rank - 1, "] for x of shape ", x.sizes(), ", got ", dim);
  return dim < 0 ? dim + rank : dim;
}

inline void split_sizes(const at::Tensor& x, int64_t dim, SoftmaxPlan& plan) {
  plan.outer = 1;
  plan.inner = 1;
  plan.n = x.dim() == 0 ? 1 : x.size(dim);
  for (int64_t d = 0; d < dim; ++d) plan.outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) plan.inner *= x.size(d);
}

// Merges the dims [begin, end) of a broadcast view into at most kMaskMaxDims
// (size, stride) pairs: size-1 dims drop out, neighbours whose strides chain
// merge. Returns false when more dims remain than the kernels take.
inline bool merge_mask_dims(const at::Tensor& view, int64_t begin, int64_t end,
                            int* rank, int64_t* sizes, int64_t* strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int64_t d = begin; d < end; ++d) {
    const int64_t size = view.size(d), stride = view.stride(d);
    if (size == 1) continue;
    if (!dims.empty() && dims.back().second == stride * size) {
      dims.back() = {dims.back().first * size, stride};
    } else {
      dims.emplace_back(size, stride);
    }
  }
  if (dims.size() > static_cast<size_t>(kernels::kMaskMaxDims)) return false;
  *rank = static_cast<int>(dims.size());
  for (size_t k = 0; k < dims.size(); ++k) {
    sizes[k] = dims[k].first;
    strides[k] = dims[k].second;
  }
  return true;
}

inline SoftmaxPlan check_softmax_args(const at::Tensor& x, int64_t dim,
                                      std::optional<double> scale, bool causal,
                                      const std::optional<at::Tensor>& mask) {
  constexpr const char* op = "softmax_";
  check_float_dtype(op, x, "x");
  const int64_t d = wrap_softmax_dim(x, dim, op);
  check_contiguous(op, x, "x",
                   "the result is written into x's own memory, so a copy "
                   "would not reach the caller");
  SoftmaxPlan plan;
  split_sizes(x, d, plan);
  plan.scale = scale.value_or(1.0);
  if (causal) {
    MAKE_INPLACE_CHECK(op, x.dim() >= 2 && d == x.dim() - 1,
                "causal=True needs x with at least 2 dims and dim "
                "the last one (rows are queries, columns keys), got x of "
                "shape ", x.sizes(), " and dim ", dim);
    plan.causal_rows = x.size(-2);
  }
  if (mask.has_value() && mask->defined()) {
    const at::Tensor& m = *mask;
    check_same_dtype(op, m, "mask", x, "x");
    check_same_device(op, m, "mask", x, "x");
    bool broadcastable = m.dim() <= x.dim();
    for (int64_t k = 1; broadcastable && k <= m.dim(); ++k) {
      broadcastable = m.size(-k) == 1 || m.size(-k) == x.size(-k);
    }
    MAKE_INPLACE_CHECK(op, broadcastable, "mask must be broadcastable to x's shape ",
                x.sizes(), " (at most x's dims; each trailing dim 1 or x's), got mask of shape ",
                m.sizes());
    check_no_overlap(op, x, "x", m, "mask");
    if (x.numel() > 0) {
      const at::Tensor view = m.expand(x.sizes());  // a view: strides 0 where broadcast
      const int64_t rank = x.dim();
      kernels::MaskLayout& layout = plan.mask;
      layout.data = m.const_data_ptr();
      layout.dim_stride = rank == 0 ? 0 : view.stride(d);
      const bool fits =
          merge_mask_dims(view, 0, d, &layout.outer_rank, layout.outer_sizes,
                          layout.outer_strides) &&
          merge_mask_dims(view, d + 1, rank, &layout.inner_rank,
                          layout.inner_sizes, layout.inner_strides);
      MAKE_INPLACE_CHECK(op, fits, "mask of shape ", m.sizes(), " and strides ",
                  m.strides(), " broadcasts to x's shape ", x.sizes(),
                  " in more than ", kernels::kMaskMaxDims,
                  " separate dims on one side of dim; merge its dims "
                  "(e.g. make it contiguous) first");
    }
  }
  return plan;
}

// grad_name: "grad_output" (softmax_backward) or "grad" (softmax_backward_,
// which writes the result over it); op: the op whose arguments these are.
inline SoftmaxPlan check_softmax_backward_args(const at::Tensor& grad_output,
                                               const at::Tensor& output,
                                               int64_t dim, double scale,
                                               const char* grad_name = "grad_output",
                                               const char* op = "softmax_backward") {
  check_float_dtype(op, output, "output");
  check_same_dtype(op, grad_output, grad_name, output, "output");
  check_same_device(op, grad_output, grad_name, output, "output");
  MAKE_INPLACE_CHECK(op, grad_output.sizes() == output.sizes(), grad_name,
              " must have output's shape ", output.sizes(), ", got ",
              grad_output.sizes());
  const int64_t d = wrap_softmax_dim(output, dim, op);
  check_contiguous(op, grad_output, grad_name, "the kernel reads it row by row");
  check_contiguous(op, output, "output", "the kernel reads it row by row");
  SoftmaxPlan plan;
  split_sizes(output, d, plan);
  plan.scale = scale;
  return plan;
}

}  // namespace make_inplace
