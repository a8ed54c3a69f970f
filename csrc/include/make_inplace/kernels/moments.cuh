#pragma once
// Mean and variance of a row in one pass, for layer norm's staged and
// long-row kernels.
//
// Why: that kernel read each row from shared memory twice for its statistics
// (a sum pass, then a deviation pass) with a CTA-wide reduction after each,
// and was issue-bound (docs/rowwise_tuning.md). Here each
// thread folds groups of values into (count, mean, M2 = sum of squared
// deviations) with the pairwise update of Chan, Golub and LeVeque, and the
// CTA merges the threads' triples in one tree. Each group's deviations are
// taken from the group's own mean and the update never subtracts large sums,
// so M2 keeps the accuracy of the two-pass formula (no E[x^2] - E[x]^2
// cancellation). The kernels fold x - shift, shift a value of the row, so
// that the mean too stays exact to float precision on rows far from zero.
#include <cuda_runtime.h>

namespace make_inplace::kernels::rowwise {

// count / total with count <= total: an approximate quotient (2 ulp) for
// float, where it only weights an update, the exact one for double.
__device__ __forceinline__ float merge_weight(float count, float total) {
  return __fdividef(count, total);
}
__device__ __forceinline__ double merge_weight(double count, double total) { return count / total; }

template <typename A>
struct Moments {
  A n = 0;     // values folded in
  A mean = 0;  // their mean
  A m2 = 0;    // their sum of squared deviations from it

  // Folds in `count` values with mean `m` and squared deviations `q`.
  __device__ __forceinline__ void merge(A count, A m, A q) {
    const A total = n + count;
    const A f = total > A(0) ? merge_weight(count, total) : A(0);
    const A d = m - mean;
    mean = fma(d, f, mean);
    m2 += fma(d * d, n * f, q);
    n = total;
  }

  __device__ __forceinline__ void merge(const Moments& o) { merge(o.n, o.mean, o.m2); }

  // F values (one vector, unpacked): their own mean and squared deviations
  // from it, then one merge. Sums are pairwise, for ILP.
  template <int F>
  __device__ __forceinline__ void add(const A* v) {
    A t[F];
#pragma unroll
    for (int e = 0; e < F; ++e) t[e] = v[e];
#pragma unroll
    for (int width = F / 2; width > 0; width /= 2) {
#pragma unroll
      for (int e = 0; e < width; ++e) t[e] += t[e + width];
    }
    const A m = t[0] * (A(1) / A(F));
    A q[F];
#pragma unroll
    for (int e = 0; e < F; ++e) {
      const A d = v[e] - m;
      q[e] = d * d;
    }
#pragma unroll
    for (int width = F / 2; width > 0; width /= 2) {
#pragma unroll
      for (int e = 0; e < width; ++e) q[e] += q[e + width];
    }
    merge(static_cast<A>(F), m, q[0]);
  }
};

template <typename A>
__device__ __forceinline__ Moments<A> shfl_xor_moments(const Moments<A>& m, int offset) {
  Moments<A> o;
  o.n = __shfl_xor_sync(0xffffffffu, m.n, offset);
  o.mean = __shfl_xor_sync(0xffffffffu, m.mean, offset);
  o.m2 = __shfl_xor_sync(0xffffffffu, m.m2, offset);
  return o;
}

// The moments of the whole CTA (blockDim.x a multiple of 32, at most 1024),
// the same bits in every thread: lanes of a butterfly can round a merge
// differently, so lane 0's result is broadcast. `scratch` holds 96 values
// and is free again on return.
template <typename A>
__device__ __forceinline__ Moments<A> block_moments(Moments<A> m, A* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) m.merge(shfl_xor_moments(m, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    scratch[warp] = m.n;
    scratch[32 + warp] = m.mean;
    scratch[64 + warp] = m.m2;
  }
  __syncthreads();
  m = Moments<A>{};
  if (lane < static_cast<int>(blockDim.x / 32)) {
    m.n = scratch[lane];
    m.mean = scratch[32 + lane];
    m.m2 = scratch[64 + lane];
  }
  for (int offset = 16; offset > 0; offset /= 2) m.merge(shfl_xor_moments(m, offset));
  m.n = __shfl_sync(0xffffffffu, m.n, 0);
  m.mean = __shfl_sync(0xffffffffu, m.mean, 0);
  m.m2 = __shfl_sync(0xffffffffu, m.m2, 0);
  __syncthreads();  // scratch is free for the next row
  return m;
}

}  // namespace make_inplace::kernels::rowwise
