// Standalone probe: the Hopper wgmma kernels (in place, bf16/fp16) against cublasGemmEx (out of place):
// the 128-row kernel in counted or cluster mode, and at widths up to 512 the 64-row kernel too.
// Build (off the GPU machine is fine; SITE: the site-packages of a torch with CUDA 13) against
// the kernels' sources, then run with that torch's cuBLAS on LD_LIBRARY_PATH:
//   nvcc -O3 -std=c++17 -arch=sm_90a -DMAKE_INPLACE_SM90A -I csrc/include -I $SITE/nvidia/cu13/include \
//     lab/probe_square_matmul_wgmma.cu csrc/kernels/cuda/square_matmul_wgmma.cu \
//     csrc/kernels/cuda/square_matmul_wgmma_rows.cu \
//     -o wgmma_probe -L $SITE/nvidia/cu13/lib -l:libcublas.so.13 -cudart static
//   ./wgmma_probe [rows n]   (CLUSTERS=1: cluster mode; FP16=1: float16; TILES=1|2: tiles per CTA)
// Both weight layouts per shape; times are medians of 10-call batches, cuBLAS and ours alternated.
// Every call reuses the same x, so it stays in L2 at the default shapes (the benchmarks rotate
// inputs instead: see docs/notes/square_matmul_wgmma.md for the difference at n = 512).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "make_inplace/kernels/square_matmul_wgmma.h"
#include "make_inplace/kernels/square_matmul_wgmma_rows.h"
using namespace make_inplace::kernels;
#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__);              \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static float to_float(uint16_t h, bool fp16) {
  if (fp16) return __half2float(*reinterpret_cast<__half*>(&h));
  uint32_t u = uint32_t{h} << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t from_float(float f, bool fp16) {
  if (fp16) {
    __half h = __float2half(f);
    return *reinterpret_cast<uint16_t*>(&h);
  }
  __nv_bfloat16 b = __float2bfloat16(f);
  return *reinterpret_cast<uint16_t*>(&b);
}

int main(int argc, char** argv) {
  int shapes[][2] = {{16384, 512}, {65536, 768}, {40000, 1024}, {16384, 2048}, {8192, 4096}, {16384, 4096}};
  int nshapes = sizeof(shapes) / sizeof(shapes[0]);
  if (argc >= 3) shapes[0][0] = atoi(argv[1]), shapes[0][1] = atoi(argv[2]), nshapes = 1;
  const bool fp16 = getenv("FP16") != nullptr, clusters = getenv("CLUSTERS") != nullptr;
  const ScalarKind kind = fp16 ? ScalarKind::kFloat16 : ScalarKind::kBFloat16;
  const cudaDataType dt = fp16 ? CUDA_R_16F : CUDA_R_16BF;
  cublasHandle_t h;
  cublasCreate(&h);
  void* cublas_ws;
  CK(cudaMalloc(&cublas_ws, 64 << 20));
  cublasSetWorkspace(h, cublas_ws, 64 << 20);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int si = 0; si < nshapes; ++si) {
    const int rows = shapes[si][0], n = shapes[si][1];
    for (int tr = 0; tr < 2; ++tr) {
      const size_t xs = size_t(rows) * n, wsz = size_t(n) * n;
      std::vector<uint16_t> hx(xs), hw(wsz);
      std::mt19937 g(si * 7 + tr);
      std::normal_distribution<float> d(0.f, 1.f);
      for (auto& v : hx) v = from_float(d(g), fp16);
      for (auto& v : hw) v = from_float(d(g) / std::sqrt(float(n)), fp16);
      uint16_t *x, *x0, *w, *c;
      uint32_t* cnt;
      CK(cudaMalloc(&x, xs * 2));
      CK(cudaMalloc(&x0, xs * 2));
      CK(cudaMalloc(&c, xs * 2));
      CK(cudaMalloc(&w, wsz * 2));
      CK(cudaMalloc(&cnt, 1 << 20));
      CK(cudaMemcpy(x0, hx.data(), xs * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(w, hw.data(), wsz * 2, cudaMemcpyHostToDevice));
      const float one = 1.f, zero = 0.f;
      const cublasOperation_t op = tr ? CUBLAS_OP_T : CUBLAS_OP_N;
      auto gemm = [&] {
        cublasGemmEx(h, op, CUBLAS_OP_N, n, rows, n, &one, w, dt, n, x0, dt, n, &zero, c, dt, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      };
      const int col_tiles = (n + 255) / 256;
      RowBlockLaunch launch;
      launch.tiles_per_cta = getenv("TILES") ? atoi(getenv("TILES")) : col_tiles <= 8 ? 1 : 2;
      launch.group_ctas = (col_tiles + launch.tiles_per_cta - 1) / launch.tiles_per_cta;
      const Residency res = square_matmul_wgmma_residency(kind, tr, launch.tiles_per_cta, launch.col_tile);
      launch.groups = clusters ? res.clusters[launch.group_ctas] : res.ctas / launch.group_ctas;
      auto ours = [&] { return square_matmul_wgmma(kind, x, w, nullptr, rows, n, tr, launch, clusters ? nullptr : cnt, 0); };
      const int rows_ctas = n <= 512 ? square_matmul_wgmma_rows_residency(kind, tr) : 0;
      auto rows64 = [&] { return square_matmul_wgmma_rows(kind, x, w, nullptr, rows, n, tr, rows_ctas, 0); };
      gemm();
      std::vector<uint16_t> hr(xs), hc(xs);
      CK(cudaMemcpy(hc.data(), c, xs * 2, cudaMemcpyDeviceToHost));
      // The largest difference from cuBLAS's result of one call on fresh x.
      auto maxerr = [&](auto fn) {
        CK(cudaMemcpy(x, x0, xs * 2, cudaMemcpyDeviceToDevice));
        CK(fn());
        CK(cudaMemcpy(hr.data(), x, xs * 2, cudaMemcpyDeviceToHost));
        double e = 0;
        for (size_t i = 0; i < xs; ++i) e = std::max(e, double(std::fabs(to_float(hr[i], fp16) - to_float(hc[i], fp16))));
        return e;
      };
      const double err = maxerr(ours), err_rows = rows_ctas > 0 ? maxerr(rows64) : 0.0;
      auto timeit = [&](auto fn) {
        std::vector<float> t;
        for (int r = 0; r < 7; ++r) {
          fn();
          cudaEventRecord(e0);
          for (int k = 0; k < 10; ++k) fn();
          cudaEventRecord(e1);
          cudaEventSynchronize(e1);
          float ms;
          cudaEventElapsedTime(&ms, e0, e1);
          t.push_back(ms / 10);
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
      };
      // Alternate to share the machine's drift: cuBLAS, ours, cuBLAS, ours.
      float tc = timeit(gemm), to = timeit(ours), tr64 = rows_ctas > 0 ? timeit(rows64) : 0.f;
      tc = std::min(tc, timeit(gemm));
      to = std::min(to, timeit(ours));
      if (rows_ctas > 0) tr64 = std::min(tr64, timeit(rows64));
      CK(cudaGetLastError());
      const double fl = 2.0 * rows * double(n) * n;
      printf("%s rows=%6d n=%5d tr=%d %s tiles=%d groups=%dx%d  cublas %.4f ms (%.0f TF)  ours %.4f ms (%.0f TF)  ratio %.3f  maxerr %.2e",
             fp16 ? "fp16" : "bf16", rows, n, tr, clusters ? "clusters" : "counted", launch.tiles_per_cta, launch.groups,
             launch.group_ctas, tc, fl / tc / 1e9, to, fl / to / 1e9, tc / to, err);
      if (rows_ctas > 0) printf("  64-row %.4f ms ratio %.3f maxerr %.2e", tr64, tc / tr64, err_rows);
      printf("\n");
      cudaFree(x);
      cudaFree(x0);
      cudaFree(c);
      cudaFree(w);
      cudaFree(cnt);
    }
  }
  return 0;
}
