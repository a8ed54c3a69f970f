// Probe (docs/rowwise_tuning.md, "Lines kept in L2 until the store"): a
// layer-norm-like row kernel (w and b, in place) with the row held in
// registers, against Inductor's shape (the row read again from L1 for the
// write), each under several cache policies on the loads of x; an in-place
// scale of one vector a thread as the copy rate. Timed as the benchmarks time
// calls (a spin kernel ahead of each), the first 8 rows checked against a
// double reference on the host.
// With -DWITH_LIBRARY and the library's layer_norm.cu as a second source, the
// library's layer_norm_ runs in the same harness:
//   nvcc -O3 -std=c++17 -arch=sm_90a -o probe_row_loads lab/probe_row_loads.cu && ./probe_row_loads
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -DMAKE_INPLACE_SM90A -DWITH_LIBRARY \
//     -Icsrc/include -o probe_row_loads lab/probe_row_loads.cu csrc/kernels/cuda/layer_norm.cu
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#ifdef WITH_LIBRARY
#include "make_inplace/kernels/layer_norm.h"
#endif

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("err %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

struct alignas(16) V4 { uint32_t a, b, c, d; };

template <typename T> __device__ __forceinline__ void unpack(const V4& v, float* f);
template <> __device__ __forceinline__ void unpack<float>(const V4& v, float* f) {
  f[0] = __uint_as_float(v.a); f[1] = __uint_as_float(v.b); f[2] = __uint_as_float(v.c); f[3] = __uint_as_float(v.d);
}
template <> __device__ __forceinline__ void unpack<__nv_bfloat16>(const V4& v, float* f) {
  const uint32_t w[4] = {v.a, v.b, v.c, v.d};
#pragma unroll
  for (int i = 0; i < 4; ++i) { f[2 * i] = __uint_as_float(w[i] << 16); f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u); }
}
template <typename T> __device__ __forceinline__ V4 pack(const float* f);
template <> __device__ __forceinline__ V4 pack<float>(const float* f) {
  return {__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3])};
}
template <> __device__ __forceinline__ V4 pack<__nv_bfloat16>(const float* f) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    w[i] = *reinterpret_cast<uint32_t*>(&h);
  }
  return {w[0], w[1], w[2], w[3]};
}

// Loads of x. HINT 0: plain; 1: first read L1::evict_last, second
// L1::evict_first; 4: as 1 with L2 policies evict_last / evict_first (as
// Inductor's code); 5: both reads L2 evict_last; 6: L2 evict_first.
__device__ __forceinline__ uint64_t policy_last() { uint64_t p; asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p)); return p; }
__device__ __forceinline__ uint64_t policy_first() { uint64_t p; asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p)); return p; }
__device__ __forceinline__ V4 ld_last(const void* p) {
  V4 v;
  asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "l"(p), "l"(policy_last()));
  return v;
}
__device__ __forceinline__ V4 ld_first(const void* p) {
  V4 v;
  asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;" : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "l"(p), "l"(policy_first()));
  return v;
}
// loads of w and b
template <int HINT>
__device__ __forceinline__ V4 ldp(const void* p) {
  if (HINT == 4) return ld_last(p);
  return *reinterpret_cast<const V4*>(p);
}
// L1 qualifier only: 0 none, 1 evict_last, 2 evict_first.
template <int L1>
__device__ __forceinline__ V4 ld_l1(const void* p) {
  V4 v;
  if (L1 == 1)
    asm volatile("ld.global.L1::evict_last.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "l"(p));
  else if (L1 == 2)
    asm volatile("ld.global.L1::evict_first.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "l"(p));
  else
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "l"(p));
  return v;
}
// The first read of x.
template <int HINT>
__device__ __forceinline__ V4 ld1(const void* p) {
  if (HINT == 4 || HINT == 5) return ld_last(p);
  if (HINT == 6) return ld_first(p);
  return ld_l1<HINT == 1 ? 1 : 0>(p);
}
// The second read of x (the reload kernel's write pass).
template <int HINT>
__device__ __forceinline__ V4 ld2(const void* p) {
  if (HINT == 4) return ld_first(p);
  if (HINT == 5) return ld_last(p);
  return ld_l1<HINT == 1 ? 2 : 0>(p);
}
__device__ __forceinline__ void st(void* p, const V4& v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.a), "r"(v.b), "r"(v.c), "r"(v.d) : "memory");
}

template <int THREADS>
__device__ __forceinline__ void block_sum2(float& a, float& b, float* sh) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) { a += __shfl_xor_sync(~0u, a, o); b += __shfl_xor_sync(~0u, b, o); }
  if (THREADS == 32) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) { sh[warp] = a; sh[32 + warp] = b; }
  __syncthreads();
  a = lane < THREADS / 32 ? sh[lane] : 0.f;
  b = lane < THREADS / 32 ? sh[32 + lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) { a += __shfl_xor_sync(~0u, a, o); b += __shfl_xor_sync(~0u, b, o); }
}

// Whole row in registers: NV vectors a thread.
template <typename T, int THREADS, int NV, int HINT = 0>
__global__ void __launch_bounds__(THREADS) reg_kernel(T* x, const T* w, const T* bb, int n) {
  constexpr int F = 16 / sizeof(T);
  __shared__ float sh[64];
  T* p = x + int64_t(blockIdx.x) * n;
  V4 buf[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) buf[k] = ld1<HINT>(p + (k * THREADS + threadIdx.x) * F);
  float s = 0, q = 0;
  const float x0 = 0.f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    float f[F]; unpack<T>(buf[k], f);
#pragma unroll
    for (int e = 0; e < F; ++e) { const float d = f[e] - x0; s += d; q += d * d; }
  }
  block_sum2<THREADS>(s, q, sh);
  const float mean = s / n, rstd = rsqrtf(q / n - mean * mean + 1e-5f);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int col = (k * THREADS + threadIdx.x) * F;
    float f[F], wf[F], bf[F];
    unpack<T>(buf[k], f);
    unpack<T>(ldp<HINT>(w + col), wf);
    unpack<T>(ldp<HINT>(bb + col), bf);
#pragma unroll
    for (int e = 0; e < F; ++e) f[e] = ((f[e] - mean) * rstd) * wf[e] + bf[e];
    st(p + col, pack<T>(f));
  }
}

// Inductor's shape: the first pass loads all NV vectors at once (registers
// released after the sums), the second reloads each from L1 before its store.
template <typename T, int THREADS, int NV, int HINT, int UNROLL2>
__global__ void __launch_bounds__(THREADS) reload_kernel(T* x, const T* w, const T* bb, int n) {
  constexpr int F = 16 / sizeof(T);
  __shared__ float sh[64];
  T* p = x + int64_t(blockIdx.x) * n;
  float s = 0, q = 0;
  {
    V4 buf[NV];
#pragma unroll
    for (int k = 0; k < NV; ++k) buf[k] = ld1<HINT>(p + (k * THREADS + threadIdx.x) * F);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      float f[F]; unpack<T>(buf[k], f);
#pragma unroll
      for (int e = 0; e < F; ++e) { s += f[e]; q += f[e] * f[e]; }
    }
  }
  block_sum2<THREADS>(s, q, sh);
  const float mean = s / n, rstd = rsqrtf(q / n - mean * mean + 1e-5f);
#pragma unroll UNROLL2
  for (int k = 0; k < NV; ++k) {
    const int col = (k * THREADS + threadIdx.x) * F;
    float f[F], wf[F], bf[F];
    unpack<T>(ld2<HINT>(p + col), f);
    unpack<T>(ldp<HINT>(w + col), wf);
    unpack<T>(ldp<HINT>(bb + col), bf);
#pragma unroll
    for (int e = 0; e < F; ++e) f[e] = ((f[e] - mean) * rstd) * wf[e] + bf[e];
    st(p + col, pack<T>(f));
  }
}

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t nvec) {  // x *= ~1, one vector a thread
  constexpr int F = 16 / sizeof(T);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nvec) return;
  V4 v = ld1<0>(x + i * F);
  float f[F]; unpack<T>(v, f);
#pragma unroll
  for (int e = 0; e < F; ++e) f[e] *= 1.0f;
  st(x + i * F, pack<T>(f));
}

static float host_val(const float* p, size_t i) { return p[i]; }
static float host_val(const __nv_bfloat16* p, size_t i) {
  uint16_t u; memcpy(&u, p + i, 2); uint32_t b = uint32_t(u) << 16; float f; memcpy(&f, &b, 4); return f;
}

template <typename T>
struct Bench {
  int rows, n;
  T *x, *w, *b, *xin;
  size_t bytes;
  cudaEvent_t e0, e1;
  std::vector<T> hin, hw, hb;
  Bench(int rows_, int n_) : rows(rows_), n(n_) {
    bytes = size_t(rows) * n * sizeof(T);
    CK(cudaMalloc(&x, bytes)); CK(cudaMalloc(&xin, bytes));
    CK(cudaMalloc(&w, n * sizeof(T))); CK(cudaMalloc(&b, n * sizeof(T)));
    // inputs: a few rows made on the host, tiled
    const int hrows = 8;
    hin.resize(size_t(hrows) * n); hw.resize(n); hb.resize(n);
    srand(1);
    auto mk = [](float f) { T t; if constexpr (sizeof(T) == 4) { memcpy(&t, &f, 4); } else { uint32_t u; memcpy(&u, &f, 4); uint16_t h = uint16_t(u >> 16); memcpy(&t, &h, 2); } return t; };
    for (auto& v : hin) v = mk(3.f + 2.f * (rand() / float(RAND_MAX) - 0.5f) * 3.4f);
    for (auto& v : hw) v = mk(0.5f + rand() / float(RAND_MAX));
    for (auto& v : hb) v = mk(rand() / float(RAND_MAX) - 0.5f);
    for (int r = 0; r < rows; r += hrows)
      CK(cudaMemcpy(xin + size_t(r) * n, hin.data(), sizeof(T) * size_t(std::min(hrows, rows - r)) * n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, hw.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, hb.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  }
  // check the first 8 rows against double
  double check() {
    std::vector<T> out(size_t(8) * n);
    CK(cudaMemcpy(out.data(), x, sizeof(T) * out.size(), cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int r = 0; r < 8; ++r) {
      double s = 0, q = 0;
      for (int c = 0; c < n; ++c) { double v = host_val(hin.data(), size_t(r) * n + c); s += v; }
      const double mean = s / n;
      for (int c = 0; c < n; ++c) { double d = host_val(hin.data(), size_t(r) * n + c) - mean; q += d * d; }
      const double rstd = 1 / std::sqrt(q / n + 1e-5);
      for (int c = 0; c < n; ++c) {
        const double ref = (host_val(hin.data(), size_t(r) * n + c) - mean) * rstd * host_val(hw.data(), c) + host_val(hb.data(), c);
        worst = std::max(worst, std::fabs(ref - host_val(out.data(), size_t(r) * n + c)));
      }
    }
    return worst;
  }
  template <typename L>
  void run(const char* name, L launch) {
    CK(cudaMemcpy(x, xin, bytes, cudaMemcpyDeviceToDevice));
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const double err = check();
    std::vector<float> meds;
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<float> ts;
      for (int i = 0; i < 30; ++i) {
        spin_kernel<<<1, 1>>>(40000);  // the host queues the call before the GPU reaches it
        CK(cudaEventRecord(e0));
        launch();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms * 1e3f);
      }
      std::sort(ts.begin(), ts.end());
      meds.push_back(ts[ts.size() / 2]);
    }
    const float best = *std::min_element(meds.begin(), meds.end());
    printf("%-28s %s (%d, %d): %7.1f us %6.0f GB/s  err %.3g\n", name, sizeof(T) == 4 ? "fp32" : "bf16", rows, n, best,
           2.0 * bytes / best / 1e3, err);
  }
};

template <typename T, int THREADS, int NV>
void reg_set(Bench<T>& B) {
  char name[64];
  snprintf(name, sizeof name, "reg t%d nv%d", THREADS, NV);
  B.run(name, [&] { reg_kernel<T, THREADS, NV, 0><<<B.rows, THREADS>>>(B.x, B.w, B.b, B.n); });
  snprintf(name, sizeof name, "reg t%d nv%d L2last", THREADS, NV);
  B.run(name, [&] { reg_kernel<T, THREADS, NV, 4><<<B.rows, THREADS>>>(B.x, B.w, B.b, B.n); });
  snprintf(name, sizeof name, "reg t%d nv%d L2first", THREADS, NV);
  B.run(name, [&] { reg_kernel<T, THREADS, NV, 6><<<B.rows, THREADS>>>(B.x, B.w, B.b, B.n); });
  snprintf(name, sizeof name, "reload t%d nv%d plain", THREADS, NV);
  B.run(name, [&] { reload_kernel<T, THREADS, NV, 0, 1><<<B.rows, THREADS>>>(B.x, B.w, B.b, B.n); });
  snprintf(name, sizeof name, "reload t%d nv%d L1hints", THREADS, NV);
  B.run(name, [&] { reload_kernel<T, THREADS, NV, 1, 1><<<B.rows, THREADS>>>(B.x, B.w, B.b, B.n); });
  snprintf(name, sizeof name, "reload t%d nv%d inductor", THREADS, NV);
  B.run(name, [&] { reload_kernel<T, THREADS, NV, 4, 1><<<B.rows, THREADS>>>(B.x, B.w, B.b, B.n); });
  snprintf(name, sizeof name, "reload t%d nv%d both last", THREADS, NV);
  B.run(name, [&] { reload_kernel<T, THREADS, NV, 5, 1><<<B.rows, THREADS>>>(B.x, B.w, B.b, B.n); });
}

template <typename T>
void suite(int rows, int n) {
  Bench<T> B(rows, n);
  constexpr int F = 16 / sizeof(T);
  const int64_t nvec = int64_t(rows) * n / F;
  B.run("scale 1 vec/thread", [&] { scale_kernel<T><<<unsigned((nvec + 255) / 256), 256>>>(B.x, nvec); });
#ifdef WITH_LIBRARY
  using make_inplace::kernels::ScalarKind;
  const ScalarKind kind = sizeof(T) == 4 ? ScalarKind::kFloat32 : ScalarKind::kBFloat16;
  B.run("library layer_norm_", [&] {
    CK(make_inplace::kernels::layer_norm_forward_cuda(kind, B.x, B.w, B.b, B.rows, B.n, 1e-5, nullptr, nullptr, 0));
  });
#endif
  const int vecs = n / F;
  if (vecs == 1024) {
    reg_set<T, 256, 4>(B);
    reg_set<T, 512, 2>(B);
    reg_set<T, 1024, 1>(B);
  } else if (vecs == 4096) {
    reg_set<T, 512, 8>(B);
    reg_set<T, 1024, 4>(B);
  } else if (vecs == 512) {
    reg_set<T, 128, 4>(B);
    reg_set<T, 256, 2>(B);
    reg_set<T, 512, 1>(B);
  } else if (vecs == 2048) {
    reg_set<T, 256, 8>(B);
    reg_set<T, 512, 4>(B);
    reg_set<T, 1024, 2>(B);
  }
}

int main(int argc, char** argv) {
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  suite<float>(16384, 4096);
  suite<float>(4096, 16384);
  suite<__nv_bfloat16>(4096, 16384);
  suite<__nv_bfloat16>(16384, 4096);
  suite<__nv_bfloat16>(8192, 8192);
  return 0;
}
