// softmax_ and its backward on the CPU, torch-free. The tensor is (outer, n,
// inner) with the softmax over n. Rows (inner == 1) take one row at a time;
// "columns" (inner > 1) take blocks of kColBlock neighbouring columns, whose
// max and sum are vectors of per-column lanes, so every load is contiguous.
// float, float16 and bfloat16 compute in float32 vectors (cpu_vec.h); float64
// keeps double math, one element at a time. Chunks of rows or column blocks
// go to the registered parallel-for (cpu_parallel.h). No heap memory: the
// half types keep a row's exponentials in a stack buffer when it fits, and
// compute them twice otherwise.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "cpu_rows.h"
#include "make_inplace/kernels/cpu_parallel.h"
#include "make_inplace/kernels/softmax.h"

namespace make_inplace::kernels {
namespace {

constexpr int64_t kColBlock = 64;
// Floats of a half-type row's exponentials kept on the stack (16 KiB).
constexpr int64_t kRowBuffer = 4096;
// Rows of at most this many elements go W at a time through register
// transposes (softmax_short_rows): float32 (4096, 32) 2.7x faster on one
// AVX-512 core, (4096, 128) 1.15x.
constexpr int64_t kShortRow = 128;
// Rows per parallel item on that path: the widest vector's lanes (AVX-512's
// 16, a multiple of AVX2's 8), so that every group starts at a multiple of
// the width whatever the chunks, and each row takes the same path (and
// rounding) at any thread count.
constexpr int64_t kShortGroupRows = 16;

struct Call {
  void* x;
  int64_t outer, n, inner;
  double scale;
  int64_t causal_rows;
  const MaskLayout* mask;
  bool short_rows;  // no mask, not causal, n <= kShortRow: groups of rows transposed
};

int64_t outer_mask_offset(const MaskLayout& m, int64_t o) {
  return mask_offset(m.outer_rank, m.outer_sizes, m.outer_strides, o);
}

// ---- float64: double math, one element at a time -------------------------

// max that propagates NaN, so a row holding NaN becomes NaN as in torch.
inline double nan_max(double a, double b) { return (b > a || b != b) ? b : a; }

void forward_double(const Call& call, int64_t begin, int64_t end) {
  using acc_t = double;
  double* x = static_cast<double*>(call.x);
  const MaskLayout& mask = *call.mask;
  const double* mk = static_cast<const double*>(mask.data);
  const int64_t n = call.n, inner = call.inner;
  const acc_t neg_inf = -std::numeric_limits<acc_t>::infinity();
  for (int64_t o = begin; o < end; ++o) {
    double* base = x + o * n * inner;
    const int64_t valid = call.causal_rows > 0 ? std::min(n, o % call.causal_rows + 1) : n;
    const int64_t m_outer = mk ? outer_mask_offset(mask, o) : 0;
    for (int64_t i0 = 0; i0 < inner; i0 += kColBlock) {
      const int64_t cnt = std::min(kColBlock, inner - i0);
      acc_t mx[kColBlock], sum[kColBlock];
      int64_t m_inner[kColBlock];
      for (int64_t c = 0; c < cnt; ++c) {
        mx[c] = neg_inf;
        sum[c] = 0;
        m_inner[c] = mk ? m_outer + mask_offset(mask.inner_rank, mask.inner_sizes, mask.inner_strides, i0 + c) : 0;
      }
      auto value = [&](int64_t d, int64_t c) -> acc_t {
        if (d >= valid) return neg_inf;
        acc_t v = base[d * inner + i0 + c] * call.scale;
        if (mk) v += mk[m_inner[c] + d * mask.dim_stride];
        return v;
      };
      for (int64_t d = 0; d < n; ++d)
        for (int64_t c = 0; c < cnt; ++c) mx[c] = nan_max(mx[c], value(d, c));
      for (int64_t d = 0; d < n; ++d)
        for (int64_t c = 0; c < cnt; ++c) {
          const acc_t e = std::exp(value(d, c) - mx[c]);
          sum[c] += e;
          base[d * inner + i0 + c] = e;
        }
      for (int64_t d = 0; d < n; ++d)
        for (int64_t c = 0; c < cnt; ++c) base[d * inner + i0 + c] /= sum[c];
    }
  }
}

void backward_double(const double* dy, const double* y, double* dx, const Call& call, int64_t begin,
                     int64_t end) {
  const int64_t n = call.n, inner = call.inner;
  for (int64_t o = begin; o < end; ++o) {
    const int64_t off = o * n * inner;
    for (int64_t i0 = 0; i0 < inner; i0 += kColBlock) {
      const int64_t cnt = std::min(kColBlock, inner - i0);
      double dot[kColBlock] = {};
      for (int64_t d = 0; d < n; ++d)
        for (int64_t c = 0; c < cnt; ++c) {
          const int64_t k = off + d * inner + i0 + c;
          dot[c] += dy[k] * y[k];
        }
      for (int64_t d = 0; d < n; ++d)
        for (int64_t c = 0; c < cnt; ++c) {
          const int64_t k = off + d * inner + i0 + c;
          dx[k] = call.scale * y[k] * (dy[k] - dot[c]);
        }
    }
  }
}

// ---- float, float16, bfloat16: float32 vectors ---------------------------

// count (<= W) mask values at positions j.. of a row whose mask elements are
// `stride` apart (0: one value broadcast along the row).
template <typename V, typename T>
V mask_values(const T* row_mask, int64_t stride, int64_t j, int64_t count) {
  if (stride == 1) return count == V::kWidth ? V::load(row_mask + j) : V::load(row_mask + j, count, 0.f);
  if (stride == 0) return V::broadcast(static_cast<float>(row_mask[0]));
  return cpu::load_strided<V>(row_mask + j * stride, stride, count);
}

// Softmax of one row of `valid` elements; the row's elements past valid
// (causal) become 0.
template <typename V, typename T>
void softmax_row(T* row, int64_t n, int64_t valid, float scale, bool scaled, const T* row_mask,
                 int64_t mask_stride) {
  constexpr int64_t W = V::kWidth;
  const float inf = std::numeric_limits<float>::infinity();
  // x * scale + mask at j..j+count, lanes past count at -inf.
  auto value = [&](int64_t j, int64_t count) {
    V v = count == W ? V::load(row + j) : V::load(row + j, count, 0.f);
    if (scaled) v = v * V::broadcast(scale);
    if (row_mask) v = v + mask_values<V>(row_mask, mask_stride, j, count);
    return count == W ? v : V::tail(v, count, -inf);
  };
  const int64_t full = valid - valid % W, rest = valid - full;
  V vmax = V::broadcast(-inf);
  for (int64_t j = 0; j < full; j += W) vmax = V::max(vmax, value(j, W));
  if (rest) vmax = V::max(vmax, value(full, rest));
  // A NaN the lane max skipped still reaches the sum through its exp.
  const V mx = V::broadcast(vmax.max_lane());

  // The exponentials go to `dst` (the row itself for float, else a float
  // buffer) when given; without it they are computed again for the output.
  auto normalize = [&](auto* dst) -> double {
    // Lanes summed over blocks of kSumBlock elements, blocks added in double:
    // wide rows keep their sum exact to float rounding at any vector width.
    double total = 0;
    for (int64_t b = 0; b < full; b += cpu::kSumBlock) {
      const int64_t block_end = std::min(full, b + cpu::kSumBlock);
      V vsum = V::broadcast(0.f);
      for (int64_t j = b; j < block_end; j += W) {
        const V e = (value(j, W) - mx).exp();
        vsum = vsum + e;
        if (dst) e.store(dst + j);
      }
      total += vsum.sum();
    }
    if (rest) {
      const V e = (value(full, rest) - mx).exp();
      total += e.sum();
      if (dst) e.store(dst + full, rest);
    }
    const V inv = V::broadcast(static_cast<float>(1.0 / total));
    for (int64_t j = 0; j < full; j += W) {
      const V e = dst ? V::load(dst + j) : (value(j, W) - mx).exp();
      (e * inv).store(row + j);
    }
    if (rest) {
      const V e = dst ? V::load(dst + full, rest, 0.f) : (value(full, rest) - mx).exp();
      (e * inv).store(row + full, rest);
    }
    return total;
  };
  double total;
  if constexpr (std::is_same_v<T, float>) {
    total = normalize(row);
  } else if (valid <= kRowBuffer) {
    float buffer[kRowBuffer];
    total = normalize(buffer);
  } else {
    total = normalize(static_cast<float*>(nullptr));
  }
  // Past the causal cut: 0, or NaN where the row became NaN (torch's softmax
  // over the -inf-filled row is NaN everywhere then).
  if (valid < n) std::fill(row + valid, row + n, T(std::isnan(total) ? std::numeric_limits<float>::quiet_NaN() : 0.f));
}

// Softmax of W rows of n <= kShortRow elements at `rows`. After a register
// transpose each vector holds one column of the W rows, so the max, the sum
// and the reciprocal are lane-wise: no row pays for horizontal reductions,
// which dominate rows of a few vectors.
template <typename V, typename T>
void softmax_short_rows(T* rows, int64_t n, float scale, bool scaled) {
  constexpr int64_t W = V::kWidth;
  V col[kShortRow];
  V vmax = V::broadcast(-std::numeric_limits<float>::infinity());
  for (int64_t c0 = 0; c0 < n; c0 += W) {
    const int64_t count = std::min(W, n - c0);
    V t[W];
    for (int64_t i = 0; i < W; ++i) t[i] = count == W ? V::load(rows + i * n + c0) : V::load(rows + i * n + c0, count, 0.f);
    V::transpose(t);
    for (int64_t j = 0; j < count; ++j) {
      col[c0 + j] = scaled ? t[j] * V::broadcast(scale) : t[j];
      vmax = V::max(vmax, col[c0 + j]);
    }
  }
  // A NaN the max skipped still reaches its lane's sum through its exp.
  V s0 = V::broadcast(0.f), s1 = V::broadcast(0.f);
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {
    col[j] = (col[j] - vmax).exp();
    col[j + 1] = (col[j + 1] - vmax).exp();
    s0 = s0 + col[j];
    s1 = s1 + col[j + 1];
  }
  if (j < n) {
    col[j] = (col[j] - vmax).exp();
    s0 = s0 + col[j];
  }
  const V inv = V::broadcast(1.f) / (s0 + s1);
  for (int64_t c0 = 0; c0 < n; c0 += W) {
    const int64_t count = std::min(W, n - c0);
    V t[W];
    for (int64_t i = 0; i < W; ++i) t[i] = i < count ? col[c0 + i] * inv : V::broadcast(0.f);
    V::transpose(t);
    for (int64_t i = 0; i < W; ++i) {
      if (count == W) {
        t[i].store(rows + i * n + c0);
      } else {
        t[i].store(rows + i * n + c0, count);
      }
    }
  }
}

template <typename T>
struct RowsForward {
  template <typename V>
  static void run(const Call* call, int64_t begin, int64_t end) {
    const MaskLayout& mask = *call->mask;
    const T* mk = static_cast<const T*>(mask.data);
    const int64_t n = call->n;
    int64_t o = begin;
    if constexpr (V::kWidth > 1) {
      if (call->short_rows) {
        for (; o + V::kWidth <= end; o += V::kWidth)
          softmax_short_rows<V>(static_cast<T*>(call->x) + o * n, n, static_cast<float>(call->scale),
                                call->scale != 1.0);
      }
    }
    for (; o < end; ++o) {
      const int64_t valid = call->causal_rows > 0 ? std::min(n, o % call->causal_rows + 1) : n;
      const T* row_mask = mk ? mk + outer_mask_offset(mask, o) : nullptr;
      softmax_row<V>(static_cast<T*>(call->x) + o * n, n, valid, static_cast<float>(call->scale),
                     call->scale != 1.0, row_mask, mask.dim_stride);
    }
  }
};

// Column blocks: item = o * blocks + b covers columns [b * kColBlock, ...) of
// outer index o. Each lane of the kColBlock / W vectors is one column.
template <typename T>
struct ColumnsForward {
  template <typename V>
  static void run(const Call* call, int64_t begin, int64_t end) {
    constexpr int64_t W = V::kWidth, Q = kColBlock / W;
    const float inf = std::numeric_limits<float>::infinity();
    const MaskLayout& mask = *call->mask;
    const T* mk = static_cast<const T*>(mask.data);
    const int64_t n = call->n, inner = call->inner, blocks = (inner + kColBlock - 1) / kColBlock;
    const float scale = static_cast<float>(call->scale);
    const bool scaled = call->scale != 1.0;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item / blocks, i0 = (item % blocks) * kColBlock;
      const int64_t cnt = std::min(kColBlock, inner - i0), nq = (cnt + W - 1) / W;
      T* base = static_cast<T*>(call->x) + o * n * inner + i0;
      int64_t m_inner[kColBlock];
      if (mk) {
        const int64_t m_outer = outer_mask_offset(mask, o);
        for (int64_t c = 0; c < cnt; ++c)
          m_inner[c] = m_outer + mask_offset(mask.inner_rank, mask.inner_sizes, mask.inner_strides, i0 + c);
      }
      auto value = [&](int64_t d, int64_t q) {
        const int64_t count = std::min(W, cnt - q * W);
        const T* p = base + d * inner + q * W;
        V v = count == W ? V::load(p) : V::load(p, count, 0.f);
        if (scaled) v = v * V::broadcast(scale);
        if (mk) {
          float m[W] = {};
          for (int64_t l = 0; l < count; ++l) m[l] = static_cast<float>(mk[m_inner[q * W + l] + d * mask.dim_stride]);
          v = v + V::load(static_cast<const float*>(m));
        }
        return count == W ? v : V::tail(v, count, -inf);
      };
      auto store = [&](const V& v, int64_t d, int64_t q) {
        const int64_t count = std::min(W, cnt - q * W);
        T* p = base + d * inner + q * W;
        if (count == W) {
          v.store(p);
        } else {
          v.store(p, count);
        }
      };
      V mx[Q], sum[Q];
      for (int64_t q = 0; q < nq; ++q) {
        mx[q] = V::broadcast(-inf);
        sum[q] = V::broadcast(0.f);
      }
      for (int64_t d = 0; d < n; ++d)
        for (int64_t q = 0; q < nq; ++q) mx[q] = V::max(mx[q], value(d, q));
      // float keeps exp(v - max) in place; half types compute it again.
      constexpr bool kKeep = std::is_same_v<T, float>;
      // Two-level float sums (blocks of kSumBlock rows): error grows with the
      // block size and the block count, not with n.
      for (int64_t d0 = 0; d0 < n; d0 += cpu::kSumBlock) {
        V part[Q];
        for (int64_t q = 0; q < nq; ++q) part[q] = V::broadcast(0.f);
        for (int64_t d = d0; d < std::min(n, d0 + cpu::kSumBlock); ++d)
          for (int64_t q = 0; q < nq; ++q) {
            const V e = (value(d, q) - mx[q]).exp();
            part[q] = part[q] + e;
            if (kKeep) store(e, d, q);
          }
        for (int64_t q = 0; q < nq; ++q) sum[q] = sum[q] + part[q];
      }
      for (int64_t q = 0; q < nq; ++q) sum[q] = V::broadcast(1.f) / sum[q];
      for (int64_t d = 0; d < n; ++d)
        for (int64_t q = 0; q < nq; ++q) {
          const int64_t count = std::min(W, cnt - q * W);
          const T* p = base + d * inner + q * W;
          const V e = kKeep ? (count == W ? V::load(p) : V::load(p, count, 0.f)) : (value(d, q) - mx[q]).exp();
          store(e * sum[q], d, q);
        }
    }
  }
};

struct BackwardCall {
  const void* dy;
  const void* y;
  void* dx;
  Call shape;
};

// dx = scale * y * (dy - sum(dy * y)) per row (inner == 1) or per column
// block; dx may be dy (each element is read before it is written).
template <typename T>
struct Backward {
  template <typename V>
  static void run(const BackwardCall* call, int64_t begin, int64_t end) {
    constexpr int64_t W = V::kWidth, Q = kColBlock / W;
    const T* dy = static_cast<const T*>(call->dy);
    const T* y = static_cast<const T*>(call->y);
    T* dx = static_cast<T*>(call->dx);
    const int64_t n = call->shape.n, inner = call->shape.inner;
    const V scale = V::broadcast(static_cast<float>(call->shape.scale));
    auto load = [](const T* p, int64_t count) { return count == W ? V::load(p) : V::load(p, count, 0.f); };
    auto store = [](const V& v, T* p, int64_t count) {
      if (count == W) {
        v.store(p);
      } else {
        v.store(p, count);
      }
    };
    if (inner == 1) {
      for (int64_t o = begin; o < end; ++o) {
        const T* g = dy + o * n;
        const T* out = y + o * n;
        T* res = dx + o * n;
        double sum = 0;  // blocks of kSumBlock in float lanes, added in double
        for (int64_t b = 0; b < n; b += cpu::kSumBlock) {
          V dot = V::broadcast(0.f);
          for (int64_t j = b; j < std::min(n, b + cpu::kSumBlock); j += W) {
            const int64_t count = std::min(W, n - j);
            dot = V::fma(load(g + j, count), load(out + j, count), dot);
          }
          sum += dot.sum();
        }
        const V total = V::broadcast(static_cast<float>(sum));
        for (int64_t j = 0; j < n; j += W) {
          const int64_t count = std::min(W, n - j);
          store(scale * load(out + j, count) * (load(g + j, count) - total), res + j, count);
        }
      }
      return;
    }
    const int64_t blocks = (inner + kColBlock - 1) / kColBlock;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item / blocks, i0 = (item % blocks) * kColBlock;
      const int64_t cnt = std::min(kColBlock, inner - i0), nq = (cnt + W - 1) / W;
      const int64_t off = o * n * inner + i0;
      V dot[Q];
      for (int64_t q = 0; q < nq; ++q) dot[q] = V::broadcast(0.f);
      for (int64_t d0 = 0; d0 < n; d0 += cpu::kSumBlock) {  // two-level sums, as the forward
        V part[Q];
        for (int64_t q = 0; q < nq; ++q) part[q] = V::broadcast(0.f);
        for (int64_t d = d0; d < std::min(n, d0 + cpu::kSumBlock); ++d)
          for (int64_t q = 0; q < nq; ++q) {
            const int64_t k = off + d * inner + q * W, count = std::min(W, cnt - q * W);
            part[q] = V::fma(load(dy + k, count), load(y + k, count), part[q]);
          }
        for (int64_t q = 0; q < nq; ++q) dot[q] = dot[q] + part[q];
      }
      for (int64_t d = 0; d < n; ++d)
        for (int64_t q = 0; q < nq; ++q) {
          const int64_t k = off + d * inner + q * W, count = std::min(W, cnt - q * W);
          store(scale * load(y + k, count) * (load(dy + k, count) - dot[q]), dx + k, count);
        }
    }
  }
};

// Rows per chunk (or column blocks per chunk) worth a thread.
int64_t items(const Call& c) { return c.inner == 1 ? c.outer : c.outer * ((c.inner + kColBlock - 1) / kColBlock); }
int64_t grain(const Call& c) { return cpu_grain(c.n * std::min(c.inner, kColBlock) * 4); }

template <template <typename> class K, typename Args>
void run_typed(ScalarKind kind, const Args* args, int64_t begin, int64_t end) {
  switch (kind) {
    case ScalarKind::kFloat16: return cpu::run_best<K<c10::Half>>(args, begin, end);
    case ScalarKind::kBFloat16: return cpu::run_best<K<c10::BFloat16>>(args, begin, end);
    case ScalarKind::kFloat32: return cpu::run_best<K<float>>(args, begin, end);
    case ScalarKind::kFloat64: break;  // callers take the double path
  }
}

}  // namespace

int softmax_forward_cpu(ScalarKind kind, void* x, int64_t outer, int64_t n, int64_t inner, double scale,
                        int64_t causal_rows, const MaskLayout& mask) {
  const bool short_rows = inner == 1 && mask.data == nullptr && causal_rows == 0 && n <= kShortRow;
  const Call call{x, outer, n, inner, scale, causal_rows, &mask, short_rows};
  if (kind == ScalarKind::kFloat64) {
    cpu_parallel_for(outer, grain(call), [&](int64_t b, int64_t e) { forward_double(call, b, e); });
  } else if (inner == 1) {
    const int64_t unit = short_rows ? kShortGroupRows : 1;
    cpu_parallel_for((outer + unit - 1) / unit, (grain(call) + unit - 1) / unit, [&](int64_t b, int64_t e) {
      run_typed<RowsForward>(kind, &call, b * unit, std::min(outer, e * unit));
    });
  } else {
    cpu_parallel_for(items(call), grain(call),
                     [&](int64_t b, int64_t e) { run_typed<ColumnsForward>(kind, &call, b, e); });
  }
  return 0;
}

int softmax_backward_cpu(ScalarKind kind, const void* grad_output, const void* y, void* grad_input, int64_t outer,
                         int64_t n, int64_t inner, double scale) {
  const BackwardCall call{grad_output, y, grad_input, Call{nullptr, outer, n, inner, scale, 0, nullptr, false}};
  if (kind == ScalarKind::kFloat64) {
    cpu_parallel_for(outer, grain(call.shape), [&](int64_t b, int64_t e) {
      backward_double(static_cast<const double*>(grad_output), static_cast<const double*>(y),
                      static_cast<double*>(grad_input), call.shape, b, e);
    });
  } else {
    cpu_parallel_for(items(call.shape), grain(call.shape),
                     [&](int64_t b, int64_t e) { run_typed<Backward>(kind, &call, b, e); });
  }
  return 0;
}

}  // namespace make_inplace::kernels
