// Standalone probe: the 64-row wgmma kernel (square_matmul_wgmma_rows) against cublasGemmEx and the 128-row
// kernel's counted mode (one tile per CTA), at widths up to 512, both weight layouts, with a check of each
// result against cuBLAS's (and the 64-row kernel's bias sum against cuBLAS + bias). Build like
// lab/probe_square_matmul_wgmma.cu, with both kernels' sources:
//   nvcc -O3 -std=c++17 -arch=sm_90a -DMAKE_INPLACE_SM90A -I csrc/include -I $SITE/nvidia/cu13/include \
//     lab/probe_square_matmul_wgmma_rows.cu csrc/kernels/cuda/square_matmul_wgmma.cu \
//     csrc/kernels/cuda/square_matmul_wgmma_rows.cu -o wgmma_rows_probe -L $SITE/nvidia/cu13/lib -l:libcublas.so.13 \
//     -cudart static
//   ./wgmma_rows_probe [rows n]   (FP16=1: float16)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  int shapes[][2] = {{16384, 512}, {65536, 512}, {8192, 512}, {16384, 448}, {16384, 392}, {16384, 384},
                     {65536, 448}, {4096, 512}, {1000, 264}, {333, 504}};
  int nshapes = sizeof(shapes) / sizeof(shapes[0]);
  if (argc >= 3) shapes[0][0] = atoi(argv[1]), shapes[0][1] = atoi(argv[2]), nshapes = 1;
  const bool fp16 = getenv("FP16") != nullptr;
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
  const int ctas[2] = {square_matmul_wgmma_rows_residency(kind, false), square_matmul_wgmma_rows_residency(kind, true)};
  printf("64-row kernel residency: %d CTAs (x @ w), %d (x @ w^T)\n", ctas[0], ctas[1]);
  for (int si = 0; si < nshapes; ++si) {
    const int rows = shapes[si][0], n = shapes[si][1];
    for (int tr = 0; tr < 2; ++tr) {
      const size_t xs = size_t(rows) * n, wsz = size_t(n) * n;
      std::vector<uint16_t> hx(xs), hw(wsz), hb(n);
      std::mt19937 g(rows + n * 7 + tr);
      std::normal_distribution<float> d(0.f, 1.f);
      for (auto& v : hx) v = from_float(d(g), fp16);
      for (auto& v : hw) v = from_float(d(g) / std::sqrt(float(n)), fp16);
      for (auto& v : hb) v = from_float(d(g), fp16);
      uint16_t *x, *x0, *w, *c, *bias;
      uint32_t* cnt;
      CK(cudaMalloc(&x, xs * 2));
      CK(cudaMalloc(&x0, xs * 2));
      CK(cudaMalloc(&c, xs * 2));
      CK(cudaMalloc(&w, wsz * 2));
      CK(cudaMalloc(&bias, n * 2));
      CK(cudaMalloc(&cnt, 1 << 20));
      CK(cudaMemcpy(x0, hx.data(), xs * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(w, hw.data(), wsz * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(bias, hb.data(), n * 2, cudaMemcpyHostToDevice));
      const float one = 1.f, zero = 0.f;
      const cublasOperation_t op = tr ? CUBLAS_OP_T : CUBLAS_OP_N;
      auto gemm = [&] {
        cublasGemmEx(h, op, CUBLAS_OP_N, n, rows, n, &one, w, dt, n, x0, dt, n, &zero, c, dt, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      };
      // The library's counted mode as the probe of the 128-row kernel runs it: one tile per CTA.
      RowBlockLaunch launch;
      launch.tiles_per_cta = 1;
      launch.group_ctas = (n + 255) / 256;
      launch.groups = square_matmul_wgmma_residency(kind, tr, 1).ctas / launch.group_ctas;
      auto counted = [&] { return square_matmul_wgmma(kind, x, w, nullptr, rows, n, tr, launch, cnt, 0); };
      const void* bias_arg = nullptr;
      auto rows64 = [&] { return square_matmul_wgmma_rows(kind, x, w, bias_arg, rows, n, tr, ctas[tr], 0); };
      std::vector<uint16_t> hr(xs), hc(xs);
      auto maxerr = [&](bool with_bias) {
        CK(cudaMemcpy(hr.data(), x, xs * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hc.data(), c, xs * 2, cudaMemcpyDeviceToHost));
        double e = 0;
        for (size_t i = 0; i < xs; ++i) {
          const float ref = to_float(hc[i], fp16) + (with_bias ? to_float(hb[i % n], fp16) : 0.f);
          e = std::max(e, double(std::fabs(to_float(hr[i], fp16) - ref)));
        }
        return e;
      };
      gemm();
      CK(cudaMemcpy(x, x0, xs * 2, cudaMemcpyDeviceToDevice));
      CK(rows64());
      CK(cudaDeviceSynchronize());
      const double err = maxerr(false);
      CK(cudaMemcpy(x, x0, xs * 2, cudaMemcpyDeviceToDevice));
      bias_arg = bias;
      CK(rows64());
      CK(cudaDeviceSynchronize());
      const double err_bias = maxerr(true);
      bias_arg = nullptr;
      CK(cudaMemcpy(x, x0, xs * 2, cudaMemcpyDeviceToDevice));
      CK(counted());
      CK(cudaDeviceSynchronize());
      const double err_counted = maxerr(false);
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
      float tc = timeit(gemm), tq = timeit(counted), tr64 = timeit(rows64);
      tc = std::min(tc, timeit(gemm));
      tq = std::min(tq, timeit(counted));
      tr64 = std::min(tr64, timeit(rows64));
      CK(cudaGetLastError());
      const double fl = 2.0 * rows * double(n) * n;
      printf("%s rows=%6d n=%4d tr=%d  cublas %.4f ms (%.0f TF)  counted %.4f (%.3f)  rows64 %.4f (%.0f TF, %.3f)"
             "  maxerr counted %.2e rows64 %.2e bias %.2e\n",
             fp16 ? "fp16" : "bf16", rows, n, tr, tc, fl / tc / 1e9, tq, tc / tq, tr64, fl / tr64 / 1e9, tc / tr64,
             err_counted, err, err_bias);
      cudaFree(x);
      cudaFree(x0);
      cudaFree(c);
      cudaFree(w);
      cudaFree(bias);
      cudaFree(cnt);
    }
  }
  return 0;
}
