// The Hopper square matmul for rows of up to 512 columns (16-bit types):
// x[rows, n] <- x @ w (+ bias), or x @ w^T with transpose, each CTA owning
// whole 64-row blocks of x.
//
// Why: in the 128-row kernel (square_matmul_wgmma.cu) a 512-column row-block
// is two 128 x 256 tiles in two CTAs, each waiting for the other before it
// may write. Here one CTA holds a whole 64 x 512 block of results, 64 x 256
// per consumer warpgroup, the same accumulator registers and wgmma shape. Its
// rows are read by no other CTA, so the block is written back as soon as its
// own last k-step is done, while the loads of its next block are under way.
// No counters, no clusters, no device memory.
//
// CTA layout (384 threads): warpgroup 0 issues the TMA loads (one thread) and
// the TMA stores (one thread of another warp); warpgroups 1 and 2 compute
// columns 0-255 and 256-511. Shared memory: a 3-stage ring of 64 x 64 x-tiles
// and 64 x 512 w-tiles (72 KiB a stage). Each warpgroup rounds its results
// into its own half of the last k-step's w-tile, which only it reads, and the
// store warp hands that stage back to the loads once the store has read it.
#include "make_inplace/kernels/square_matmul_wgmma_rows.h"

#include <cstdint>

#include "make_inplace/kernels/sm90_sync.cuh"
#include "make_inplace/kernels/wgmma_sm90.cuh"

namespace make_inplace::kernels {
namespace {

using namespace wgmma_sm90;

constexpr int kBM = static_cast<int>(wgmma_rows::kRowBlock), kMaxN = static_cast<int>(wgmma_rows::kMaxN);
constexpr int kHalfCols = 256;                    // a consumer warpgroup's columns
constexpr int kThreads = 384;
constexpr int kStages = 3;
constexpr int kATileBytes = kBM * kBK * 2;        // 8 KiB
constexpr int kHalfBytes = kHalfCols * kBK * 2;   // a warpgroup's columns of a w-tile, 32 KiB
constexpr int kStageBytes = kATileBytes + 2 * kHalfBytes;
constexpr int kSmemBytes = kStages * kStageBytes + 1024 /* alignment */ + 256 /* barriers */;
static_assert(kSmemBytes <= 227 * 1024, "sm_90 shared memory per block");
static_assert(kStageBytes % 1024 == 0 && kATileBytes % 1024 == 0, "the 128-byte swizzle's 1024-byte period");
static_assert((wgmma_rows::kMinN + kBK - 1) / kBK >= kStages, "a block reaches its held stage again");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kConsumerWarps = 8;                 // warpgroups 1 and 2
constexpr int kResultBoxBytes = kBM * kBoxCols * 2;  // a 64 x 64 box of results, 8 KiB

using sm90::mbar_arrive;
using sm90::mbar_arrive_expect_tx;
using sm90::mbar_wait;

__device__ __forceinline__ void mbar_arrive_count(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}

// Every CTA reads all of w for each of its blocks, all CTAs in step at the
// start, where each k-step's w-tile then waited on DRAM in turn (w is not
// in L2 when the inputs rotate, as in the benchmarks). So each CTA first
// brings its share of w's boxes into L2, and all of w is asked for at once.
template <bool kWeightKMajor>
__device__ __forceinline__ void prefetch_w_share(const CUtensorMap* w_map, int n, int k_tiles) {
  // The loads' boxes: 256 rows of a k-step's columns (w[j][k]), or 64 x 64.
  const int boxes_per_step = kWeightKMajor ? (n + kHalfCols - 1) / kHalfCols : (n + kBoxCols - 1) / kBoxCols;
  for (int i = blockIdx.x; i < k_tiles * boxes_per_step; i += gridDim.x) {
    const int kt = i % k_tiles, box = i / k_tiles;
    if (kWeightKMajor) {
      tma_prefetch(w_map, kt * kBK, box * kHalfCols);
    } else {
      tma_prefetch(w_map, box * kBoxCols, kt * kBK);
    }
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// CTA b computes row-blocks b, b + gridDim.x, ...; x is reached through
// x_map only (64 x 64 boxes, loads and stores).
template <typename Elem, bool kWeightKMajor>
__global__ void __launch_bounds__(kThreads, 1)
    square_matmul_wgmma_rows_kernel(const __grid_constant__ CUtensorMap x_map,
                                    const __grid_constant__ CUtensorMap w_map, const void* bias, int64_t rows, int n) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // TMA's 128-byte swizzle repeats every 1024 bytes: align the ring to it.
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  uint64_t* parked = empty + kStages;  // both warpgroups have rounded the row-block into the last stage

  const int row_blocks = static_cast<int>((rows + kBM - 1) / kBM);
  const int k_tiles = (n + kBK - 1) / kBK;
  const int warpgroup = threadIdx.x / 128;
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbar_init(&full[s], 1);
      sm90::mbar_init(&empty[s], kConsumerWarps);
    }
    sm90::mbar_init(parked, 2);
    sm90::mbar_init_fence();
  }
  __syncthreads();

  if (warpgroup == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (warp == 0 && lane == 0) {  // TMA loads, in the consumers' order
      prefetch_w_share<kWeightKMajor>(&w_map, n, k_tiles);
      StageRing<kStages> ring;
      for (int rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) {
        for (int kt = 0; kt < k_tiles; ++kt, ring.advance()) {
          const int stage = ring.stage;
          mbar_wait(&empty[stage], ring.phase ^ 1);
          mbar_arrive_expect_tx(&full[stage], kStageBytes);
          uint8_t* a = smem + stage * kStageBytes;
          uint8_t* b = a + kATileBytes;
          tma_load(a, &x_map, &full[stage], kt * kBK, rb * kBM);
          if (kWeightKMajor) {  // w[j][k]: one 256-row box per half
            for (int h = 0; h < 2; ++h) tma_load(b + h * kHalfBytes, &w_map, &full[stage], kt * kBK, h * kHalfCols);
          } else {  // w[k][j]: eight 64-column boxes
            for (int i = 0; i < kMaxN / kBoxCols; ++i) {
              tma_load(b + i * kWBoxBytes, &w_map, &full[stage], i * kBoxCols, kt * kBK);
            }
          }
        }
      }
    } else if (warp == 1 && lane == 0) {  // TMA stores of each row-block, then its stage back to the loads
      int steps = 0, j = 0;
      for (int rb = blockIdx.x; rb < row_blocks; rb += gridDim.x, ++j) {
        steps += k_tiles;
        const int last = (steps - 1) % kStages;
        mbar_wait(parked, j & 1);
        // The block's TMA loads all completed before its last wgmma: order
        // those async-proxy reads before the async-proxy writes below.
        asm volatile("fence.proxy.async.global;" ::: "memory");
        const uint8_t* results = smem + last * kStageBytes + kATileBytes;
        for (int i = 0; i < kMaxN / kBoxCols && i * kBoxCols < n; ++i) {
          tma_store(&x_map, results + (i / 4) * kHalfBytes + (i % 4) * kResultBoxBytes, i * kBoxCols, rb * kBM);
        }
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
        mbar_arrive_count(&empty[last], kConsumerWarps);
      }
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int half = warpgroup - 1;  // columns half * 256 .. half * 256 + 255
    StageRing<kStages> ring;
    float acc[128];
    // The warpgroup's columns are the same every row-block: their bias is
    // loaded once, not on each park's path.
    uint32_t bias_bits[32];
    if (bias != nullptr) load_bias_bits(bias, int64_t{half} * kHalfCols, n, lane, bias_bits);
    const auto tiles = [&](int stage) {
      return StepTiles{shared_address(smem + stage * kStageBytes),
                       shared_address(smem + stage * kStageBytes + kATileBytes + half * kHalfBytes)};
    };
    for (int rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) {
      const int last = run_k_steps<Elem, kWeightKMajor>(acc, ring, full, empty, k_tiles, lane, tiles);
      // The last stage stays held: the store warp frees it after the store.
      uint8_t* results = smem + last * kStageBytes + kATileBytes + half * kHalfBytes;
      if (bias != nullptr) {
        park_tile<Elem, true, kBM>(acc, results, bias_bits, 0, warp, lane);
      } else {
        park_tile<Elem, false, kBM>(acc, results, bias_bits, 0, warp, lane);
      }
      // Make the results visible to TMA, then tell the store warp.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      asm volatile("bar.sync %0, 128;" ::"r"(1 + half) : "memory");
      if (threadIdx.x % 128 == 0) mbar_arrive(parked);
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a: the residency is 0, so the policy never launches it
#endif
}

using KernelFn = void (*)(const CUtensorMap, const CUtensorMap, const void*, int64_t, int);

KernelFn kernel_for(ScalarKind kind, bool k_major) {
  if (kind == ScalarKind::kBFloat16) {
    return k_major ? square_matmul_wgmma_rows_kernel<__nv_bfloat16, true>
                   : square_matmul_wgmma_rows_kernel<__nv_bfloat16, false>;
  }
  return k_major ? square_matmul_wgmma_rows_kernel<__half, true> : square_matmul_wgmma_rows_kernel<__half, false>;
}

constexpr bool kBuiltForSm90a =
#if defined(MAKE_INPLACE_SM90A)
    true;
#else
    false;
#endif

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int square_matmul_wgmma_rows_residency(ScalarKind kind, bool transpose) {
  if (!kBuiltForSm90a || (kind != ScalarKind::kFloat16 && kind != ScalarKind::kBFloat16)) return 0;
  const KernelFn kernel = kernel_for(kind, transpose);
  int device = 0, per_sm = 0, sms = 0;
  const bool ok = cudaGetDevice(&device) == cudaSuccess &&
                  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) ==
                      cudaSuccess &&
                  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, kSmemBytes) ==
                      cudaSuccess &&
                  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess;
  (void)cudaGetLastError();
  return ok ? per_sm * sms : 0;
}

cudaError_t square_matmul_wgmma_rows(ScalarKind kind, void* x, const void* w, const void* bias, int64_t rows,
                                     int64_t n, bool transpose, int ctas, cudaStream_t stream) {
  if (!kBuiltForSm90a || (kind != ScalarKind::kFloat16 && kind != ScalarKind::kBFloat16) ||
      n < wgmma_rows::kMinN || n % 8 != 0 || n > kMaxN || rows < 0 || rows > kMaxGroupRows || !aligned16(x) ||
      !aligned16(w)) {
    return cudaErrorNotSupported;
  }
  if (ctas < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  // x: 64 x 64 boxes, loaded and stored. transpose: x @ w^T reads w's rows
  // along k (K-major, 256 x 64 boxes); otherwise w's rows along the output
  // columns (N-major, 64 x 64 boxes).
  CUtensorMap x_map, w_map;
  if (tensor_map_encoder() == nullptr) return cudaErrorNotSupported;
  if (!encode_map(&x_map, kind, x, rows, n, kBM) || !encode_map(&w_map, kind, w, n, n, transpose ? kHalfCols : kBK)) {
    return cudaErrorInvalidValue;
  }
  const int64_t row_blocks = (rows + kBM - 1) / kBM;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(ctas < row_blocks ? ctas : row_blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kernel_for(kind, transpose), x_map, w_map, bias, rows, static_cast<int>(n));
}

}  // namespace make_inplace::kernels
