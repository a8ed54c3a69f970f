// outer_product backward routes timed outside torch, on the library's own kernels:
//   nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc/include lab/probe_outer_product_backward.cu -o /tmp/probe && /tmp/probe
// grad_a = grad_out @ b and grad_b = grad_out^T @ a read B*n*m elements once at
// best; a device-to-device copy of grad_out gives the bandwidth ceiling. Routes:
//   library: what outer_product_backward_cuda picks;
//   two reads: grad_a from the rows kernel, grad_b from column strips;
//   cluster C: the whole-item sweep with C CTAs an item (sm_90), and how many
//              such clusters fit the GPU at once.
#include "../csrc/kernels/cuda/outer_product.cu"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

using namespace make_inplace::kernels;

template <typename T>
__global__ void fill_kernel(T* p, int64_t count, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = from_acc<T>(static_cast<float>(h & 0xffff) / 65536.0f - 0.5f);
  }
}

template <typename F>
float median_ms(F&& fn) {
  cudaEvent_t s, e;
  CHECK(cudaEventCreate(&s));
  CHECK(cudaEventCreate(&e));
  for (int i = 0; i < 2; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < 15; ++i) {
    CHECK(cudaEventRecord(s));
    fn();
    CHECK(cudaEventRecord(e));
    CHECK(cudaEventSynchronize(e));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, s, e));
    t.push_back(ms);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// only_split > 0: one launch of that cluster size and nothing else (for ncu).
template <typename T>
void run(const char* name, ScalarKind kind, int64_t batch, int64_t n, int64_t m, int only_split = 0) {
  constexpr int W = kVec16<T>;
  const int64_t count = batch * n * m;
  T *g, *g2, *a, *b, *ga, *gb;
  CHECK(cudaMalloc(&g, count * sizeof(T)));
  CHECK(cudaMalloc(&g2, count * sizeof(T)));
  CHECK(cudaMalloc(&a, batch * n * sizeof(T)));
  CHECK(cudaMalloc(&b, batch * m * sizeof(T)));
  CHECK(cudaMalloc(&ga, batch * n * sizeof(T)));
  CHECK(cudaMalloc(&gb, batch * m * sizeof(T)));
  fill_kernel<<<1024, 256>>>(g, count, 1);
  fill_kernel<<<1024, 256>>>(a, batch * n, 2);
  fill_kernel<<<1024, 256>>>(b, batch * m, 3);
  const double bytes = double(count) * sizeof(T);
  const int64_t packs = m / W;
  const dim3 block = block_for(packs);
  const int64_t strips = (packs + block.x - 1) / block.x;
  const int64_t ring_bytes = kStageRingBytes<T, W, 1>;
  const int64_t row_bytes = ring_bytes + n * 4;
  const auto kernel = cols_kernel<T, W, 1>();
  const auto launch_split = [&](int split) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(batch * split));
    config.blockDim = block;
    config.dynamicSmemBytes = row_bytes;
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim = {static_cast<unsigned>(split), 1, 1};
    config.attrs = &cluster;
    config.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&config, kernel, (const T*)g, n * m, m, int64_t(1), (const T*)a, n, int64_t(1),
                             (const T*)b, m, int64_t(1), true, ga, gb, batch, n, m, strips, true, split, false));
  };
  if (only_split > 0) {
    launch_split(only_split);
    CHECK(cudaDeviceSynchronize());
    return;
  }
  const OuterInput gi{g, {n * m, m, 1}}, ai{a, {n, 1, 0}}, bi{b, {m, 1, 0}};
  const float copy = median_ms([&] { CHECK(cudaMemcpyAsync(g2, g, count * sizeof(T), cudaMemcpyDeviceToDevice)); });
  const float lib = median_ms([&] { CHECK(outer_product_backward_cuda(kind, gi, ai, bi, ga, gb, batch, n, m, false, 0)); });
  // The library's gradients against a float64 sum on the host, for three items.
  {
    std::vector<T> hg(n * m), ha(n), hb(m), hga(n), hgb(m);
    double worst = 0;
    for (int64_t s : {int64_t{0}, batch / 2, batch - 1}) {
      CHECK(cudaMemcpy(hg.data(), g + s * n * m, n * m * sizeof(T), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(ha.data(), a + s * n, n * sizeof(T), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(hb.data(), b + s * m, m * sizeof(T), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(hga.data(), ga + s * n, n * sizeof(T), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(hgb.data(), gb + s * m, m * sizeof(T), cudaMemcpyDeviceToHost));
      std::vector<double> ra(n, 0.0), rb(m, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < m; ++j) {
          const double v = static_cast<double>(static_cast<float>(hg[i * m + j]));
          ra[i] += v * static_cast<float>(hb[j]);
          rb[j] += v * static_cast<float>(ha[i]);
        }
      }
      // Relative to the sum of |terms| bound: sqrt(m) * 0.5 * 0.5 for these fills.
      for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(ra[i] - static_cast<float>(hga[i])) / std::sqrt(double(m)));
      for (int64_t j = 0; j < m; ++j) worst = std::max(worst, std::abs(rb[j] - static_cast<float>(hgb[j])) / std::sqrt(double(n)));
    }
    printf("  check: worst |error| / sqrt(terms) %.2e %s\n", worst, worst < (sizeof(T) == 2 ? 2e-2 : 1e-5) ? "ok" : "FAILED");
  }
  const float two = median_ms([&] {
    const int group = pow2_at_least(packs, 32);
    outer_rows_kernel<T, W><<<grid_for(batch * n * group, kThreads), kThreads>>>(g, n * m, m, 1, b, m, 1, true, ga, n, m,
                                                                                 batch * n, group, false);
    kernel<<<grid_for(batch * strips, 1), block, ring_bytes>>>(g, n * m, m, 1, a, n, 1, b, m, 1, true, nullptr,
                                                                       gb, batch, n, m, strips, false, 1, false);
  });
  printf("%s B=%lld n=%lld m=%lld: copy %.3f ms (%.0f GB/s read+write), library %.3f ms (%.0f GB/s read), two reads %.3f ms\n",
         name, (long long)batch, (long long)n, (long long)m, copy, 2 * bytes / copy / 1e6, lib, bytes / lib / 1e6, two);
  for (int split = 1; split <= 8; split *= 2) {
    const int active = active_clusters(kernel, block, row_bytes, split);
    const float t = median_ms([&] { launch_split(split); });
    printf("  sweep, %d CTAs an item: %d fit at once, %.3f ms (%.0f GB/s)\n", split, active, t, bytes / t / 1e6);
  }
  cudaFree(g); cudaFree(g2); cudaFree(a); cudaFree(b); cudaFree(ga); cudaFree(gb);
}

int main(int argc, char** argv) {
  if (argc > 1) {  // probe bf16|fp32 SPLIT: one launch at B=64, n=m=4096
    const int split = atoi(argv[2]);
    if (argv[1][0] == 'b') run<__nv_bfloat16>("bf16", ScalarKind::kBFloat16, 64, 4096, 4096, split);
    else run<float>("fp32", ScalarKind::kFloat32, 64, 4096, 4096, split);
    return 0;
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  printf("SMs %d\n", sms);
  run<__nv_bfloat16>("bf16", ScalarKind::kBFloat16, 64, 4096, 4096);
  run<float>("fp32", ScalarKind::kFloat32, 64, 4096, 4096);
  run<__nv_bfloat16>("bf16", ScalarKind::kBFloat16, 128, 2048, 2048);
  run<__nv_bfloat16>("bf16", ScalarKind::kBFloat16, 512, 1024, 1024);
  run<float>("fp32", ScalarKind::kFloat32, 512, 1024, 1024);
  run<__nv_bfloat16>("bf16", ScalarKind::kBFloat16, 4096, 256, 256);
  run<float>("fp32", ScalarKind::kFloat32, 4096, 256, 256);
  run<__nv_bfloat16>("bf16", ScalarKind::kBFloat16, 1024, 512, 512);
  run<float>("fp32", ScalarKind::kFloat32, 1024, 512, 512);
  return 0;
}
