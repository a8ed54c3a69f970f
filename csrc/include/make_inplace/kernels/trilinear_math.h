#pragma once
// The trilinear weights and their derivatives, shared by the CPU and CUDA
// kernels so both evaluate the same polynomial in the same order.
#if defined(__CUDACC__)
#define MAKE_INPLACE_HD __host__ __device__ __forceinline__
#else
#define MAKE_INPLACE_HD inline
#endif

namespace make_inplace::kernels {

// w[4i + 2j + l] = (i ? u : 1-u)(j ? v : 1-v)(l ? w : 1-w), (u, v, w) = (p + 1) / 2.
template <typename Acc>
MAKE_INPLACE_HD void trilinear_weights(Acc x, Acc y, Acc z, Acc w[8]) {
  const Acc u = (x + Acc(1)) * Acc(0.5), v = (y + Acc(1)) * Acc(0.5),
            t = (z + Acc(1)) * Acc(0.5);
  const Acc wu[2] = {Acc(1) - u, u}, wv[2] = {Acc(1) - v, v},
            wt[2] = {Acc(1) - t, t};
  for (int k = 0; k < 8; ++k) w[k] = wu[k >> 2] * wv[(k >> 1) & 1] * wt[k & 1];
}

// d w_k / d(x, y, z); the 0.5 is du/dx.
template <typename Acc>
MAKE_INPLACE_HD void trilinear_weight_grads(Acc x, Acc y, Acc z, Acc dx[8],
                                            Acc dy[8], Acc dz[8]) {
  const Acc u = (x + Acc(1)) * Acc(0.5), v = (y + Acc(1)) * Acc(0.5),
            t = (z + Acc(1)) * Acc(0.5);
  const Acc wu[2] = {Acc(1) - u, u}, wv[2] = {Acc(1) - v, v},
            wt[2] = {Acc(1) - t, t};
  const Acc sign[2] = {Acc(-0.5), Acc(0.5)};
  for (int k = 0; k < 8; ++k) {
    const int i = k >> 2, j = (k >> 1) & 1, l = k & 1;
    dx[k] = sign[i] * wv[j] * wt[l];
    dy[k] = wu[i] * sign[j] * wt[l];
    dz[k] = wu[i] * wv[j] * sign[l];
  }
}

}  // namespace make_inplace::kernels
