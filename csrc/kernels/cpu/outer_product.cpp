// Batched outer product on the CPU, torch-free. Operands whose last axis is
// contiguous run in float32 vectors (cpu_vec.h; float64 in double, one
// element at a time), others through their strides one element at a time.
// The backward reads grad_out once per batch when a column block holds the
// whole row (m <= kCols): row sums (grad_a) and column sums (grad_b) in the
// same sweep, the column sums in a stack block. Wider rows take one sweep per
// result, each split finer over the threads. No heap memory.
#include "make_inplace/kernels/outer_product.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>

#include "cpu_dispatch.h"
#include "cpu_rows.h"
#include "make_inplace/kernels/cpu_parallel.h"

namespace make_inplace::kernels {
namespace {

constexpr int64_t kCols = 2048;  // column sums held on the stack (8 KiB of float)

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
T stored(T old, Acc<T> value, bool accumulate) {
  return static_cast<T>(accumulate ? Acc<T>(old) + value : value);
}

struct ForwardCall {
  OuterInput a, b;
  void* out;
  int64_t n, m;
};

// Rows [begin, end) of out viewed as (batch * n, m). V is VecPortable for
// float64 and for a strided b, where it reads b element by element.
template <typename T>
struct Forward {
  template <typename V>
  static void run(const ForwardCall* c, int64_t begin, int64_t end) {
    constexpr int64_t W = V::kWidth;
    const T* a = static_cast<const T*>(c->a.data);
    const T* b = static_cast<const T*>(c->b.data);
    const int64_t n = c->n, m = c->m, bs = c->b.stride[1];
    // (s, i) of row r, stepped along without a division per row.
    int64_t s = begin / n, i = begin - s * n;
    for (int64_t r = begin; r < end; ++r, i = i + 1 == n ? (++s, 0) : i + 1) {
      const T* bs_row = b + s * c->b.stride[0];
      T* dst = static_cast<T*>(c->out) + r * m;
      if (bs != 1 || std::is_same_v<T, double>) {
        const Acc<T> ai = Acc<T>(a[s * c->a.stride[0] + i * c->a.stride[1]]);
        for (int64_t j = 0; j < m; ++j) dst[j] = static_cast<T>(ai * Acc<T>(bs_row[j * bs]));
        continue;
      }
      const V ai = V::broadcast(static_cast<float>(a[s * c->a.stride[0] + i * c->a.stride[1]]));
      int64_t j = 0;
      for (; j + W <= m; j += W) (ai * V::load(bs_row + j)).store(dst + j);
      if (j < m) (ai * V::load(bs_row + j, m - j, 0.f)).store(dst + j, m - j);
    }
  }
};

struct BackwardCall {
  OuterInput g, a, b;
  void* grad_a;
  void* grad_b;
  int64_t n, m;
  bool accumulate;
};

// Element (i, j) of batch s of an operand, through its strides.
template <typename T>
Acc<T> at(const OuterInput& t, int64_t s, int64_t i, int64_t j = 0) {
  return Acc<T>(static_cast<const T*>(t.data)[s * t.stride[0] + i * t.stride[1] + j * t.stride[2]]);
}

// For batch s, columns [j0, j0 + cnt) and rows [i0, i1):
//   cols[j] += sum_i g[s, i, j0 + j] a[s, i]            (when cols is given)
//   on_row(i, sum_j g[s, i, j0 + j] b[s, j0 + j])        (with rows)
template <typename V, typename T, typename F>
void sweep(const BackwardCall& c, int64_t s, int64_t j0, int64_t cnt, int64_t i0, int64_t i1, Acc<T>* cols,
           bool rows, const F& on_row) {
  const bool dots = rows;
  constexpr int64_t W = V::kWidth;
  const T* brow = static_cast<const T*>(c.b.data) + s * c.b.stride[0] + j0 * c.b.stride[1];
  const bool vector = !std::is_same_v<T, double> && c.g.stride[2] == 1 && c.b.stride[1] == 1;
  for (int64_t i = i0; i < i1; ++i) {
    const Acc<T> ai = at<T>(c.a, s, i);
    const T* grow = static_cast<const T*>(c.g.data) + s * c.g.stride[0] + i * c.g.stride[1] + j0 * c.g.stride[2];
    Acc<T> dot = 0;
    if constexpr (!std::is_same_v<T, double>) {
      if (vector) {
        const V va = V::broadcast(ai);
        V vdot = V::broadcast(0.f);
        for (int64_t j = 0; j < cnt; j += W) {
          const int64_t count = std::min(W, cnt - j);
          const V gv = cpu::load_n<V>(grow + j, count);
          if (dots) vdot = V::fma(gv, cpu::load_n<V>(brow + j, count), vdot);
          if (cols) {
            const V sum = V::fma(gv, va, cpu::load_n<V>(cols + j, count));
            if (count == W) {
              sum.store(cols + j);
            } else {
              sum.store(cols + j, count);
            }
          }
        }
        dot = vdot.sum();
      }
    }
    if (!vector) {
      for (int64_t j = 0; j < cnt; ++j) {
        const Acc<T> gij = Acc<T>(grow[j * c.g.stride[2]]);
        if (dots) dot += gij * Acc<T>(brow[j * c.b.stride[1]]);
        if (cols) cols[j] += gij * ai;
      }
    }
    if (rows) on_row(i, dot);
  }
}

// m <= kCols: item = batch s, one sweep over its rows, each row's dot stored
// as it completes, the column sums of the whole row in one stack block.
template <typename T>
struct Backward {
  template <typename V>
  static void run(const BackwardCall* c, int64_t begin, int64_t end) {
    T* ga = static_cast<T*>(c->grad_a);
    T* gb = static_cast<T*>(c->grad_b);
    for (int64_t s = begin; s < end; ++s) {
      Acc<T> cols[kCols];
      if (gb) std::fill(cols, cols + c->m, Acc<T>(0));
      T* ga_s = ga ? ga + s * c->n : nullptr;
      sweep<V, T>(*c, s, 0, c->m, 0, c->n, gb ? cols : nullptr, ga != nullptr,
                  [&](int64_t i, Acc<T> dot) { ga_s[i] = stored<T>(ga_s[i], dot, c->accumulate); });
      if (gb)
        for (int64_t j = 0; j < c->m; ++j) gb[s * c->m + j] = stored<T>(gb[s * c->m + j], cols[j], c->accumulate);
    }
  }
};

// m > kCols, grad_b: item = (batch s, column block), its sums over every row.
template <typename T>
struct ColumnSums {
  template <typename V>
  static void run(const BackwardCall* c, int64_t begin, int64_t end) {
    const int64_t blocks = (c->m + kCols - 1) / kCols;
    T* gb = static_cast<T*>(c->grad_b);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / blocks, j0 = (item % blocks) * kCols, cnt = std::min(kCols, c->m - j0);
      Acc<T> cols[kCols];
      std::fill(cols, cols + cnt, Acc<T>(0));
      sweep<V, T>(*c, s, j0, cnt, 0, c->n, cols, false, [](int64_t, Acc<T>) {});
      T* dst = gb + s * c->m + j0;
      for (int64_t j = 0; j < cnt; ++j) dst[j] = stored<T>(dst[j], cols[j], c->accumulate);
    }
  }
};

// m > kCols, grad_a: item = (batch s, block of kCols rows), each row's dot
// with b over all m columns, column block by column block.
template <typename T>
struct RowSums {
  template <typename V>
  static void run(const BackwardCall* c, int64_t begin, int64_t end) {
    const int64_t blocks = (c->n + kCols - 1) / kCols;
    T* ga = static_cast<T*>(c->grad_a);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / blocks, i0 = (item % blocks) * kCols, i1 = std::min(c->n, i0 + kCols);
      Acc<T> dots[kCols] = {};
      for (int64_t j0 = 0; j0 < c->m; j0 += kCols)
        sweep<V, T>(*c, s, j0, std::min(kCols, c->m - j0), i0, i1, nullptr, true,
                    [&](int64_t i, Acc<T> dot) { dots[i - i0] += dot; });
      for (int64_t i = i0; i < i1; ++i) ga[s * c->n + i] = stored<T>(ga[s * c->n + i], dots[i - i0], c->accumulate);
    }
  }
};

}  // namespace

int outer_product_forward_cpu(ScalarKind kind, OuterInput a, OuterInput b, void* out, int64_t batch, int64_t n,
                              int64_t m) {
  const ForwardCall call{a, b, out, n, m};
  return cpu::parallel_for_kind<Forward>(kind, call, batch * n, cpu_grain(m));
}

int outer_product_backward_cpu(ScalarKind kind, OuterInput grad_out, OuterInput a, OuterInput b, void* grad_a,
                               void* grad_b, int64_t batch, int64_t n, int64_t m, bool accumulate) {
  if (!cpu::handles(kind)) return 1;  // before any of the launches below
  const BackwardCall call{grad_out, a, b, grad_a, grad_b, n, m, accumulate};
  if (m <= kCols) return cpu::parallel_for_kind<Backward>(kind, call, batch, cpu_grain(2 * n * m));
  if (grad_b) cpu::parallel_for_kind<ColumnSums>(kind, call, batch * ((m + kCols - 1) / kCols), cpu_grain(n * kCols));
  if (grad_a) cpu::parallel_for_kind<RowSums>(kind, call, batch * ((n + kCols - 1) / kCols), cpu_grain(kCols * m));
  return 0;
}

}  // namespace make_inplace::kernels
