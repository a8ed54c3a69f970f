// Trilinear interpolation on CUDA. Memory-bound: the fastest thread index
// walks the contiguous feature axis in 16-byte packs, each output byte is
// written once, and half types accumulate in float32.
//
// Forward: one thread per (point, pack of features): 8 corner packs in, one
// pack out. Backward: a group of lanes (a power of two up to a warp) per
// point sweeps its features, writes grad_feats, and, for grad_points, sums
// its share of grad_out * d out / d point; the group's shuffle-reduce then
// writes the point's 3 gradients once (no atomics).
#include "make_inplace/kernels/cuda_pack.cuh"
#include "make_inplace/kernels/trilinear.h"
#include "make_inplace/kernels/trilinear_math.h"

namespace make_inplace::kernels {
namespace {

using namespace cuda_detail;

constexpr int kThreads = 256;

template <typename T, int V, typename Index>
__global__ void __launch_bounds__(kThreads)
    trilinear_forward_kernel(const T* __restrict__ feats, int64_t fs0, int64_t fs1,
                             int64_t fs2, const T* __restrict__ points, int64_t ps0,
                             int64_t ps1, T* __restrict__ out, Index n, Index packs) {
  using A = acc_t<T>;
  const Index total = n * packs;
  const Index step = static_cast<Index>(gridDim.x) * kThreads;
  const int64_t f = static_cast<int64_t>(packs) * V;
  for (Index idx = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; idx < total;
       idx += step) {
    const Index p = idx / packs;
    const int64_t col = static_cast<int64_t>(idx - p * packs) * V;
    const T* pt = points + static_cast<int64_t>(p) * ps0;
    A w[8];
    trilinear_weights<A>(to_acc(pt[0]), to_acc(pt[ps1]), to_acc(pt[2 * ps1]), w);
    const T* src = feats + static_cast<int64_t>(p) * fs0 + col * fs2;
    Pack<T, V> corner[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) corner[k] = load_pack<T, V>(src + k * fs1, fs2, true);
    A c[8][V], sum[V];
#pragma unroll
    for (int k = 0; k < 8; ++k) unpack(corner[k], c[k]);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      sum[e] = 0;
#pragma unroll
      for (int k = 0; k < 8; ++k) sum[e] += w[k] * c[k][e];
    }
    const Pack<T, V> result = pack_from<T, V>(sum);
    store_pack<T, V>(out + static_cast<int64_t>(p) * f + col, result);
  }
}

template <typename T, int V, bool kWithPoints>
__global__ void __launch_bounds__(kThreads)
    trilinear_backward_kernel(const T* __restrict__ grad, int64_t gs0, int64_t gs1,
                              const T* __restrict__ points, int64_t ps0, int64_t ps1,
                              const T* __restrict__ feats, int64_t fs0, int64_t fs1,
                              int64_t fs2, T* __restrict__ grad_feats,
                              T* __restrict__ grad_points, int64_t n, int64_t packs,
                              int group, bool accumulate) {
  using A = acc_t<T>;
  const int64_t f = packs * V;
  const int lane = threadIdx.x & (group - 1);
  const int64_t groups_per_grid = static_cast<int64_t>(gridDim.x) * (kThreads / group);
  const int64_t mine = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / group;
  // Every lane of a warp runs the same number of iterations (keyed on the
  // warp's first group), so the shuffles below never see an exited lane.
  const int64_t offset_in_warp = (threadIdx.x & 31) / group;
  // A template flag, so the grad_feats-only kernel does not carry the
  // registers of the points gradient.
  constexpr bool with_points = kWithPoints;
  // A point's coordinates are loaded one iteration ahead: loaded in it, the
  // weights waited a memory round trip before the packs' loads went out.
  const auto load_point = [&](int64_t q, A (&xyz)[3]) {
    if (q < n) {
      const T* pt = points + q * ps0;
#pragma unroll
      for (int d = 0; d < 3; ++d) xyz[d] = to_acc(pt[d * ps1]);
    }
  };
  A next[3] = {};
  load_point(mine, next);
  for (int64_t base = mine - offset_in_warp; base < n; base += groups_per_grid) {
    const int64_t p = base + offset_in_warp;
    const bool valid = p < n;
    const A x = next[0], y = next[1], z = next[2];
    load_point(p + groups_per_grid, next);
    A sx = 0, sy = 0, sz = 0;
    if (valid) {
      A w[8];
      trilinear_weights<A>(x, y, z, w);
      // grad_points = sum_k dw_k/dp * h_k, h_k = sum_e grad_out[e] * corner_k[e]:
      // the loop keeps the 8 h_k and the 24 weight derivatives come after it,
      // so they never share registers with the loads (float32: 106 -> 74
      // registers, three CTAs an SM instead of two; docs/notes/trilinear.md).
      A h[with_points ? 8 : 1] = {};
      const T* g_row = grad + p * gs0;
      T* gf = grad_feats + p * 8 * f;
      const T* f_row = with_points ? feats + p * fs0 : nullptr;
      for (int64_t c = lane; c < packs; c += group) {
        const int64_t col = c * V;
        const Pack<T, V> g = load_pack<T, V>(g_row + col * gs1, gs1, true);
        // Every load of the step before the stores: the corners loaded after
        // them waited a second memory round trip (float32 ran at 67-74% of the
        // copy bandwidth, 16-bit at 89-91%).
        Pack<T, V> corner[with_points ? 8 : 1];
        if constexpr (with_points) {
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            corner[k] = load_pack<T, V>(f_row + k * fs1 + col * fs2, fs2, true);
          }
        }
        A ga[V];
#pragma unroll
        for (int e = 0; e < V; ++e) ga[e] = to_acc(g.v[e]);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          T* dst = gf + k * f + col;
          Pack<T, V> r;
          if (accumulate) {
            const Pack<T, V> old = load_pack<T, V>(dst, 1, true);
#pragma unroll
            for (int e = 0; e < V; ++e) r.v[e] = from_acc<T>(to_acc(old.v[e]) + w[k] * ga[e]);
          } else {
#pragma unroll
            for (int e = 0; e < V; ++e) r.v[e] = from_acc<T>(w[k] * ga[e]);
          }
          // Streaming: grad_feats is not read again here.
          store_pack<T, V, true>(dst, r);
        }
        if constexpr (with_points) {
#pragma unroll
          for (int k = 0; k < 8; ++k) {
#pragma unroll
            for (int e = 0; e < V; ++e) h[k] += ga[e] * to_acc(corner[k].v[e]);
          }
        }
      }
      if constexpr (with_points) {
        A dx[8], dy[8], dz[8];
        trilinear_weight_grads<A>(x, y, z, dx, dy, dz);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          sx += dx[k] * h[k];
          sy += dy[k] * h[k];
          sz += dz[k] * h[k];
        }
      }
    }
    if constexpr (with_points) {
      sx = group_sum(sx, group);
      sy = group_sum(sy, group);
      sz = group_sum(sz, group);
      if (valid && lane == 0) {
        T* dst = grad_points + p * 3;
        const A s[3] = {sx, sy, sz};
#pragma unroll
        for (int d = 0; d < 3; ++d) {
          dst[d] = from_acc<T>(accumulate ? to_acc(dst[d]) + s[d] : s[d]);
        }
      }
    }
  }
}

bool multiple_of(int64_t x, int v) { return x % v == 0; }

}  // namespace

cudaError_t trilinear_forward_cuda(ScalarKind kind, TrilinearInput feats,
                                   TrilinearInput points, void* out, int64_t n,
                                   int64_t f, cudaStream_t stream) {
  if (n == 0 || f == 0) return cudaSuccess;
  return dispatch_kind(kind, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const int64_t* fs = feats.stride;
    // 16-byte packs need every pack to start on a 16-byte boundary.
    const bool vec = V > 1 && (fs[2] == 1 || f == 1) && multiple_of(f, V) &&
                     multiple_of(fs[1], V) && multiple_of(fs[0], V) &&
                     aligned16(feats.data) && aligned16(out);
    const auto launch = [&](auto vtag) {
      constexpr int W = decltype(vtag)::value;
      const int64_t packs = f / W;
      const int64_t total = n * packs;
      const int64_t grid = grid_for(total, kThreads);
      const T* fp = static_cast<const T*>(feats.data);
      const T* pp = static_cast<const T*>(points.data);
      if (total <= INT32_MAX) {
        trilinear_forward_kernel<T, W, uint32_t><<<grid, kThreads, 0, stream>>>(
            fp, fs[0], fs[1], fs[2], pp, points.stride[0], points.stride[1],
            static_cast<T*>(out), static_cast<uint32_t>(n), static_cast<uint32_t>(packs));
      } else {
        trilinear_forward_kernel<T, W, int64_t><<<grid, kThreads, 0, stream>>>(
            fp, fs[0], fs[1], fs[2], pp, points.stride[0], points.stride[1],
            static_cast<T*>(out), n, packs);
      }
      return cudaGetLastError();
    };
    return vec ? launch(std::integral_constant<int, V>{})
               : launch(std::integral_constant<int, 1>{});
  });
}

cudaError_t trilinear_backward_cuda(ScalarKind kind, TrilinearInput grad_out,
                                    TrilinearInput points, TrilinearInput feats,
                                    void* grad_feats, void* grad_points,
                                    int64_t n, int64_t f, bool accumulate,
                                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch_kind(kind, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = kVec16<T>;
    const int64_t* gs = grad_out.stride;
    const int64_t* fs = feats.stride;
    const bool with_points = grad_points != nullptr;
    const bool vec =
        V > 1 && multiple_of(f, V) && aligned16(grad_feats) &&
        (gs[1] == 1 || f == 1) && multiple_of(gs[0], V) && aligned16(grad_out.data) &&
        (!with_points || ((fs[2] == 1 || f == 1) && multiple_of(fs[1], V) &&
                          multiple_of(fs[0], V) && aligned16(feats.data)));
    const auto launch = [&](auto vtag) {
      constexpr int W = decltype(vtag)::value;
      const int64_t packs = f / W;
      const int group = pow2_at_least(packs, 32);
      const int64_t grid = grid_for(n * group, kThreads);
      auto kernel = with_points ? trilinear_backward_kernel<T, W, true>
                                : trilinear_backward_kernel<T, W, false>;
      kernel<<<grid, kThreads, 0, stream>>>(
          static_cast<const T*>(grad_out.data), gs[0], gs[1],
          static_cast<const T*>(points.data), points.stride[0], points.stride[1],
          static_cast<const T*>(feats.data), fs[0], fs[1], fs[2],
          static_cast<T*>(grad_feats), static_cast<T*>(grad_points), n, packs, group,
          accumulate);
      return cudaGetLastError();
    };
    return vec ? launch(std::integral_constant<int, V>{})
               : launch(std::integral_constant<int, 1>{});
  });
}

}  // namespace make_inplace::kernels
