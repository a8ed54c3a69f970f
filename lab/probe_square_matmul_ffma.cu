// Standalone probe: square_matmul_ffma (in place) against cublasSgemm (out of place), fp32.
// Build (off the GPU machine is fine), then run with torch's cuBLAS on LD_LIBRARY_PATH:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I csrc/include -I $SITE/nvidia/cu13/include \
//     lab/probe_square_matmul_ffma.cu csrc/kernels/cuda/square_matmul_ffma.cu -o ffma_probe \
//     -L $SITE/nvidia/cu13/lib -l:libcublas.so.13 -cudart static
//   ./ffma_probe [rows n transpose]   (CLUSTERS=1: cluster mode, no counters; TILES=2: two tiles per CTA)
// First prints the residency (CTAs of a cooperative grid, clusters of each size) of each variant.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <algorithm>
#include <cmath>
#include "make_inplace/kernels/square_matmul_ffma.h"
using namespace make_inplace::kernels;
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
int main(int argc, char** argv) {
  int shapes[][2] = {{40000,1024},{16384,2048},{65536,768},{16384,4096},{16384,512},{1000,1000},{777,36}};
  int nshapes = sizeof(shapes)/sizeof(shapes[0]);
  int only_tr = -1;
  if (argc >= 4) { shapes[0][0] = atoi(argv[1]); shapes[0][1] = atoi(argv[2]); only_tr = atoi(argv[3]); nshapes = 1; }
  for (int tr = 0; tr < 2; ++tr)
    for (int tiles = 1; tiles <= ffma::kMaxTilesPerCta; ++tiles) {
      const Residency r = square_matmul_ffma_residency(tr, tiles);
      printf("residency transpose=%d tiles=%d: ctas %d, clusters", tr, tiles, r.ctas);
      for (int c = 1; c <= kMaxClusterCtas; ++c) printf(" %d", r.clusters[c]);
      printf("\n");
    }
  const int tiles = getenv("TILES") ? atoi(getenv("TILES")) : 1;
  const bool clusters = getenv("CLUSTERS") != nullptr;
  cublasHandle_t h; cublasCreate(&h);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int si = 0; si < nshapes; ++si) {
    int rows = shapes[si][0], n = shapes[si][1];
    for (int tr = 0; tr < 2; ++tr) {
      if (only_tr >= 0 && tr != only_tr) continue;
      size_t xs = (size_t)rows * n, ws = (size_t)n * n;
      std::vector<float> hx(xs), hw(ws), hb(n);
      std::mt19937 g(si * 7 + tr); std::normal_distribution<float> d(0.f, 1.f);
      for (auto& v : hx) v = d(g);
      for (auto& v : hw) v = d(g) / std::sqrt((float)n);
      for (auto& v : hb) v = d(g);
      float *x, *x0, *w, *b, *c; uint32_t* cnt;
      CK(cudaMalloc(&x, xs * 4)); CK(cudaMalloc(&x0, xs * 4)); CK(cudaMalloc(&c, xs * 4));
      CK(cudaMalloc(&w, ws * 4)); CK(cudaMalloc(&b, n * 4)); CK(cudaMalloc(&cnt, 1 << 20));
      CK(cudaMemcpy(x0, hx.data(), xs * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(w, hw.data(), ws * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(b, hb.data(), n * 4, cudaMemcpyHostToDevice));
      const float one = 1.f, zero = 0.f;
      cublasOperation_t op = tr ? CUBLAS_OP_T : CUBLAS_OP_N;
      // reference C = x @ w (+ bias added on host compare)
      cublasSgemm(h, op, CUBLAS_OP_N, n, rows, n, &one, w, n, x0, n, &zero, c, n);
      CK(cudaMemcpy(x, x0, xs * 4, cudaMemcpyDeviceToDevice));
      const Residency res = square_matmul_ffma_residency(tr, tiles);
      RowBlockLaunch launch;
      launch.tiles_per_cta = tiles;
      launch.group_ctas = ((n + 127) / 128 + tiles - 1) / tiles;
      const int fit = clusters ? (launch.group_ctas <= kMaxClusterCtas ? res.clusters[launch.group_ctas] : 0)
                               : res.ctas / launch.group_ctas;
      launch.groups = std::min(fit, (rows + 127) / 128);
      if (launch.groups < 1) { printf("rows=%6d n=%5d tr=%d: no group fits\n", rows, n, tr); continue; }
      uint32_t* counters = clusters ? nullptr : cnt;
      CK(square_matmul_ffma(x, w, b, rows, n, tr, launch, counters, 0));
      CK(cudaDeviceSynchronize());
      std::vector<float> hr(xs), hc(xs);
      CK(cudaMemcpy(hr.data(), x, xs * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hc.data(), c, xs * 4, cudaMemcpyDeviceToHost));
      double maxerr = 0;
      for (size_t i = 0; i < xs; ++i) maxerr = std::max(maxerr, (double)std::fabs(hr[i] - (hc[i] + hb[i % n])));
      auto timeit = [&](auto fn) {
        std::vector<float> t;
        for (int r = 0; r < (only_tr >= 0 ? 2 : 12); ++r) {
          fn(); // warm / keeps pipeline
          cudaEventRecord(e0); fn(); cudaEventRecord(e1); cudaEventSynchronize(e1);
          float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms);
        }
        std::sort(t.begin(), t.end()); return t[t.size() / 2];
      };
      float t_cublas = timeit([&] { cublasSgemm(h, op, CUBLAS_OP_N, n, rows, n, &one, w, n, x0, n, &zero, c, n); });
      float t_ours = timeit([&] { square_matmul_ffma(x, w, b, rows, n, tr, launch, counters, 0); });
      double fl = 2.0 * rows * (double)n * n;
      printf("groups=%3d of %2d  rows=%6d n=%5d tr=%d  cublas %.3f ms (%.1f TF)  ffma %.3f ms (%.1f TF)  ratio %.3f  maxerr %.2e\n",
             launch.groups, launch.group_ctas, rows, n, tr, t_cublas, fl / t_cublas / 1e9, t_ours, fl / t_ours / 1e9, t_cublas / t_ours, maxerr);
      cudaFree(x); cudaFree(x0); cudaFree(c); cudaFree(w); cudaFree(b); cudaFree(cnt);
    }
  }
  return 0;
}
