// Where the staged row-wise kernels' time goes on wide rows (staged_rows.cuh):
// an rms_norm-like kernel on the library's own RowRing, plan and cluster
// exchanges, with parts switched off or swapped (the MODE flags below), timed
// against cudaMemcpy of the same bytes. Thread 0 of each CTA records clock64
// per row phase (waiting for the slots, the CTA reduction, the cluster
// exchange, the write pass) and globaltimer at its start and end, so the
// spread of the CTAs' end times shows too. Results: docs/rowwise_tuning.md.
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -arch=sm_90a -Icsrc/include \
//     lab/probe_staged_rows.cu -o /tmp/probe && /tmp/probe
#include "../csrc/kernels/cuda/rms_norm.cu"
#include <cstdio>
#include <vector>
#include <algorithm>
#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
using namespace make_inplace::kernels;
using namespace make_inplace::kernels::rowwise;

constexpr int kMaxLi = 32;  // rows a CTA records
// MODE flags (0: rms_norm without a weight, as the library's staged kernel).
constexpr int kNoCluster = 1;   // skip the cluster exchange (wrong results, timing only)
constexpr int kNoStats = 2;     // skip the statistics pass (still waits for the slots)
constexpr int kBulkStore = 4;   // write back into the slot, then cp.async.bulk to global
constexpr int kMoments = 8;     // layer norm's statistics: moments.cuh per vector
constexpr int kShifted = 16;    // layer norm's statistics: sums of x - x[0] and its square
constexpr int kWeights = 32;    // the write reads w and b from global memory (layer norm)
constexpr int kHoisted = 64;    // w and b of a piece loaded before its write loop
constexpr int kEarly = 128;     // the first piece's w and b loaded before the reductions
template <typename T, int MODE>
__global__ void __launch_bounds__(1024) probe_kernel(T* __restrict__ x, int64_t rows, int64_t n, float inv_n,
                                                     staged::Plan plan, long long* ts, const T* __restrict__ wb) {
#ifdef MAKE_INPLACE_STAGED_ROWS
  constexpr int VEC = 16 / sizeof(T);
  constexpr int F = kFloatsPerVector<T>;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float scratch96[96];
  __shared__ staged::SplitExchange exchange;
  __shared__ staged::SplitMoments mexchange;
  int round = 0;
  const staged::Share share = staged::share_of(plan);
  const int64_t part_base = share.part_base, cluster = share.first_row, clusters = share.row_step;
  staged::RowRing<T> ring(smem, x, rows, n, plan, share);
  long long g0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
  ring.start();
  const int step = static_cast<int>(blockDim.x) * VEC;
  long long* my = ts + static_cast<int64_t>(blockIdx.x) * kMaxLi * 5;
  for (int64_t li = 0; cluster + li * clusters < rows; ++li) {
    const int64_t row = cluster + li * clusters;
    long long t0 = clock64();
    float sq = 0, s1 = 0;
    float shift = (MODE & (kMoments | kShifted)) ? to_acc(ring.wait(li, 0)[0]) : 0.f;
    Moments<float> mm;
    for (int j = 0; j < plan.pieces; ++j) {
      const T* piece = ring.wait(li, j);
      const int count = ring.piece_elems(j);
      if (MODE & kNoStats) continue;
#pragma unroll 2
      for (int c = static_cast<int>(threadIdx.x) * VEC; c < count; c += step) {
        float f[F];
        unpack_vector<T>(*reinterpret_cast<const V*>(piece + c), f);
        if (MODE & kMoments) {
#pragma unroll
          for (int e = 0; e < F; ++e) f[e] -= shift;
          mm.add<F>(f);
        } else if (MODE & kShifted) {
#pragma unroll
          for (int e = 0; e < F; ++e) { const float d = f[e] - shift; s1 += d; sq = fmaf(d, d, sq); }
        } else {
#pragma unroll
          for (int e = 0; e < F; ++e) sq = fmaf(f[e], f[e], sq);
        }
      }
    }
    long long t1 = clock64();
    V wv[4], bv[4];
    auto load_wb = [&](int j) {
      const int64_t base = static_cast<int64_t>(j) * plan.slot_elems;
      const int count = ring.piece_elems(j);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int c = static_cast<int>(threadIdx.x) * VEC + k * step;
        if (c < count) {
          wv[k] = *reinterpret_cast<const V*>(wb + part_base + base + c);
          bv[k] = *reinterpret_cast<const V*>(wb + n + part_base + base + c);
        }
      }
    };
    if (MODE & kEarly) load_wb(0);
    float mean = 0.f;
    if (MODE & (kMoments | kShifted)) {
      // kShifted's two sums ride the moments' reduction: the same cost, not its value.
      if (MODE & kShifted) { mm.n = 1.f; mm.mean = s1; mm.m2 = sq; }
      mm = block_moments(mm, scratch96);
    } else {
      sq = group_reduce(sq, static_cast<int>(blockDim.x), 0.0f, scratch96, SumOp{});
    }
    long long t2 = clock64();
    if (MODE & (kMoments | kShifted)) {
      if (!(MODE & kNoCluster) && plan.split > 1) mm = staged::split_moments(mm, &shift, plan.split, &mexchange, &round);
      sq = mm.m2; mean = mm.mean;
    } else if (!(MODE & kNoCluster) && plan.split > 1) sq = staged::split_reduce(sq, plan.split, &exchange, &round, SumOp{});
    long long t3 = clock64();
    const float rstd = rsqrtf(sq * inv_n + 1e-6f);
    T* out = x + row * n + part_base;
    if (MODE & kHoisted) {
      for (int j = 0; j < plan.pieces; ++j) {
        if (j > 0 || !(MODE & kEarly)) load_wb(j);
        const T* piece = ring.landed(li, j);
        const int64_t base = static_cast<int64_t>(j) * plan.slot_elems;
        const int count = ring.piece_elems(j);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int c = static_cast<int>(threadIdx.x) * VEC + k * step;
          if (c < count) {
            float f[F], wf[F], bf[F];
            unpack_vector<T>(*reinterpret_cast<const V*>(piece + c), f);
            unpack_vector<T>(wv[k], wf);
            unpack_vector<T>(bv[k], bf);
#pragma unroll
            for (int e = 0; e < F; ++e) f[e] = fmaf(((f[e] - shift) - mean) * rstd, wf[e], bf[e]);
            store_vec(out + base + c, pack_vector<T, V>(f));
          }
        }
      }
    } else
    for (int j = 0; j < plan.pieces; ++j) {
      T* piece = const_cast<T*>(ring.landed(li, j));
      const int64_t base = static_cast<int64_t>(j) * plan.slot_elems;
      const int count = ring.piece_elems(j);
#pragma unroll 2
      for (int c = static_cast<int>(threadIdx.x) * VEC; c < count; c += step) {
        float f[F];
        unpack_vector<T>(*reinterpret_cast<const V*>(piece + c), f);
#pragma unroll
        if (MODE & kWeights) {
          float wf[F], bf[F];
          unpack_vector<T>(*reinterpret_cast<const V*>(wb + part_base + base + c), wf);
          unpack_vector<T>(*reinterpret_cast<const V*>(wb + n + part_base + base + c), bf);
#pragma unroll
          for (int e = 0; e < F; ++e) f[e] = fmaf(((f[e] - shift) - mean) * rstd, wf[e], bf[e]);
        } else {
#pragma unroll
          for (int e = 0; e < F; ++e) f[e] *= rstd;
        }
        if (MODE & kBulkStore) *reinterpret_cast<V*>(piece + c) = pack_vector<T, V>(f);
        else store_vec(out + base + c, pack_vector<T, V>(f));
      }
    }
    if (MODE & kBulkStore) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int j = 0; j < plan.pieces; ++j) {
          const T* piece = ring.landed(li, j);
          const uint32_t bytes = ring.piece_elems(j) * sizeof(T);
          asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(out + static_cast<int64_t>(j) * plan.slot_elems),
                       "r"(sm90::shared_address(piece)), "r"(bytes) : "memory");
        }
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      }
    }
    long long t4 = clock64();
    ring.release(li);
    if (threadIdx.x == 0 && li < kMaxLi) {
      long long* r = my + li * 5;
      r[0] = t1 - t0; r[1] = t2 - t1; r[2] = t3 - t2; r[3] = t4 - t3; r[4] = t0;
    }
  }
  if ((MODE & kBulkStore) && threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  if (plan.split > 1) staged::cluster_sync();
  long long g1; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
  if (threadIdx.x == 0) { ts[132 * 8 * kMaxLi * 5 + 2 * blockIdx.x] = g0; ts[132 * 8 * kMaxLi * 5 + 2 * blockIdx.x + 1] = g1; }
#endif
}

template <typename T>
__global__ void fill(T* p, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = from_acc<T>(static_cast<float>((i * 2654435761u) & 0xffff) / 65536.0f - 0.5f);
}

template <typename T, int MODE>
void run(const char* name, int64_t rows, int64_t n) {
  staged::Plan plan;
  if (!staged::plan_norm_rows(n, sizeof(T), true, &plan)) { printf("no plan\n"); return; }
  T* x; long long* ts;
  CHECK(cudaMalloc(&x, rows * n * sizeof(T)));
  const int maxctas = 132 * 8;
  CHECK(cudaMalloc(&ts, (maxctas * kMaxLi * 5 + 2 * maxctas) * sizeof(long long)));
  CHECK(cudaMemset(ts, 0, (maxctas * kMaxLi * 5 + 2 * maxctas) * sizeof(long long)));
  fill<<<1024, 256>>>(x, rows * n);
  T* y; CHECK(cudaMalloc(&y, rows * n * sizeof(T)));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  {
    fill<<<1024, 256>>>(x, rows * n);
    CHECK(staged::launch_persistent(probe_kernel<T, MODE>, plan, rows, 0, x, rows, n, 1.0f / n, plan, ts, x));
    std::vector<T> hx(rows * n); CHECK(cudaMemcpy(hx.data(), x, rows * n * sizeof(T), cudaMemcpyDeviceToHost));
    double cs = 0; for (int64_t i = 0; i < rows * n; i += 97) cs += double(float(hx[i])) * (1 + (i % 7));
    printf("   checksum %.6e\n", cs);
  }
  // w and b (kWeights) are read from x's first two rows: the timing's, not the values'.
  float best = 1e9, cbest = 1e9;
  for (int it = 0; it < 30; ++it) {
    cudaEventRecord(a);
    CHECK(staged::launch_persistent(probe_kernel<T, MODE>, plan, rows, 0, x, rows, n, 1.0f / n, plan, ts, x));
    cudaEventRecord(b); CHECK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b); best = std::min(best, ms);
    cudaEventRecord(a);
    CHECK(cudaMemcpyAsync(y, x, rows * n * sizeof(T), cudaMemcpyDeviceToDevice));
    cudaEventRecord(b); CHECK(cudaEventSynchronize(b));
    cudaEventElapsedTime(&ms, a, b); cbest = std::min(cbest, ms);
  }
  std::vector<long long> h(maxctas * kMaxLi * 5 + 2 * maxctas);
  CHECK(cudaMemcpy(h.data(), ts, h.size() * 8, cudaMemcpyDeviceToHost));
  double sum[4] = {0, 0, 0, 0}, first[4] = {0, 0, 0, 0}; int cnt = 0, cnt0 = 0; long long span = 0;
  for (int c = 0; c < maxctas; ++c) for (int li = 0; li < kMaxLi; ++li) {
    long long* r = &h[(c * kMaxLi + li) * 5];
    if (r[4] == 0) continue;
    if (li == 0) { for (int k = 0; k < 4; ++k) first[k] += r[k]; ++cnt0; continue; }
    for (int k = 0; k < 4; ++k) sum[k] += r[k];
    ++cnt;
    long long* prev = &h[(c * kMaxLi + li - 1) * 5];
    span += r[4] - prev[4];
  }
  long long T0 = -1, T1 = 0; std::vector<long long> ends, starts;
  for (int c = 0; c < maxctas; ++c) {
    long long a0 = h[maxctas * kMaxLi * 5 + 2 * c], a1 = h[maxctas * kMaxLi * 5 + 2 * c + 1];
    if (a1 == 0) continue;
    if (T0 < 0 || a0 < T0) T0 = a0; T1 = std::max(T1, a1); starts.push_back(a0); ends.push_back(a1);
  }
  std::sort(ends.begin(), ends.end()); std::sort(starts.begin(), starts.end());
  printf("   [ctas %zu span %.1f us; start last %.1f; end min %.1f p10 %.1f med %.1f p90 %.1f max %.1f]\n", ends.size(), (T1 - T0) / 1e3,
         (starts.back() - T0) / 1e3, (ends[0] - T0) / 1e3, (ends[ends.size() / 10] - T0) / 1e3, (ends[ends.size() / 2] - T0) / 1e3,
         (ends[ends.size() * 9 / 10] - T0) / 1e3, (T1 - T0) / 1e3);
  const double gbps = 2.0 * rows * n * sizeof(T) / best / 1e6;
  printf("%-22s split %d pieces %d slots %d threads %d | %.1f us %.0f GB/s (copy %.0f) | row0 wait %.0f red %.0f clu %.0f wr %.0f | rows>0 wait %.0f red %.0f clu %.0f wr %.0f period %.0f cyc (n=%d)\n",
         name, plan.split, plan.pieces, plan.slots, plan.threads, best * 1e3, gbps, 2.0 * rows * n * sizeof(T) / cbest / 1e6,
         first[0] / cnt0, first[1] / cnt0, first[2] / cnt0, first[3] / cnt0,
         sum[0] / cnt, sum[1] / cnt, sum[2] / cnt, sum[3] / cnt, double(span) / cnt, cnt);
  cudaFree(x); cudaFree(y); cudaFree(ts);
}

int main() {
  for (int rep = 0; rep < 2; ++rep) {
    run<__nv_bfloat16, 0>("bf16 1024x65536 rms", 1024, 65536);
    run<__nv_bfloat16, kNoCluster>("bf16 1024x65536 noclu", 1024, 65536);
    run<__nv_bfloat16, kNoStats>("bf16 1024x65536 nostat", 1024, 65536);
    run<__nv_bfloat16, kNoCluster | kNoStats>("bf16 1024x65536 copy", 1024, 65536);
    run<__nv_bfloat16, kBulkStore>("bf16 1024x65536 rmsB", 1024, 65536);
    run<__nv_bfloat16, kNoCluster | kNoStats | kBulkStore>("bf16 1024x65536 copyB", 1024, 65536);
    run<__nv_bfloat16, kWeights>("bf16 1024x65536 rms+wb", 1024, 65536);
    run<__nv_bfloat16, kMoments | kWeights>("bf16 1024x65536 lnM+wb", 1024, 65536);
    run<__nv_bfloat16, kShifted | kWeights>("bf16 1024x65536 lnS+wb", 1024, 65536);
    run<__nv_bfloat16, kMoments | kWeights | kHoisted>("bf16 1024x65536 lnM+wbH", 1024, 65536);
    run<__nv_bfloat16, kMoments | kWeights | kHoisted | kEarly>("bf16 1024x65536 lnM+wbHE", 1024, 65536);
    run<__nv_bfloat16, 0>("bf16 256x262144 rms", 256, 262144);
    run<__nv_bfloat16, kNoCluster | kNoStats>("bf16 256x262144 copy", 256, 262144);
    run<__nv_bfloat16, kMoments | kWeights>("bf16 256x262144 lnM+wb", 256, 262144);
    run<__nv_bfloat16, kShifted | kWeights>("bf16 256x262144 lnS+wb", 256, 262144);
    run<float, 0>("fp32 1024x65536 rms", 1024, 65536);
    run<float, kNoCluster | kNoStats>("fp32 1024x65536 copy", 1024, 65536);
    run<float, kMoments | kWeights>("fp32 1024x65536 lnM+wb", 1024, 65536);
    run<float, kShifted | kWeights>("fp32 1024x65536 lnS+wb", 1024, 65536);
    run<float, 0>("fp32 256x262144 rms", 256, 262144);
    run<float, kNoCluster | kNoStats>("fp32 256x262144 copy", 256, 262144);
    run<float, kMoments | kWeights>("fp32 256x262144 lnM+wb", 256, 262144);
    run<float, kShifted | kWeights>("fp32 256x262144 lnS+wb", 256, 262144);
  }
}
