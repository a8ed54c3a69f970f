// Outer product forward variants against a plain fill, outside torch:
//   nvcc -O3 -std=c++17 -arch=sm_90a lab/probe_outer_product_forward.cu -o /tmp/probe && /tmp/probe
// out[s, i, :] = a[s, i] * b[s, :] writes B*n*m elements and reads ~nothing, so
// a fill of the same bytes is its ceiling. Variants:
//   strided: the library's kernel before: rows grid-strided, (s, i) and every
//            address recomputed per row, b reloaded per row;
//   chunked: each row group walks a contiguous chunk of rows, keeps its b pack
//            in registers while the batch item stays the same, 4 rows per step,
//            pointers advanced instead of recomputed;
//   chunked+cs: the same with streaming stores (st.global.cs);
//   flat r/R: one pack column and R rows a thread, all loads before the stores,
//            a grid of (row groups x column chunks) with no loop.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

template <typename T> __device__ float f32(T x);
template <> __device__ float f32<float>(float x) { return x; }
template <> __device__ float f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ T from_f32(float x);
template <> __device__ float from_f32<float>(float x) { return x; }
template <> __device__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T> struct alignas(16) Pack { T v[16 / sizeof(T)]; };

template <bool CS>
__device__ __forceinline__ void store16(void* p, const void* v) {
  uint32_t w[4];
  memcpy(w, v, 16);
  if (CS) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
  } else {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
  }
}

template <typename T>
__global__ void __launch_bounds__(256) strided_kernel(const T* a, const T* b, T* out, int64_t n, int64_t m, int64_t rows) {
  constexpr int V = 16 / sizeof(T);
  const int64_t packs = m / V;
  const int64_t step = int64_t(gridDim.x) * blockDim.y;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; row < rows; row += step) {
    const int64_t s = row / n, i = row % n;
    const float ai = f32(a[s * n + i]);
    for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) {
      Pack<T> bv = *reinterpret_cast<const Pack<T>*>(b + s * m + c * V), r;
#pragma unroll
      for (int e = 0; e < V; ++e) r.v[e] = from_f32<T>(ai * f32(bv.v[e]));
      store16<false>(out + row * m + c * V, &r);
    }
  }
}

template <typename T, bool CS>
__global__ void __launch_bounds__(256) chunked_kernel(const T* a, const T* b, T* out, int64_t n, int64_t m, int64_t rows,
                                                      int64_t rows_per_group) {
  constexpr int V = 16 / sizeof(T);
  const int64_t packs = m / V;
  int64_t row = (int64_t(blockIdx.x) * blockDim.y + threadIdx.y) * rows_per_group;
  const int64_t end = min(rows, row + rows_per_group);
  if (row >= end) return;
  int64_t s = row / n, i = row - s * n;
  while (row < end) {
    const int64_t count = min(end - row, n - i);  // this chunk's rows of batch item s
    for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) {
      const Pack<T> bv = *reinterpret_cast<const Pack<T>*>(b + s * m + c * V);
      float bf[V];
#pragma unroll
      for (int e = 0; e < V; ++e) bf[e] = f32(bv.v[e]);
      const T* ap = a + s * n + i;
      T* op = out + row * m + c * V;
      int64_t r = 0;
      for (; r + 4 <= count; r += 4, ap += 4, op += 4 * m) {
        float ai[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) ai[k] = f32(ap[k]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          Pack<T> o;
#pragma unroll
          for (int e = 0; e < V; ++e) o.v[e] = from_f32<T>(ai[k] * bf[e]);
          store16<CS>(op + k * m, &o);
        }
      }
      for (; r < count; ++r, ++ap, op += m) {
        const float ai = f32(*ap);
        Pack<T> o;
#pragma unroll
        for (int e = 0; e < V; ++e) o.v[e] = from_f32<T>(ai * bf[e]);
        store16<CS>(op, &o);
      }
    }
    row += count;
    ++s;
    i = 0;
  }
}

// flat: one pack column per thread and R consecutive rows, every load (a and b
// for each row) issued before the first store; the grid covers (row groups x
// column chunks), so no thread loops.
template <typename T, int R>
__global__ void __launch_bounds__(256) flat_kernel(const T* a, const T* b, T* out, int64_t n, int64_t m, int64_t rows,
                                                   unsigned chunks) {
  constexpr int V = 16 / sizeof(T);
  const int64_t packs = m / V;
  const unsigned chunk = blockIdx.x % chunks;
  const int64_t c = int64_t(chunk) * blockDim.x + threadIdx.x;
  const int64_t row0 = (int64_t(blockIdx.x / chunks) * blockDim.y + threadIdx.y) * R;
  if (c >= packs || row0 >= rows) return;
  int64_t s = row0 / n, i = row0 - s * n;
  float ai[R];
  Pack<T> bv[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (row0 + r < rows) {
      ai[r] = f32(a[s * n + i]);
      bv[r] = *reinterpret_cast<const Pack<T>*>(b + s * m + c * V);
    }
    if (++i == n) { i = 0; ++s; }
  }
  T* op = out + row0 * m + c * V;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (row0 + r < rows) {
      Pack<T> o;
#pragma unroll
      for (int e = 0; e < V; ++e) o.v[e] = from_f32<T>(ai[r] * f32(bv[r].v[e]));
      store16<true>(op + r * m, &o);
    }
  }
}

template <typename T, bool CS>
__global__ void __launch_bounds__(256) fill_kernel(T* out, int64_t packs) {
  constexpr int V = 16 / sizeof(T);
  Pack<T> o;
#pragma unroll
  for (int e = 0; e < V; ++e) o.v[e] = from_f32<T>(1.0f);
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += int64_t(gridDim.x) * blockDim.x) {
    store16<CS>(out + p * V, &o);
  }
}

template <typename F>
float median_ms(F launch) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int k = 0; k < 3; ++k) launch();
  std::vector<float> t;
  for (int k = 0; k < 15; ++k) {
    CHECK(cudaEventRecord(e0));
    launch();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename T>
bool check(const T* d_out, const std::vector<float>& a, const std::vector<float>& b, int64_t batch, int64_t n, int64_t m) {
  // A few rows: first, last, and some in between.
  for (int64_t row : {int64_t(0), batch * n / 3 + 1, batch * n / 2 + 7, batch * n - 1}) {
    std::vector<T> got(m);
    CHECK(cudaMemcpy(got.data(), d_out + row * m, m * sizeof(T), cudaMemcpyDeviceToHost));
    const int64_t s = row / n, i = row % n;
    for (int64_t j = 0; j < m; ++j) {
      float g;
      if constexpr (sizeof(T) == 4) g = got[j]; else { uint32_t u = uint32_t(*reinterpret_cast<uint16_t*>(&got[j])) << 16; memcpy(&g, &u, 4); }
      const float want = a[s * n + i] * b[s * m + j];
      if (std::abs(g - want) > 1e-2f * std::max(1.0f, std::abs(want))) { printf("  MISMATCH row %lld col %lld: %g vs %g\n", (long long)row, (long long)j, g, want); return false; }
    }
  }
  return true;
}

template <typename T>
void run(const char* name, int64_t batch, int64_t n, int64_t m) {
  constexpr int V = 16 / sizeof(T);
  const int64_t rows = batch * n, bytes = rows * m * int64_t(sizeof(T));
  std::vector<float> ha(batch * n), hb(batch * m);
  for (size_t k = 0; k < ha.size(); ++k) ha[k] = float((k * 37) % 101) / 50.0f - 1.0f;
  for (size_t k = 0; k < hb.size(); ++k) hb[k] = float((k * 53) % 97) / 48.0f - 1.0f;
  std::vector<T> ta(ha.size()), tb(hb.size());
  for (size_t k = 0; k < ha.size(); ++k) { if constexpr (sizeof(T) == 4) ta[k] = ha[k]; else ta[k] = __float2bfloat16(ha[k]); }
  for (size_t k = 0; k < hb.size(); ++k) { if constexpr (sizeof(T) == 4) tb[k] = hb[k]; else tb[k] = __float2bfloat16(hb[k]); }
  if constexpr (sizeof(T) == 2) {  // compare against the rounded inputs
    for (size_t k = 0; k < ha.size(); ++k) { uint32_t u = uint32_t(*reinterpret_cast<uint16_t*>(&ta[k])) << 16; memcpy(&ha[k], &u, 4); }
    for (size_t k = 0; k < hb.size(); ++k) { uint32_t u = uint32_t(*reinterpret_cast<uint16_t*>(&tb[k])) << 16; memcpy(&hb[k], &u, 4); }
  }
  T *a, *b, *out;
  CHECK(cudaMalloc(&a, ta.size() * sizeof(T)));
  CHECK(cudaMalloc(&b, tb.size() * sizeof(T)));
  CHECK(cudaMalloc(&out, bytes));
  CHECK(cudaMemcpy(a, ta.data(), ta.size() * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b, tb.data(), tb.size() * sizeof(T), cudaMemcpyHostToDevice));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t packs = m / V;
  int tx = 1;
  while (tx < 256 && tx < packs) tx *= 2;
  const dim3 block(tx, 256 / tx);
  const int64_t max_blocks = int64_t(sms) * 8;
  const int64_t grid_strided = std::min<int64_t>(max_blocks, (rows + block.y - 1) / block.y);
  auto report = [&](const char* what, float ms, bool ok) {
    printf("%-6s B=%-6lld n=%-5lld m=%-5lld %-12s %8.3f ms %6.0f GB/s %s\n", name, (long long)batch, (long long)n,
           (long long)m, what, ms, bytes / ms / 1e6, ok ? "" : "WRONG");
  };
  const int64_t fill_grid = max_blocks;
  report("fill", median_ms([&] { fill_kernel<T, false><<<fill_grid, 256>>>(out, bytes / 16); }), true);
  report("fill.cs", median_ms([&] { fill_kernel<T, true><<<fill_grid, 256>>>(out, bytes / 16); }), true);
  CHECK(cudaMemset(out, 0, bytes));
  float ms = median_ms([&] { strided_kernel<T><<<grid_strided, block>>>(a, b, out, n, m, rows); });
  report("strided", ms, check(out, ha, hb, batch, n, m));
  // Rows per group: from the persistent split (8 CTAs per SM, one chunk per
  // group) down to a few rows per group (many waves of short-lived CTAs).
  const int64_t persistent = (rows + int64_t(sms) * 8 * block.y - 1) / (int64_t(sms) * 8 * block.y);
  for (int64_t rpg : {persistent, int64_t(64), int64_t(16), int64_t(8), int64_t(4), int64_t(2)}) {
    if (rpg > persistent && rpg != persistent) continue;
    const int64_t grid = ((rows + rpg - 1) / rpg + block.y - 1) / block.y;
    char label[32];
    CHECK(cudaMemset(out, 0, bytes));
    ms = median_ms([&] { chunked_kernel<T, true><<<grid, block>>>(a, b, out, n, m, rows, rpg); });
    snprintf(label, sizeof label, "cs rows/%lld", (long long)rpg);
    report(label, ms, check(out, ha, hb, batch, n, m));
    if (rpg == 8) {
      CHECK(cudaMemset(out, 0, bytes));
      ms = median_ms([&] { chunked_kernel<T, false><<<grid, block>>>(a, b, out, n, m, rows, rpg); });
      report("plain rows/8", ms, check(out, ha, hb, batch, n, m));
    }
  }
  // flat, R rows a thread
  const unsigned chunks = unsigned((packs + block.x - 1) / block.x);
  auto flat = [&](auto rtag) {
    constexpr int R = decltype(rtag)::value;
    const int64_t grid = ((rows + R - 1) / R + block.y - 1) / block.y * chunks;
    CHECK(cudaMemset(out, 0, bytes));
    const float t = median_ms([&] { flat_kernel<T, R><<<grid, block>>>(a, b, out, n, m, rows, chunks); });
    char label[32];
    snprintf(label, sizeof label, "flat r/%d", R);
    report(label, t, check(out, ha, hb, batch, n, m));
  };
  flat(std::integral_constant<int, 1>{});
  flat(std::integral_constant<int, 2>{});
  flat(std::integral_constant<int, 4>{});
  flat(std::integral_constant<int, 8>{});
  // A fill with one pack per thread and no grid stride (many short CTAs).
  report("fill.flat", median_ms([&] { fill_kernel<T, true><<<(bytes / 16 + 255) / 256, 256>>>(out, bytes / 16); }), true);
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFree(out));
}

int main() {
  run<float>("fp32", 512, 1024, 1024);
  run<float>("fp32", 4096, 256, 256);
  run<float>("fp32", 64, 4096, 4096);
  run<float>("fp32", 65536, 32, 32);
  run<__nv_bfloat16>("bf16", 4096, 256, 256);
  run<__nv_bfloat16>("bf16", 512, 1024, 1024);
  run<__nv_bfloat16>("bf16", 64, 4096, 4096);
  return 0;
}
