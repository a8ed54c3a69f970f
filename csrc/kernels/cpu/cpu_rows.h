#pragma once
// Row reductions shared by the CPU norm kernels: float32 vector lanes over
// blocks of kSumBlock elements, each block's total added in double, so a wide
// row keeps near-double accuracy at float speed.
#include <algorithm>
#include <cstdint>

#include "cpu_vec.h"

namespace make_inplace::kernels::cpu {

constexpr int64_t kSumBlock = 512;

// sum over j of f(load(row + j)) for the row's n elements (f: vector to
// vector; lanes past the row's end are dropped after f).
template <typename V, typename T, typename F>
double row_sum(const T* row, int64_t n, const F& f) {
  constexpr int64_t W = V::kWidth;
  double total = 0;
  for (int64_t b = 0; b < n; b += kSumBlock) {
    const int64_t end = std::min(n, b + kSumBlock);
    const int64_t full = b + (end - b) / (2 * W) * (2 * W);
    V s0 = V::broadcast(0.f), s1 = V::broadcast(0.f);
    int64_t j = b;
    for (; j < full; j += 2 * W) {
      s0 = s0 + f(V::load(row + j));
      s1 = s1 + f(V::load(row + j + W));
    }
    for (; j < end; j += W) {
      const int64_t count = std::min(W, end - j);
      s0 = s0 + (count == W ? f(V::load(row + j)) : V::tail(f(V::load(row + j, count, 0.f)), count, 0.f));
    }
    total += static_cast<double>((s0 + s1).sum());
  }
  return total;
}

// dst[j..j+W) = f(load(src + j), j, count) over the row's n elements, where
// count < W only for the tail (stored partially; f loads its own operands at j
// with load_n(p, count)).
template <typename V, typename T, typename F>
void row_map(const T* src, T* dst, int64_t n, const F& f) {
  constexpr int64_t W = V::kWidth;
  int64_t j = 0;
  for (; j + W <= n; j += W) f(V::load(src + j), j, W).store(dst + j);
  if (j < n) f(V::load(src + j, n - j, 0.f), j, n - j).store(dst + j, n - j);
}

// count == W: a full vector at p, else the first `count` elements (rest 0).
template <typename V, typename T>
V load_n(const T* p, int64_t count) {
  return count == V::kWidth ? V::load(p) : V::load(p, count, 0.f);
}

}  // namespace make_inplace::kernels::cpu
