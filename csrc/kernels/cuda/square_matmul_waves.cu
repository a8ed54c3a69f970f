// square_matmul_waves, the zero-workspace in-place square matmul for every GPU
// and dtype: x[rows, n] <- x @ w (+ bias), or x @ w^T with transpose, using no
// device memory beyond x, w and bias.
//
// Why waves: every output tile of a row-block reads the whole row-block of x,
// so no tile may be written until all tiles of its row-block are computed. A
// persistent cooperative grid processes whole row-blocks in "waves": each CTA
// computes its tiles of the wave (reading x and w from global memory; w stays
// in L2), parks them in shared memory already rounded to x's dtype, the grid
// meets at a barrier, and then each CTA copies its parked tiles over x. The
// rows of different waves are disjoint, so the writes of one wave can only
// race with reads of the same wave, which the barrier orders: one barrier per
// wave suffices. Within a wave the tiles are dealt round-robin over the CTAs.
//
// Tiles: half types use tensor cores (mma.sync m16n8k16, fp32 accumulation,
// ldmatrix, cp.async multi-stage pipeline that runs across a CTA's tiles);
// fp32 and fp64 use exact FFMA/DFMA register tiles (fp32 does not use TF32
// even when allowed: the result is then more exact than asked, never less).
// A small tile height (16 rows) serves very wide rows, whose row-block must
// fit in one wave's parking space, and tiny row counts.
#include "make_inplace/kernels/square_matmul_waves.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace make_inplace::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;

// What every wave kernel needs. Element counts and offsets are int64.
template <typename T>
struct WaveArgs {
  T* x;
  const T* w;
  const T* bias;  // null: no bias
  int64_t rows;
  int64_t n;
  int64_t row_blocks;       // ceil(rows / BM)
  int64_t blocks_per_wave;  // whole row-blocks per wave
  int64_t waves;
  int64_t tiles_per_row;    // ceil(n / BN)
  int tiles_per_cta;        // parking slots per CTA
};

// The tiles a CTA owns in one wave are t = blockIdx.x + j * gridDim.x for
// j < count; tile t is column block t % tiles_per_row of row-block
// first_block + t / tiles_per_row.
struct WaveSlice {
  int64_t first_block;
  int count;
};

template <typename T>
__device__ __forceinline__ WaveSlice wave_slice(const WaveArgs<T>& a, int64_t wave) {
  const int64_t first = wave * a.blocks_per_wave;
  const int64_t blocks = min(a.blocks_per_wave, a.row_blocks - first);
  const int64_t tiles = blocks * a.tiles_per_row;
  const int64_t bid = blockIdx.x;
  const int64_t mine = tiles > bid ? (tiles - bid + gridDim.x - 1) / gridDim.x : 0;
  return {first, static_cast<int>(min(mine, static_cast<int64_t>(a.tiles_per_cta)))};
}

template <typename T>
__device__ __forceinline__ void tile_origin(const WaveArgs<T>& a, const WaveSlice& s, int j,
                                            int bm, int bn, int64_t* row0, int64_t* col0) {
  const int64_t t = blockIdx.x + static_cast<int64_t>(j) * gridDim.x;
  *row0 = (s.first_block + t / a.tiles_per_row) * bm;
  *col0 = (t % a.tiles_per_row) * bn;
}

// ---------------------------------------------------------------------------
// PTX wrappers (sm_80 and later). The "memory" clobbers keep the compiler from
// moving shared-memory accesses across them.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy; src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// The two 16-bit types: how to read one as float, round a pair into one
// 32-bit word (low half = lower column) and multiply on tensor cores.
struct Bf16Ops {
  static __device__ __forceinline__ float to_float(uint16_t v) {
    return __bfloat162float(__ushort_as_bfloat16(v));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

struct Fp16Ops {
  static __device__ __forceinline__ float to_float(uint16_t v) {
    return __half2float(__ushort_as_half(v));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// ---------------------------------------------------------------------------
// Tensor-core tiles for fp16/bf16. BM x 256 output tile, 8 warps; BK = 32 per
// pipeline stage. Rows of the shared tiles are padded by 16 bytes so ldmatrix
// and the parked-tile stores hit distinct banks.
template <int BM, bool kTransB>
struct MmaCfg {
  static constexpr int kBM = BM, kBN = 256, kBK = 32, kStages = 3;
  static constexpr int kWarpsM = BM >= 64 ? 2 : 1, kWarpsN = 8 / kWarpsM;
  static constexpr int kMI = BM / (kWarpsM * 16);  // m16 tiles per warp
  static constexpr int kNI = kBN / (kWarpsN * 8);  // n8 tiles per warp
  static constexpr int kALd = kBK + 8;
  // transpose: w is read as [n][k] (k contiguous), else as [k][n].
  static constexpr int kBLd = kTransB ? kBK + 8 : kBN + 8;
  static constexpr int kAElems = BM * kALd;
  static constexpr int kBElems = kTransB ? kBN * kBLd : kBK * kBLd;
  static constexpr int kStageElems = kAElems + kBElems;
  static constexpr int kPipelineBytes = kStages * kStageElems * 2;
  static constexpr int kParkLd = kBN + 8;
  static constexpr int kParkBytes = BM * kParkLd * 2;
  static_assert(kMI >= 1 && kNI % 2 == 0, "warp tiling");
};

// Eight consecutive 16-bit elements row[col..col+7] into shared memory; those
// at or past `limit`, and all of them when row is null, become zero. Aligned:
// n is a multiple of 8 and the pointers are 16-byte aligned, so a chunk is
// either wholly inside or wholly outside.
template <bool kAligned>
__device__ __forceinline__ void load_chunk8(uint16_t* dst, const uint16_t* row, int64_t col,
                                            int64_t limit, const void* any_global) {
  if constexpr (kAligned) {
    const bool ok = row != nullptr && col < limit;
    cp_async16(dst, ok ? static_cast<const void*>(row + col) : any_global, ok ? 16 : 0);
  } else {
    uint32_t word[4];
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const uint32_t lo = (row != nullptr && col + e < limit) ? row[col + e] : 0u;
      const uint32_t hi = (row != nullptr && col + e + 1 < limit) ? row[col + e + 1] : 0u;
      word[e / 2] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(word[0], word[1], word[2], word[3]);
  }
}

// One pipeline stage: A = x[row0 .. +BM, k0 .. +BK], B = the matching BK x BN
// block of the product's right operand.
template <typename Cfg, bool kTransB, bool kAligned>
__device__ __forceinline__ void mma_load_stage(uint16_t* stage, const WaveArgs<uint16_t>& a,
                                               int64_t row0, int64_t col0, int64_t k0,
                                               int tid) {
  uint16_t* sa = stage;
  uint16_t* sb = stage + Cfg::kAElems;
  constexpr int kAChunks = Cfg::kBM * Cfg::kBK / 8;
#pragma unroll
  for (int c0 = 0; c0 < kAChunks; c0 += kThreads) {
    const int c = c0 + tid;
    if (kAChunks % kThreads == 0 || c < kAChunks) {
      const int r = c / (Cfg::kBK / 8), kc = (c % (Cfg::kBK / 8)) * 8;
      const int64_t gr = row0 + r;
      load_chunk8<kAligned>(sa + r * Cfg::kALd + kc, gr < a.rows ? a.x + gr * a.n : nullptr,
                            k0 + kc, a.n, a.w);
    }
  }
  constexpr int kBChunks = Cfg::kBK * Cfg::kBN / 8;
  static_assert(kBChunks % kThreads == 0, "B chunks");
#pragma unroll
  for (int c0 = 0; c0 < kBChunks; c0 += kThreads) {
    const int c = c0 + tid;
    if constexpr (kTransB) {
      // B[k][j] = w[j][k]: rows j of w, k contiguous.
      const int r = c / (Cfg::kBK / 8), kc = (c % (Cfg::kBK / 8)) * 8;
      const int64_t gj = col0 + r;
      load_chunk8<kAligned>(sb + r * Cfg::kBLd + kc, gj < a.n ? a.w + gj * a.n : nullptr,
                            k0 + kc, a.n, a.w);
    } else {
      const int r = c / (Cfg::kBN / 8), nc = (c % (Cfg::kBN / 8)) * 8;
      const int64_t gk = k0 + r;
      load_chunk8<kAligned>(sb + r * Cfg::kBLd + nc, gk < a.n ? a.w + gk * a.n : nullptr,
                            col0 + nc, a.n, a.w);
    }
  }
}

template <typename Cfg, bool kTransB, typename Ops>
__device__ __forceinline__ void mma_compute_stage(const uint16_t* stage,
                                                  float (&acc)[Cfg::kMI][Cfg::kNI][4],
                                                  int warp_m, int warp_n, int lane) {
  const uint16_t* sa = stage;
  const uint16_t* sb = stage + Cfg::kAElems;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBK; kk += 16) {
    uint32_t af[Cfg::kMI][4];
#pragma unroll
    for (int mi = 0; mi < Cfg::kMI; ++mi) {
      const int r = warp_m * Cfg::kMI * 16 + mi * 16 + (lane & 15);
      ldmatrix_x4(af[mi], sa + r * Cfg::kALd + kk + (lane >> 4) * 8);
    }
    uint32_t bf[Cfg::kNI][2];
#pragma unroll
    for (int p = 0; p < Cfg::kNI / 2; ++p) {
      // Matrix q = lane / 8 of the x4 load: q & 1 picks k 0-7 / 8-15, q >> 1
      // picks the n8 tile, so the registers come out as b0,b1 of tile 2p then
      // b0,b1 of tile 2p + 1.
      const int n_base = warp_n * Cfg::kNI * 8 + p * 16 + (lane >> 4) * 8;
      const int k_off = kk + ((lane >> 3) & 1) * 8;
      uint32_t r[4];
      if constexpr (kTransB) {
        ldmatrix_x4(r, sb + (n_base + (lane & 7)) * Cfg::kBLd + k_off);
      } else {
        ldmatrix_x4_trans(r, sb + (k_off + (lane & 7)) * Cfg::kBLd + n_base);
      }
      bf[2 * p][0] = r[0];
      bf[2 * p][1] = r[1];
      bf[2 * p + 1][0] = r[2];
      bf[2 * p + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < Cfg::kMI; ++mi) {
#pragma unroll
      for (int ni = 0; ni < Cfg::kNI; ++ni) Ops::mma(acc[mi][ni], af[mi], bf[ni]);
    }
  }
}

// Adds the bias in fp32, rounds to the element type and parks the tile in
// shared memory; clears the accumulators for the next tile.
template <typename Cfg, typename Ops>
__device__ __forceinline__ void mma_park_tile(uint16_t* park, float (&acc)[Cfg::kMI][Cfg::kNI][4],
                                              const WaveArgs<uint16_t>& a, int64_t col0,
                                              int warp_m, int warp_n, int lane) {
#pragma unroll
  for (int ni = 0; ni < Cfg::kNI; ++ni) {
    const int c = warp_n * Cfg::kNI * 8 + ni * 8 + (lane & 3) * 2;
    float b0 = 0.f, b1 = 0.f;
    if (a.bias != nullptr) {
      const int64_t gc = col0 + c;
      if (gc < a.n) b0 = Ops::to_float(a.bias[gc]);
      if (gc + 1 < a.n) b1 = Ops::to_float(a.bias[gc + 1]);
    }
#pragma unroll
    for (int mi = 0; mi < Cfg::kMI; ++mi) {
      const int r = warp_m * Cfg::kMI * 16 + mi * 16 + (lane >> 2);
      float(&v)[4] = acc[mi][ni];
      *reinterpret_cast<uint32_t*>(park + r * Cfg::kParkLd + c) = Ops::pack(v[0] + b0, v[1] + b1);
      *reinterpret_cast<uint32_t*>(park + (r + 8) * Cfg::kParkLd + c) =
          Ops::pack(v[2] + b0, v[3] + b1);
      v[0] = v[1] = v[2] = v[3] = 0.f;
    }
  }
}

// Copies a parked BM x BN tile over x, clipped to rows x n.
template <int BM, int BN, int kLd, int kVec, bool kAligned, typename E>
__device__ __forceinline__ void write_back_tile(E* x, const E* park, int64_t rows, int64_t n,
                                                int64_t row0, int64_t col0, int tid) {
  constexpr int kChunksPerRow = BN / kVec;
  for (int c = tid; c < BM * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, cc = (c % kChunksPerRow) * kVec;
    const int64_t gr = row0 + r, gc = col0 + cc;
    if (gr >= rows || gc >= n) continue;
    E* dst = x + gr * n + gc;
    const E* src = park + r * kLd + cc;
    if constexpr (kAligned) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (gc + e < n) dst[e] = src[e];
      }
    }
  }
}

template <typename Ops, int BM, bool kTransB, bool kAligned>
__global__ void __launch_bounds__(kThreads, 1) square_matmul_waves_mma_kernel(const WaveArgs<uint16_t> a) {
  using Cfg = MmaCfg<BM, kTransB>;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* stages = reinterpret_cast<uint16_t*>(smem);
  uint16_t* park = reinterpret_cast<uint16_t*>(smem + Cfg::kPipelineBytes);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN;
  const int k_steps = static_cast<int>((a.n + Cfg::kBK - 1) / Cfg::kBK);
  cg::grid_group grid = cg::this_grid();

  float acc[Cfg::kMI][Cfg::kNI][4];
#pragma unroll
  for (int mi = 0; mi < Cfg::kMI; ++mi)
#pragma unroll
    for (int ni = 0; ni < Cfg::kNI; ++ni) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.f;

  // The load side of the pipeline runs over this CTA's (tile, k-step)
  // sequence of a wave, so the next tile's first stages load while the
  // current one finishes; and the next wave's first stages load while the
  // grid waits at the barrier and writes back (those rows are disjoint from
  // the wave being written, and nobody writes them before the next barrier).
  WaveSlice ls{0, 0};  // the wave being loaded
  int load_tile = 0, load_k = 0;
  int64_t load_row0 = 0, load_col0 = 0;
  auto issue = [&](int stage) {
    if (load_tile < ls.count) {
      mma_load_stage<Cfg, kTransB, kAligned>(stages + stage * Cfg::kStageElems, a, load_row0,
                                             load_col0, static_cast<int64_t>(load_k) * Cfg::kBK,
                                             tid);
      if (++load_k == k_steps) {
        load_k = 0;
        if (++load_tile < ls.count)
          tile_origin(a, ls, load_tile, Cfg::kBM, Cfg::kBN, &load_row0, &load_col0);
      }
    }
    cp_async_commit();  // possibly empty, so wait_group counts stay in step
  };
  // Fills stages 0 .. kStages-2 with the first steps of `wave`; all stages
  // must be free (no warp still reading one).
  auto start_wave = [&](int64_t wave) {
    ls = wave_slice(a, wave);
    load_tile = 0;
    load_k = 0;
    if (ls.count > 0) tile_origin(a, ls, 0, Cfg::kBM, Cfg::kBN, &load_row0, &load_col0);
#pragma unroll
    for (int st = 0; st < Cfg::kStages - 1; ++st) issue(st);
  };

  if (a.waves > 0) start_wave(0);
  for (int64_t wave = 0; wave < a.waves; ++wave) {
    const WaveSlice s = ls;
    const int64_t steps = static_cast<int64_t>(s.count) * k_steps;
    int comp_tile = 0, comp_k = 0, stage = 0, next_stage = Cfg::kStages - 1;
    for (int64_t step = 0; step < steps; ++step) {
      cp_async_wait<Cfg::kStages - 2>();
      // Stage `stage` is visible to all, and every warp is done with the
      // stage consumed last step, which the next load overwrites.
      __syncthreads();
      issue(next_stage);
      next_stage = next_stage + 1 == Cfg::kStages ? 0 : next_stage + 1;
      mma_compute_stage<Cfg, kTransB, Ops>(stages + stage * Cfg::kStageElems, acc, warp_m,
                                           warp_n, lane);
      stage = stage + 1 == Cfg::kStages ? 0 : stage + 1;
      if (++comp_k == k_steps) {
        comp_k = 0;
        int64_t row0, col0;
        tile_origin(a, s, comp_tile, Cfg::kBM, Cfg::kBN, &row0, &col0);
        mma_park_tile<Cfg, Ops>(park + comp_tile * (Cfg::kBM * Cfg::kParkLd), acc, a, col0,
                                warp_m, warp_n, lane);
        ++comp_tile;
      }
    }
    cp_async_wait<0>();
    // Every warp is done with the stages (they may be refilled) and has
    // parked its results (the write-back reads other warps' results).
    __syncthreads();
    if (wave + 1 < a.waves) start_wave(wave + 1);
    // After this barrier every CTA has finished reading this wave's rows:
    // their cp.async copies completed before it, and it orders global memory.
    grid.sync();
    for (int j = 0; j < s.count; ++j) {
      int64_t row0, col0;
      tile_origin(a, s, j, Cfg::kBM, Cfg::kBN, &row0, &col0);
      write_back_tile<Cfg::kBM, Cfg::kBN, Cfg::kParkLd, 8, kAligned>(
          a.x, park + j * (Cfg::kBM * Cfg::kParkLd), a.rows, a.n, row0, col0, tid);
    }
    // The next wave parks over the tiles just copied out.
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------
// FFMA/DFMA tiles for fp32/fp64: BM = 16 * TM rows x 128 columns, 16 x 16
// threads, each TM x 8 outputs. A thread's rows are ty*RM + i%RM + (i/RM)*16*RM
// and its columns tx*4 + j%4 + (j/4)*64, so its shared reads are RM- and
// 4-wide vectors that a warp reads without bank conflicts. Global->shared
// through registers (double-buffered) because A (and B with transpose) are
// stored k-major in shared memory.
template <typename T>
struct Vec16;
template <>
struct Vec16<float> {
  static constexpr int kN = 4;
  static __device__ __forceinline__ void load(const float* p, float* o) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
  }
  static __device__ __forceinline__ void load_ro(const float* p, float* o) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
  }
  static __device__ __forceinline__ void store(float* p, const float* o) {
    *reinterpret_cast<float4*>(p) = make_float4(o[0], o[1], o[2], o[3]);
  }
};
template <>
struct Vec16<double> {
  static constexpr int kN = 2;
  static __device__ __forceinline__ void load(const double* p, double* o) {
    const double2 v = *reinterpret_cast<const double2*>(p);
    o[0] = v.x, o[1] = v.y;
  }
  static __device__ __forceinline__ void load_ro(const double* p, double* o) {
    const double2 v = __ldg(reinterpret_cast<const double2*>(p));
    o[0] = v.x, o[1] = v.y;
  }
  static __device__ __forceinline__ void store(double* p, const double* o) {
    *reinterpret_cast<double2*>(p) = make_double2(o[0], o[1]);
  }
};

// N consecutive elements at a 16-byte aligned shared address (N a multiple
// of the vector width), or one element.
template <typename T, int N>
__device__ __forceinline__ void smem_load(const T* p, T* o) {
  if constexpr (N % Vec16<T>::kN == 0) {
#pragma unroll
    for (int v = 0; v < N; v += Vec16<T>::kN) Vec16<T>::load(p + v, o + v);
  } else {
#pragma unroll
    for (int v = 0; v < N; ++v) o[v] = p[v];
  }
}
template <typename T, int N>
__device__ __forceinline__ void smem_store(T* p, const T* o) {
  if constexpr (N % Vec16<T>::kN == 0) {
#pragma unroll
    for (int v = 0; v < N; v += Vec16<T>::kN) Vec16<T>::store(p + v, o + v);
  } else {
#pragma unroll
    for (int v = 0; v < N; ++v) p[v] = o[v];
  }
}

template <typename T, int TM, bool kTransB>
struct SimtCfg {
  static constexpr int kVec = Vec16<T>::kN;
  static constexpr int kTN = 8, kRM = TM < 4 ? TM : 4;
  static constexpr int kBM = 16 * TM, kBN = 128, kBK = 8;
  // +kVec: the transposed stores of a warp spread over all banks, and rows
  // stay 16-byte aligned.
  static constexpr int kALd = kBM + kVec, kBLd = kBN + kVec;
  static constexpr int kAElems = kBK * kALd, kBElems = kBK * kBLd;
  static constexpr int kPipelineBytes = 2 * (kAElems + kBElems) * static_cast<int>(sizeof(T));
  static constexpr int kParkLd = kBN + kVec;
  static constexpr int kParkBytes = kBM * kParkLd * static_cast<int>(sizeof(T));
  static constexpr int kAChunks = kBM * kBK / kVec, kBChunks = kBK * kBN / kVec;
  static constexpr int kAIters = (kAChunks + kThreads - 1) / kThreads;
  static constexpr int kBIters = (kBChunks + kThreads - 1) / kThreads;
  static_assert(TM == 1 || TM == 4 || TM == 8, "row layout");
};

// kVec consecutive elements row[col..] into registers, zero past limit or
// when row is null.
template <typename T, bool kAligned, bool kReadOnly>
__device__ __forceinline__ void fetch_vec(const T* row, int64_t col, int64_t limit, T* o) {
  constexpr int kN = Vec16<T>::kN;
  if constexpr (kAligned) {
    if (row != nullptr && col < limit) {
      if constexpr (kReadOnly) {
        Vec16<T>::load_ro(row + col, o);
      } else {
        Vec16<T>::load(row + col, o);
      }
    } else {
#pragma unroll
      for (int e = 0; e < kN; ++e) o[e] = T(0);
    }
  } else {
#pragma unroll
    for (int e = 0; e < kN; ++e) o[e] = (row != nullptr && col + e < limit) ? row[col + e] : T(0);
  }
}

template <typename Cfg, bool kTransB, bool kAligned, typename T>
__device__ __forceinline__ void simt_fetch(const WaveArgs<T>& a, int64_t row0, int64_t col0,
                                           int64_t k0, int tid, T (&ra)[Cfg::kAIters][Cfg::kVec],
                                           T (&rb)[Cfg::kBIters][Cfg::kVec]) {
  constexpr int kV = Cfg::kVec;
#pragma unroll
  for (int it = 0; it < Cfg::kAIters; ++it) {
    const int c = it * kThreads + tid;
    if (Cfg::kAChunks % kThreads == 0 || c < Cfg::kAChunks) {
      const int r = c / (Cfg::kBK / kV), kq = (c % (Cfg::kBK / kV)) * kV;
      const int64_t gr = row0 + r;
      fetch_vec<T, kAligned, false>(gr < a.rows ? a.x + gr * a.n : nullptr, k0 + kq, a.n, ra[it]);
    }
  }
#pragma unroll
  for (int it = 0; it < Cfg::kBIters; ++it) {
    const int c = it * kThreads + tid;
    if (Cfg::kBChunks % kThreads == 0 || c < Cfg::kBChunks) {
      if constexpr (kTransB) {
        const int r = c / (Cfg::kBK / kV), kq = (c % (Cfg::kBK / kV)) * kV;
        const int64_t gj = col0 + r;
        fetch_vec<T, kAligned, true>(gj < a.n ? a.w + gj * a.n : nullptr, k0 + kq, a.n, rb[it]);
      } else {
        const int r = c / (Cfg::kBN / kV), nq = (c % (Cfg::kBN / kV)) * kV;
        const int64_t gk = k0 + r;
        fetch_vec<T, kAligned, true>(gk < a.n ? a.w + gk * a.n : nullptr, col0 + nq, a.n, rb[it]);
      }
    }
  }
}

// Registers -> shared: A (and B with transpose) transposed to k-major.
template <typename Cfg, bool kTransB, typename T>
__device__ __forceinline__ void simt_stash(T* sa, T* sb, int tid,
                                           const T (&ra)[Cfg::kAIters][Cfg::kVec],
                                           const T (&rb)[Cfg::kBIters][Cfg::kVec]) {
  constexpr int kV = Cfg::kVec;
#pragma unroll
  for (int it = 0; it < Cfg::kAIters; ++it) {
    const int c = it * kThreads + tid;
    if (Cfg::kAChunks % kThreads == 0 || c < Cfg::kAChunks) {
      const int r = c / (Cfg::kBK / kV), kq = (c % (Cfg::kBK / kV)) * kV;
#pragma unroll
      for (int e = 0; e < kV; ++e) sa[(kq + e) * Cfg::kALd + r] = ra[it][e];
    }
  }
#pragma unroll
  for (int it = 0; it < Cfg::kBIters; ++it) {
    const int c = it * kThreads + tid;
    if (Cfg::kBChunks % kThreads == 0 || c < Cfg::kBChunks) {
      if constexpr (kTransB) {
        const int r = c / (Cfg::kBK / kV), kq = (c % (Cfg::kBK / kV)) * kV;
#pragma unroll
        for (int e = 0; e < kV; ++e) sb[(kq + e) * Cfg::kBLd + r] = rb[it][e];
      } else {
        const int r = c / (Cfg::kBN / kV), nq = (c % (Cfg::kBN / kV)) * kV;
        smem_store<T, kV>(sb + r * Cfg::kBLd + nq, rb[it]);
      }
    }
  }
}

template <typename T, int TM, bool kTransB, bool kAligned>
__global__ void __launch_bounds__(kThreads, 1) square_matmul_waves_simt_kernel(const WaveArgs<T> a) {
  using Cfg = SimtCfg<T, TM, kTransB>;
  constexpr int kRM = Cfg::kRM, kTN = Cfg::kTN;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sa = reinterpret_cast<T*>(smem);  // [2][BK][kALd]
  T* sb = sa + 2 * Cfg::kAElems;       // [2][BK][kBLd]
  T* park = reinterpret_cast<T*>(smem + Cfg::kPipelineBytes);
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int k_steps = static_cast<int>((a.n + Cfg::kBK - 1) / Cfg::kBK);
  cg::grid_group grid = cg::this_grid();

  for (int64_t wave = 0; wave < a.waves; ++wave) {
    const WaveSlice s = wave_slice(a, wave);
    for (int j = 0; j < s.count; ++j) {
      int64_t row0, col0;
      tile_origin(a, s, j, Cfg::kBM, Cfg::kBN, &row0, &col0);
      T ra[Cfg::kAIters][Cfg::kVec], rb[Cfg::kBIters][Cfg::kVec];
      simt_fetch<Cfg, kTransB, kAligned>(a, row0, col0, 0, tid, ra, rb);
      simt_stash<Cfg, kTransB>(sa, sb, tid, ra, rb);
      __syncthreads();
      T acc[TM][kTN];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int jj = 0; jj < kTN; ++jj) acc[i][jj] = T(0);

      for (int kt = 0; kt < k_steps; ++kt) {
        const int buf = kt & 1;
        const bool more = kt + 1 < k_steps;
        if (more)
          simt_fetch<Cfg, kTransB, kAligned>(a, row0, col0,
                                             static_cast<int64_t>(kt + 1) * Cfg::kBK, tid, ra, rb);
        const T* ca = sa + buf * Cfg::kAElems;
        const T* cb = sb + buf * Cfg::kBElems;
#pragma unroll
        for (int k = 0; k < Cfg::kBK; ++k) {
          T av[TM], bv[kTN];
#pragma unroll
          for (int g = 0; g < TM / kRM; ++g)
            smem_load<T, kRM>(ca + k * Cfg::kALd + ty * kRM + g * 16 * kRM, av + g * kRM);
#pragma unroll
          for (int g = 0; g < 2; ++g)
            smem_load<T, 4>(cb + k * Cfg::kBLd + tx * 4 + g * 64, bv + g * 4);
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int jj = 0; jj < kTN; ++jj) acc[i][jj] += av[i] * bv[jj];
        }
        // The other buffer was last read in step kt - 1, before the barrier
        // that ended it.
        if (more)
          simt_stash<Cfg, kTransB>(sa + (buf ^ 1) * Cfg::kAElems, sb + (buf ^ 1) * Cfg::kBElems,
                                   tid, ra, rb);
        __syncthreads();
      }

      // Park: bias added before rounding (a no-op rounding for T itself).
      T* pk = park + j * (Cfg::kBM * Cfg::kParkLd);
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        const int c = tx * 4 + g * 64;
        T bias[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          bias[e] = (a.bias != nullptr && col0 + c + e < a.n) ? a.bias[col0 + c + e] : T(0);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          const int r = ty * kRM + i % kRM + (i / kRM) * 16 * kRM;
          T v[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) v[e] = acc[i][g * 4 + e] + bias[e];
          smem_store<T, 4>(pk + r * Cfg::kParkLd + c, v);
        }
      }
    }
    // Every thread has parked (the write-back copies other threads' results),
    // and after the grid barrier every CTA has finished reading this wave's
    // rows (their loads were consumed before it).
    __syncthreads();
    grid.sync();
    for (int j = 0; j < s.count; ++j) {
      int64_t row0, col0;
      tile_origin(a, s, j, Cfg::kBM, Cfg::kBN, &row0, &col0);
      write_back_tile<Cfg::kBM, Cfg::kBN, Cfg::kParkLd, Cfg::kVec, kAligned>(
          a.x, park + j * (Cfg::kBM * Cfg::kParkLd), a.rows, a.n, row0, col0, tid);
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------
// Host side.

// What one kernel instance can do on one device: how many CTAs are
// co-resident (0: cannot run cooperatively) and how many tiles each parks.
struct KernelInfo {
  int coresident = 0;
  int tiles_per_cta = 0;
  size_t smem = 0;
};

cudaError_t kernel_info(const void* func, int pipeline_bytes, int park_bytes, KernelInfo* out) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  static std::mutex mutex;
  static std::vector<std::pair<std::pair<int, const void*>, KernelInfo>> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  for (const auto& entry : cache) {
    if (entry.first.first == device && entry.first.second == func) {
      *out = entry.second;
      return cudaSuccess;
    }
  }
  int optin = 0, sms = 0, coop = 0;
  if ((err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess ||
      (err = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device)) != cudaSuccess)
    return err;
  KernelInfo info;
  // All shared memory the CTA can have goes to parking: the more tiles a
  // wave holds, the fewer grid barriers and the wider the rows it handles.
  const int tiles = (optin - pipeline_bytes) / park_bytes;
  if (coop != 0 && tiles >= 1) {
    const size_t smem = static_cast<size_t>(pipeline_bytes) + static_cast<size_t>(tiles) * park_bytes;
    if ((err = cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem))) != cudaSuccess)
      return err;
    int per_sm = 0;
    if ((err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, func, kThreads, smem)) !=
        cudaSuccess)
      return err;
    if (per_sm >= 1) info = {per_sm * sms, tiles, smem};
  }
  cache.push_back({{device, func}, info});
  *out = info;
  return cudaSuccess;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether a row-block of width n fits in one wave of this kernel.
bool fits(const KernelInfo& info, int64_t n, int bn) {
  return info.coresident > 0 &&
         ceil_div(n, bn) <= static_cast<int64_t>(info.coresident) * info.tiles_per_cta;
}

struct Plan {
  int grid;
  size_t smem;
};

// Fills the wave schedule of `args`; false when a row-block does not fit.
template <typename T>
bool make_plan(const KernelInfo& info, int bm, int bn, WaveArgs<T>* args, Plan* plan) {
  if (!fits(info, args->n, bn)) return false;
  const int64_t tiles_per_row = ceil_div(args->n, bn);
  const int64_t row_blocks = ceil_div(args->rows, bm);
  const int64_t grid = std::min<int64_t>(info.coresident, row_blocks * tiles_per_row);
  const int64_t max_per_wave = grid * info.tiles_per_cta / tiles_per_row;  // >= 1 as it fits
  // A wave lasts as long as its busiest CTA: ceil(tiles / grid) tiles. Pick
  // the row-blocks per wave that minimise the sum of that over the waves,
  // plus a small charge per wave for the barrier; ties go to fewer waves.
  int64_t per_wave = max_per_wave;
  double best = 0.0;
  for (int64_t b = max_per_wave; b >= 1; --b) {
    const int64_t full = row_blocks / b, rest = row_blocks % b;
    const double cost = static_cast<double>(full * ceil_div(b * tiles_per_row, grid) +
                                            ceil_div(rest * tiles_per_row, grid)) +
                        0.05 * static_cast<double>(full + (rest > 0));
    if (b == max_per_wave || cost < best) {
      best = cost;
      per_wave = b;
    }
  }
  args->row_blocks = row_blocks;
  args->blocks_per_wave = per_wave;
  args->waves = ceil_div(row_blocks, per_wave);
  args->tiles_per_row = tiles_per_row;
  args->tiles_per_cta = info.tiles_per_cta;
  *plan = {static_cast<int>(grid), info.smem};
  return true;
}

template <typename T>
cudaError_t launch(const void* func, const Plan& plan, WaveArgs<T> args, cudaStream_t stream) {
  void* params[] = {&args};
  return cudaLaunchCooperativeKernel(func, dim3(plan.grid), dim3(kThreads), params, plan.smem,
                                     stream);
}

// Tall tiles (big) for throughput; 16-row tiles (small) when rows are few or
// a row-block of tall tiles does not fit in one wave.
template <typename T>
cudaError_t launch_big_or_small(const void* big, int big_pipeline, int big_park, int big_bm,
                                const void* small, int small_pipeline, int small_park,
                                int small_bm, int bn, WaveArgs<T> args, cudaStream_t stream) {
  KernelInfo big_info, small_info;
  cudaError_t err = kernel_info(big, big_pipeline, big_park, &big_info);
  if (err == cudaSuccess) err = kernel_info(small, small_pipeline, small_park, &small_info);
  if (err != cudaSuccess) return err;
  Plan plan;
  if (args.rows > small_bm && make_plan(big_info, big_bm, bn, &args, &plan))
    return launch(big, plan, args, stream);
  if (make_plan(small_info, small_bm, bn, &args, &plan)) return launch(small, plan, args, stream);
  if (make_plan(big_info, big_bm, bn, &args, &plan)) return launch(big, plan, args, stream);
  return cudaErrorInvalidValue;
}

template <typename Ops, bool kTransB, bool kAligned>
cudaError_t run_mma(const WaveArgs<uint16_t>& args, cudaStream_t stream) {
  using Big = MmaCfg<128, kTransB>;
  using Small = MmaCfg<16, kTransB>;
  return launch_big_or_small(
      reinterpret_cast<const void*>(&square_matmul_waves_mma_kernel<Ops, 128, kTransB, kAligned>),
      Big::kPipelineBytes, Big::kParkBytes, Big::kBM,
      reinterpret_cast<const void*>(&square_matmul_waves_mma_kernel<Ops, 16, kTransB, kAligned>),
      Small::kPipelineBytes, Small::kParkBytes, Small::kBM, Big::kBN, args, stream);
}

// fp32: 128-row tiles; fp64: 64-row tiles (the accumulators of a 128-row
// double tile would not fit in registers).
template <typename T>
constexpr int simt_big_tm() {
  return sizeof(T) == 4 ? 8 : 4;
}

template <typename T, bool kTransB, bool kAligned>
cudaError_t run_simt(const WaveArgs<T>& args, cudaStream_t stream) {
  using Big = SimtCfg<T, simt_big_tm<T>(), kTransB>;
  using Small = SimtCfg<T, 1, kTransB>;
  return launch_big_or_small(
      reinterpret_cast<const void*>(&square_matmul_waves_simt_kernel<T, simt_big_tm<T>(), kTransB, kAligned>),
      Big::kPipelineBytes, Big::kParkBytes, Big::kBM,
      reinterpret_cast<const void*>(&square_matmul_waves_simt_kernel<T, 1, kTransB, kAligned>),
      Small::kPipelineBytes, Small::kParkBytes, Small::kBM, Big::kBN, args, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
WaveArgs<T> base_args(void* x, const void* w, const void* bias, int64_t rows, int64_t n) {
  WaveArgs<T> a{};
  a.x = static_cast<T*>(x);
  a.w = static_cast<const T*>(w);
  a.bias = static_cast<const T*>(bias);
  a.rows = rows;
  a.n = n;
  return a;
}

template <typename Ops>
cudaError_t dispatch_mma(void* x, const void* w, const void* bias, int64_t rows, int64_t n,
                         bool transpose, cudaStream_t stream) {
  const WaveArgs<uint16_t> a = base_args<uint16_t>(x, w, bias, rows, n);
  const bool aligned = n % 8 == 0 && aligned16(x) && aligned16(w);
  if (transpose)
    return aligned ? run_mma<Ops, true, true>(a, stream) : run_mma<Ops, true, false>(a, stream);
  return aligned ? run_mma<Ops, false, true>(a, stream) : run_mma<Ops, false, false>(a, stream);
}

template <typename T>
cudaError_t dispatch_simt(void* x, const void* w, const void* bias, int64_t rows, int64_t n,
                          bool transpose, cudaStream_t stream) {
  const WaveArgs<T> a = base_args<T>(x, w, bias, rows, n);
  const bool aligned = n % Vec16<T>::kN == 0 && aligned16(x) && aligned16(w);
  if (transpose)
    return aligned ? run_simt<T, true, true>(a, stream) : run_simt<T, true, false>(a, stream);
  return aligned ? run_simt<T, false, true>(a, stream) : run_simt<T, false, false>(a, stream);
}

// The widest n a 16-row kernel takes (they hold the widest rows): a row-block
// of ceil(n / BN) tiles must fit in one wave. 0 when it cannot run.
template <typename Cfg, typename K>
int64_t small_max_width(K kernel) {
  KernelInfo info;
  if (kernel_info(reinterpret_cast<const void*>(kernel), Cfg::kPipelineBytes, Cfg::kParkBytes, &info) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(info.coresident) * info.tiles_per_cta * Cfg::kBN;
}

// Every variant the launch may pick (either layout, aligned or not) must take n.
template <typename Ops>
int64_t mma_max_width() {
  return std::min({small_max_width<MmaCfg<16, false>>(&square_matmul_waves_mma_kernel<Ops, 16, false, false>),
                   small_max_width<MmaCfg<16, false>>(&square_matmul_waves_mma_kernel<Ops, 16, false, true>),
                   small_max_width<MmaCfg<16, true>>(&square_matmul_waves_mma_kernel<Ops, 16, true, false>),
                   small_max_width<MmaCfg<16, true>>(&square_matmul_waves_mma_kernel<Ops, 16, true, true>)});
}

template <typename T>
int64_t simt_max_width() {
  return std::min({small_max_width<SimtCfg<T, 1, false>>(&square_matmul_waves_simt_kernel<T, 1, false, false>),
                   small_max_width<SimtCfg<T, 1, false>>(&square_matmul_waves_simt_kernel<T, 1, false, true>),
                   small_max_width<SimtCfg<T, 1, true>>(&square_matmul_waves_simt_kernel<T, 1, true, false>),
                   small_max_width<SimtCfg<T, 1, true>>(&square_matmul_waves_simt_kernel<T, 1, true, true>)});
}

}  // namespace

int64_t square_matmul_waves_max_width(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::kBFloat16: return mma_max_width<Bf16Ops>();
    case ScalarKind::kFloat16: return mma_max_width<Fp16Ops>();
    case ScalarKind::kFloat32: return simt_max_width<float>();
    case ScalarKind::kFloat64: return simt_max_width<double>();
  }
  return 0;
}

cudaError_t square_matmul_waves(ScalarKind kind, void* x, const void* w, const void* bias, int64_t rows,
                                int64_t n, bool transpose, cudaStream_t stream) {
  if (rows < 0 || n < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  switch (kind) {
    case ScalarKind::kBFloat16:
      return dispatch_mma<Bf16Ops>(x, w, bias, rows, n, transpose, stream);
    case ScalarKind::kFloat16:
      return dispatch_mma<Fp16Ops>(x, w, bias, rows, n, transpose, stream);
    case ScalarKind::kFloat32:
      return dispatch_simt<float>(x, w, bias, rows, n, transpose, stream);
    case ScalarKind::kFloat64:
      return dispatch_simt<double>(x, w, bias, rows, n, transpose, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace make_inplace::kernels
