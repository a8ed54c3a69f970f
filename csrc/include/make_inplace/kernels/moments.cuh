#pragma once
// Mean and variance of a row in one pass, for layer norm's staged kernel.
//
// Why: that kernel read each row from shared memory twice for its statistics
// (a sum pass, then a deviation pass) with a CTA-wide reduction after each,
// and ncu on an H100 had it issue-bound (bf16 (1024, 65536): 39 instructions
// per element, an instruction issued on 69% of cycles, DRAM 47%). Here each
// thread folds groups of values into (count, mean, M2 = sum of squared
// deviations) with the pairwise update of Chan, Golub and LeVeque, and the
// CTA merges the threads' triples in one tree. Each group's deviations are
// taken from the group's own mean and the update never subtracts large sums,
// so the result keeps the accuracy of the two-pass formula (no
// E[x^2] - E[x]^2 cancellation on rows far from zero).
#include <cuda_runtime.h>

namespace make_inplace::kernels::rowwise {

struct Moments {
  float n = 0.f;     // values folded in
  float mean = 0.f;  // their mean
  float m2 = 0.f;    // their sum of squared deviations from it

  // Folds in `count` values with mean `m` and squared deviations `q`.
  __device__ __forceinline__ void merge(float count, float m, float q) {
    const float total = n + count;
    // An approximate quotient (2 ulp) weights the update; count <= total.
    const float f = total > 0.f ? __fdividef(count, total) : 0.f;
    const float d = m - mean;
    mean = fmaf(d, f, mean);
    m2 += fmaf(d * d, n * f, q);
    n = total;
  }

  __device__ __forceinline__ void merge(const Moments& o) { merge(o.n, o.mean, o.m2); }

  // F values (a 16-byte vector, unpacked): their own mean and squared
  // deviations from it, then one merge. Sums are pairwise, for ILP.
  template <int F>
  __device__ __forceinline__ void add(const float* v) {
    float t[F];
#pragma unroll
    for (int e = 0; e < F; ++e) t[e] = v[e];
#pragma unroll
    for (int width = F / 2; width > 0; width /= 2) {
#pragma unroll
      for (int e = 0; e < width; ++e) t[e] += t[e + width];
    }
    const float m = t[0] * (1.0f / F);
    float q[F];
#pragma unroll
    for (int e = 0; e < F; ++e) {
      const float d = v[e] - m;
      q[e] = d * d;
    }
#pragma unroll
    for (int width = F / 2; width > 0; width /= 2) {
#pragma unroll
      for (int e = 0; e < width; ++e) q[e] += q[e + width];
    }
    merge(static_cast<float>(F), m, q[0]);
  }
};

__device__ __forceinline__ Moments shfl_xor_moments(const Moments& m, int offset) {
  Moments o;
  o.n = __shfl_xor_sync(0xffffffffu, m.n, offset);
  o.mean = __shfl_xor_sync(0xffffffffu, m.mean, offset);
  o.m2 = __shfl_xor_sync(0xffffffffu, m.m2, offset);
  return o;
}

// The moments of the whole CTA (blockDim.x a multiple of 32, at most 1024),
// the same bits in every thread: lanes of a butterfly can round a merge
// differently, so lane 0's result is broadcast. `scratch` holds 96 floats
// and is free again on return.
__device__ __forceinline__ Moments block_moments(Moments m, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) m.merge(shfl_xor_moments(m, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    scratch[warp] = m.n;
    scratch[32 + warp] = m.mean;
    scratch[64 + warp] = m.m2;
  }
  __syncthreads();
  m = Moments{};
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
