#pragma once
// Rows staged in shared memory by the Hopper bulk-copy engine, for the
// row-wise kernels (softmax, layer norm) on rows of 32 KiB and more.
//
// Why: a row-wise op needs its whole row before it can write any element.
// Held in registers, a long row leaves few CTAs per SM, and each CTA waits
// out its loads, then reduces, then writes, so the memory system idles
// between phases. Here a persistent CTA keeps a ring of shared-memory slots:
// `cp.async.bulk` fills the slots of the next rows while the threads reduce
// and write the current one, so every element is still read once and
// written once, and loads stay in flight across row boundaries.
//
// A row of `n` elements is cut into `pieces` pieces of up to `slot_elems`;
// the CTA's pieces form one sequence (its row li, piece j is position
// p = li * pieces + j) that walks the ring: position p lives in slot
// p % slots and completes phase (p / slots) & 1 of that slot's mbarrier.
// One thread issues the copies; a slot is refilled only after the
// __syncthreads that ends the row that used it.
//
// Rows too long for one CTA's ring are split over a cluster of 2, 4 or 8
// CTAs where the kernel allows: each stages its part of the row, and the
// row's reductions are combined through distributed shared memory
// (split_reduce, split_max_sum, split_moments), one cluster barrier per
// reduction. So a row of up to 8 rings is still read once.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "make_inplace/kernels/compute_capability.h"
#include "make_inplace/kernels/moments.cuh"
#include "make_inplace/kernels/rowwise_cuda.cuh"
#include "make_inplace/kernels/sm90_sync.cuh"
#include "make_inplace/route_override.h"

namespace make_inplace::kernels::staged {

// The staged kernels need sm_90's bulk copies and transaction-count mbarriers.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MAKE_INPLACE_STAGED_ROWS 1
#endif

// Slot size, CTA size and the shortest staged row: the best of a sweep on an
// H100 (docs/rowwise_tuning.md).
constexpr int kThreads = 512;
constexpr int kSlotBytes = 32 * 1024;
// Layer norm's staged kernel takes 1024 threads on rows of 4 or more pieces.
constexpr int kMaxThreads = 1024;
// Shorter rows stay with the register kernels, which were faster up to 16 KiB
// rows.
constexpr int kMinRowBytes = 32 * 1024;
constexpr int kMaxRingBytes = 200 * 1024;  // of the 227 KiB a CTA may have
constexpr int kBarrierBytes = 128;         // barriers ahead of the slots, 16 max

constexpr int kMaxSplit = 8;  // CTAs per row: a portable cluster size

struct Plan {
  int split = 1;       // CTAs (a cluster) per row: 1, 2, 4 or 8
  int64_t part = 0;    // elements of the row each CTA stages
  int slot_elems = 0;  // elements per slot
  int pieces = 0;      // slots one part needs
  int slots = 0;       // ring length
  int threads = 0;
  int smem_bytes = 0;
};

// A ring for parts of `part_bytes`, or false when it does not fit.
inline bool plan_part(int64_t part_bytes, int elem, Plan* plan) {
  const int64_t slot_bytes = part_bytes < kSlotBytes ? part_bytes : kSlotBytes;
  const int64_t pieces = (part_bytes + slot_bytes - 1) / slot_bytes;
  // Two parts' worth of slots while that stays within 64 KiB (several CTAs
  // per SM then overlap as well), else a part and a half.
  int64_t slots = 2 * pieces;
  if (slots * slot_bytes > 64 * 1024) slots = pieces + (pieces + 1) / 2;
  if (slots * slot_bytes > kMaxRingBytes) slots = kMaxRingBytes / slot_bytes;
  if (slots < pieces + 1 || slots > kBarrierBytes / 8) return false;
  plan->slot_elems = static_cast<int>(slot_bytes / elem);
  plan->pieces = static_cast<int>(pieces);
  plan->slots = static_cast<int>(slots);
  plan->threads = kThreads;
  plan->smem_bytes = static_cast<int>(kBarrierBytes + slots * slot_bytes);
  return true;
}

// A plan for rows of n elements of `elem` bytes, or false when staging does
// not apply: rows too short, rows too long for the ring (or, where the
// kernel can combine parts (allow_split), for kMaxSplit rings), a GPU older
// than sm_90, or staging switched off (route_override.h; tests and sweeps).
// A row is split over the fewest CTAs whose parts fit a ring, or twice as
// many where that makes parts of at most two slots.
// The caller has checked that x (and every vector it reads beside it) is
// 16-byte aligned.
inline bool plan_rows(int64_t n, int elem, bool allow_split, Plan* plan) {
  const int64_t row_bytes = n * elem;
  if (row_bytes % 16 != 0 || row_bytes < kMinRowBytes) return false;
  if (!route_override().staged_rows) return false;
  if (compute_major() < 9) return false;
  plan->split = 0;
  for (int split = 1; split <= (allow_split ? kMaxSplit : 1); split *= 2) {
    // Each part must start 16-byte aligned.
    if (row_bytes % (16 * split) == 0 && plan_part(row_bytes / split, elem, plan)) {
      plan->split = split;
      break;
    }
  }
  if (plan->split == 0) return false;
  // A row that needs a cluster anyway goes to one twice as large where that
  // makes parts of at most two slots: rings of three slots leave room for two
  // CTAs per SM, one loading while the other reduces or writes.
  Plan smaller;
  const int twice = plan->split * 2;
  if (plan->split > 1 && plan->pieces > 2 && twice <= kMaxSplit && row_bytes % (16 * twice) == 0 &&
      plan_part(row_bytes / twice, elem, &smaller) && smaller.pieces <= 2) {
    *plan = smaller;
    plan->split = twice;
  }
  plan->part = n / plan->split;
  return true;
}

// A plan that splits rows of n elements in halves over a 2-CTA cluster, or
// false when the halves would not start 16-byte aligned or not fit a ring.
inline bool plan_halves(int64_t n, int elem, Plan* plan) {
  if (n % 2 != 0 || (n * elem) % 32 != 0 || !plan_rows(n / 2, elem, false, plan)) return false;
  plan->split = 2;
  plan->part = n / 2;
  return true;
}

// The plan of the norms' staged kernels (layer_norm_, rms_norm_): with
// allow_split, rows too long for one ring and rows of four or more slots
// whose halves fit one are split over a 2-CTA cluster, so that two CTAs share
// an SM and one's loads overlap the other's stores; rows of four or more
// slots take kMaxThreads (docs/rowwise_tuning.md). False as plan_rows.
inline bool plan_norm_rows(int64_t n, int elem, bool allow_split, Plan* plan) {
  if (!plan_rows(n, elem, allow_split, plan)) return false;
  Plan halves;
  if (allow_split && plan->split == 1 && plan->pieces >= 4 && plan_halves(n, elem, &halves)) *plan = halves;
  if (plan->pieces >= 4) plan->threads = kMaxThreads;
  return true;
}

// The most dynamic shared memory any plan asks for.
constexpr int kMaxPlanSmemBytes = kBarrierBytes + kMaxRingBytes;

// Launches a persistent staged kernel: as many CTAs as fit on the GPU at
// once (whole clusters of plan.split), at most plan.split per row. Clusters
// of 4 or 8 must fit in a GPC, so their count comes from the occupancy API.
// A kernel's dynamic shared-memory limit is one value per (kernel, device),
// not per plan: it is raised once to kMaxPlanSmemBytes and never lowered, so
// whatever widths earlier calls (from any thread) ran, this launch fits it.
// The occupancy, which does depend on the plan, is cached per plan shape.
template <typename... Params, typename... Args>
cudaError_t launch_persistent(void (*kernel)(Params...), const Plan& plan, int64_t rows,
                              cudaStream_t stream, Args&&... args) {
  struct Fit {
    const void* kernel;
    int device, smem_bytes, threads, split;
    int64_t clusters;
  };
  static std::mutex mutex;
  static std::vector<Fit> known;
  if (plan.smem_bytes > kMaxPlanSmemBytes) return cudaErrorInvalidValue;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const void* key = reinterpret_cast<const void*>(kernel);
  int64_t fit = 0;  // clusters of plan.split at once
  {
    const std::lock_guard<std::mutex> lock(mutex);
    bool raised = false;
    for (const Fit& f : known) {
      if (f.kernel != key || f.device != device) continue;
      raised = true;
      if (f.smem_bytes == plan.smem_bytes && f.threads == plan.threads && f.split == plan.split) fit = f.clusters;
    }
    if (!raised) {
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 kMaxPlanSmemBytes);
      if (err != cudaSuccess) return err;
    }
    if (fit == 0 && plan.split <= 2) {
      int64_t ctas = 0;
      err = rowwise::resident_ctas(kernel, plan.threads, plan.smem_bytes, &ctas);
      if (err != cudaSuccess) return err;
      if (ctas < plan.split) return cudaErrorInvalidConfiguration;
      fit = ctas / plan.split;
    } else if (fit == 0) {
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(static_cast<unsigned>(plan.split));
      config.blockDim = dim3(plan.threads);
      config.dynamicSmemBytes = plan.smem_bytes;
      cudaLaunchAttribute cluster;
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = static_cast<unsigned>(plan.split);
      cluster.val.clusterDim.y = 1;
      cluster.val.clusterDim.z = 1;
      config.attrs = &cluster;
      config.numAttrs = 1;
      int count = 0;
      err = cudaOccupancyMaxActiveClusters(&count, reinterpret_cast<const void*>(kernel), &config);
      if (err != cudaSuccess) return err;
      if (count < 1) return cudaErrorInvalidConfiguration;
      fit = count;
    }
    if (fit > 0) known.push_back({key, device, plan.smem_bytes, plan.threads, plan.split, fit});
  }
  const int64_t clusters = std::min<int64_t>(rows, fit);
  if (plan.split == 1) {
    kernel<<<static_cast<unsigned>(clusters), plan.threads, plan.smem_bytes, stream>>>(
        std::forward<Args>(args)...);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(clusters * plan.split));
  config.blockDim = dim3(plan.threads);
  config.dynamicSmemBytes = plan.smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = plan.split;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

#ifdef MAKE_INPLACE_STAGED_ROWS

using sm90::cluster_rank;
using sm90::cluster_sync;
using sm90::shared_address;

// Stores v at `at` in the shared memory of every CTA of a cluster of
// `ctas` (this one included).
__device__ __forceinline__ void store_all(float* at, float v, int ctas) {
  for (int q = 0; q < ctas; ++q) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(at)), "r"(q));
    asm volatile("st.shared::cluster.b32 [%0], %1;" ::"r"(remote), "r"(__float_as_uint(v)) : "memory");
  }
}

// Where a split row's reductions meet: two rounds of one slot per CTA,
// alternating, so a round's slots are written again only after the next
// round's barrier, which every CTA passes after reading them.
struct SplitExchange {
  float slots[2][kMaxSplit];
};

// Combines a CTA-wide value (every thread holds it) over the plan.split CTAs
// of a cluster; all get op folded over the values in rank order, the same
// bits everywhere (rms_norm_'s sum of squares).
template <typename Op>
__device__ __forceinline__ float split_reduce(float v, int split, SplitExchange* ex, int* round, Op op) {
  float* slot = ex->slots[*round & 1];
  *round += 1;
  if (threadIdx.x == 0) store_all(slot + cluster_rank(), v, split);
  cluster_sync();
  float r = slot[0];
  for (int q = 1; q < split; ++q) r = op(r, slot[q]);
  return r;
}

// A split softmax row's (max, sum) pairs meet in one barrier: each CTA's sum
// is of exp2((x - m) * scale) with m its own part's max, and all rescale them
// to the largest m, in rank order. A part whose max is -inf adds 0 (its sum
// is 0: the caller sums with a shift of 0 there).
struct SplitMaxSum {
  float slots[2][kMaxSplit][2];  // [round][rank][max, sum]
};

__device__ __forceinline__ void split_max_sum(float* m, float* s, float scale, int split, SplitMaxSum* ex,
                                              int* round) {
  float (*slot)[2] = ex->slots[*round & 1];
  *round += 1;
  if (threadIdx.x == 0) {
    store_all(&slot[cluster_rank()][0], *m, split);
    store_all(&slot[cluster_rank()][1], *s, split);
  }
  cluster_sync();
  float top = slot[0][0];
  for (int q = 1; q < split; ++q) top = fmaxf(top, slot[q][0]);
  float sum = 0.f;
  for (int q = 0; q < split; ++q) {
    if (slot[q][0] != -INFINITY) sum += slot[q][1] * exp2f((slot[q][0] - top) * scale);
  }
  *m = top;
  *s = sum;
}

// A split row's statistics meet the same way: each CTA stores its moments
// (moments.cuh) of x - shift, with its own shift, in every CTA's slot for
// its rank, and after the cluster barrier all merge them in rank order, each
// moved to rank 0's shift, so all get the same bits. *shift becomes rank 0's
// shift.
struct SplitMoments {
  float slots[2][kMaxSplit][4];  // [round][rank][n, mean, M2, shift]
};

__device__ __forceinline__ rowwise::Moments<float> split_moments(const rowwise::Moments<float>& m, float* shift,
                                                                 int split, SplitMoments* ex, int* round) {
  float (*slot)[4] = ex->slots[*round & 1];
  *round += 1;
  if (threadIdx.x == 0) {
    const float v[4] = {m.n, m.mean, m.m2, *shift};
#pragma unroll
    for (int k = 0; k < 4; ++k) store_all(&slot[cluster_rank()][k], v[k], split);
  }
  cluster_sync();
  rowwise::Moments<float> r;
  r.merge(slot[0][0], slot[0][1], slot[0][2]);
  for (int q = 1; q < split; ++q) r.merge(slot[q][0], slot[q][1] + (slot[q][3] - slot[0][3]), slot[q][2]);
  *shift = slot[0][3];
  return r;
}

// The rows and columns one CTA of a staged launch works on: with plan.split
// > 1 the CTAs of a cluster stage the parts of the same rows.
struct Share {
  int64_t part_base;  // the first column this CTA stages
  int64_t first_row;
  int64_t row_step;
};

__device__ __forceinline__ Share share_of(const Plan& plan) {
  return {plan.split > 1 ? static_cast<int64_t>(cluster_rank()) * plan.part : 0,
          static_cast<int64_t>(blockIdx.x / plan.split),
          static_cast<int64_t>(gridDim.x / plan.split)};
}

// The ring of one CTA over rows first_row, first_row + row_step, ... of x.
template <typename T>
class RowRing {
 public:
  // x points at this CTA's part of row 0; rows are `stride` elements apart,
  // parts plan.part elements long.
  __device__ RowRing(unsigned char* smem, const T* x, int64_t rows, int64_t stride,
                     const Plan& plan, int64_t first_row, int64_t row_step)
      : bars_(reinterpret_cast<uint64_t*>(smem)),
        data_(reinterpret_cast<T*>(smem + kBarrierBytes)),
        x_(x), rows_(rows), n_(plan.part), stride_(stride), plan_(plan), first_row_(first_row),
        row_step_(row_step) {}

  // The ring of this CTA's share of x (rows x stride elements).
  __device__ RowRing(unsigned char* smem, const T* x, int64_t rows, int64_t stride,
                     const Plan& plan, const Share& share)
      : RowRing(smem, x + share.part_base, rows, stride, plan, share.first_row, share.row_step) {}

  // Every thread calls this once; thread 0 sets up the barriers and fills the
  // ring. A split row's CTAs then wait for each other, so that every CTA of
  // the cluster runs before any remote store.
  __device__ void start() {
    if (threadIdx.x == 0) {
      for (int s = 0; s < plan_.slots; ++s) sm90::mbar_init(bars_ + s, 1);
      sm90::mbar_init_fence();
      for (int64_t p = 0; p < plan_.slots; ++p) issue(p);
    }
    __syncthreads();
    if (plan_.split > 1) cluster_sync();
  }

  // Piece j of the CTA's row li, once its copy has landed.
  __device__ const T* wait(int64_t li, int j) const {
    const int64_t p = li * plan_.pieces + j;
    sm90::mbar_wait(bars_ + p % plan_.slots, static_cast<uint32_t>((p / plan_.slots) & 1));
    return landed(li, j);
  }

  // Piece j of row li after wait(li, j) has returned once.
  __device__ const T* landed(int64_t li, int j) const {
    const int64_t p = li * plan_.pieces + j;
    return data_ + (p % plan_.slots) * static_cast<int64_t>(plan_.slot_elems);
  }

  // Elements in piece j of a part.
  __device__ int piece_elems(int j) const {
    const int64_t left = n_ - static_cast<int64_t>(j) * plan_.slot_elems;
    return static_cast<int>(left < plan_.slot_elems ? left : plan_.slot_elems);
  }

  // Every thread calls this after its last read of row li's pieces: the
  // slots go to the pieces `slots` positions further on.
  __device__ void release(int64_t li) {
    __syncthreads();
    if (threadIdx.x == 0) {
      // Our reads of the slots (generic proxy) before the copy engine's writes.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      for (int j = 0; j < plan_.pieces; ++j) issue(li * plan_.pieces + j + plan_.slots);
    }
  }

 private:
  __device__ void issue(int64_t p) const {
    const int64_t li = p / plan_.pieces;
    const int j = static_cast<int>(p % plan_.pieces);
    const int64_t row = first_row_ + li * row_step_;
    if (row >= rows_) return;
    const uint32_t bytes = static_cast<uint32_t>(piece_elems(j) * sizeof(T));
    uint64_t* bar = bars_ + p % plan_.slots;
    const T* src = x_ + row * stride_ + static_cast<int64_t>(j) * plan_.slot_elems;
    T* dst = data_ + (p % plan_.slots) * static_cast<int64_t>(plan_.slot_elems);
    sm90::mbar_arrive_expect_tx(bar, bytes);
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            shared_address(dst)),
        "l"(src), "r"(bytes), "r"(shared_address(bar))
        : "memory");
  }

  uint64_t* bars_;
  T* data_;
  const T* x_;
  int64_t rows_, n_, stride_;
  Plan plan_;
  int64_t first_row_, row_step_;
};

#endif  // MAKE_INPLACE_STAGED_ROWS

}  // namespace make_inplace::kernels::staged
