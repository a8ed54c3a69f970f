#pragma once
// What the Hopper (sm_90a) square matmul kernels for 16-bit types share: TMA
// loads and stores, wgmma.m64n{256,192}k16 with its shared-memory descriptors, the
// rounding of a warpgroup's accumulators into a 128-byte-swizzled tile, and
// the tensor maps x and w are reached through. Device code exists only in
// sm_90a passes; callers guard their use the same way.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "make_inplace/kernels/packed_rows.cuh"
#include "make_inplace/kernels/scalar_kind.h"
#include "make_inplace/kernels/sm90_sync.cuh"

namespace make_inplace::kernels::wgmma_sm90 {

constexpr int kBK = 64;                        // k-step: 64 16-bit elements, one 128-byte swizzle row
constexpr int kBoxCols = 64;                   // 128 bytes: the TMA box width along a row
constexpr int kWBoxBytes = kBK * kBoxCols * 2; // a 64 x 64 box of w (no transpose), 8 KiB

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

using rowwise::pack_pair;
using sm90::shared_address;

__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(col), "r"(row)
      : "memory");
}

// Brings one box of the map into L2: no shared memory, no barrier.
__device__ __forceinline__ void tma_prefetch(const CUtensorMap* map, int col, int row) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row)
               : "memory");
}

__device__ __forceinline__ void tma_store(const CUtensorMap* map, const void* src, int col, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(shared_address(src)), "r"(col), "r"(row)
               : "memory");
}

// A shared-memory matrix descriptor with the 128-byte swizzle (PTX ISA,
// "Matrix Descriptor Format"): start address, leading and stride byte offsets.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t leading, uint32_t stride) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>(leading >> 4) << 16 |
         static_cast<uint64_t>(stride >> 4) << 32 | uint64_t{1} << 62;
}

// wgmma's accumulator registers: 96 for n = 192, 128 for n = 256.
#define MI_WGMMA_ACC_REGS_96 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define MI_WGMMA_ACC_REGS_128 MI_WGMMA_ACC_REGS_96 ", " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

#define MI_WGMMA_ACC_OPERANDS_96(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define MI_WGMMA_ACC_OPERANDS_128(d) MI_WGMMA_ACC_OPERANDS_96(d), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// d (+)= A[64 x 16] * B[16 x N]; A K-major, B K-major (kTransB = 0) or
// N-major (kTransB = 1); accumulate = 0 overwrites d. The operands after the
// accumulators: a, b, accumulate, kTransB.
#define MI_WGMMA_M64NK16(shape, type, regs, a, b, acc, tr)                                  \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " acc ", 0;\n"                                           \
  "wgmma.mma_async.sync.aligned." shape ".f32." type "." type " {" regs "}, " a ", " b ", p, 1, 1, 0, " tr ";\n}\n"
#define MI_WGMMA_N192(type) MI_WGMMA_M64NK16("m64n192k16", type, MI_WGMMA_ACC_REGS_96, "%96", "%97", "%98", "%99")
#define MI_WGMMA_N256(type) MI_WGMMA_M64NK16("m64n256k16", type, MI_WGMMA_ACC_REGS_128, "%128", "%129", "%130", "%131")

// One wgmma of a warpgroup's 64 x N results, N = 256 (128 accumulators) or
// 192 (96).
template <typename Elem, int kTransB, int kAcc>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[kAcc], uint64_t a, uint64_t b, int accumulate) {
  static_assert(kAcc == 96 || kAcc == 128, "wgmma tiles of 192 or 256 columns");
  constexpr bool kBf16 = std::is_same_v<Elem, __nv_bfloat16>;
  if constexpr (kAcc == 128 && kBf16) {
    asm volatile(MI_WGMMA_N256("bf16") : MI_WGMMA_ACC_OPERANDS_128(d) : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB));
  } else if constexpr (kAcc == 128) {
    asm volatile(MI_WGMMA_N256("f16") : MI_WGMMA_ACC_OPERANDS_128(d) : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB));
  } else if constexpr (kBf16) {
    asm volatile(MI_WGMMA_N192("bf16") : MI_WGMMA_ACC_OPERANDS_96(d) : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB));
  } else {
    asm volatile(MI_WGMMA_N192("f16") : MI_WGMMA_ACC_OPERANDS_96(d) : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB));
  }
}

#undef MI_WGMMA_N192
#undef MI_WGMMA_N256
#undef MI_WGMMA_M64NK16
#undef MI_WGMMA_ACC_REGS_96
#undef MI_WGMMA_ACC_REGS_128
#undef MI_WGMMA_ACC_OPERANDS_96
#undef MI_WGMMA_ACC_OPERANDS_128

// One 64-deep k-step of a warpgroup's 64 x N results (N = 2 kAcc), committed
// as one wgmma group: the x rows at a_tile (64 x 64, K-major), w at w_tile (an
// N x 64 K-major box, or N / 64 N-major boxes of 64 x 64, kWBoxBytes apart).
// K-major operands step 16 elements (32 bytes) inside the swizzled row,
// 8-row groups 1024 bytes apart; the N-major w steps 16 rows of 128 bytes.
// accumulate = false starts the sums over.
template <typename Elem, bool kWeightKMajor, int kAcc>
__device__ __forceinline__ void wgmma_k_step(float (&acc)[kAcc], uint32_t a_tile, uint32_t w_tile, bool accumulate) {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    const uint64_t a_desc = smem_desc(a_tile + kk * 32, 16, 1024);
    const uint64_t w_desc = kWeightKMajor ? smem_desc(w_tile + kk * 32, 16, 1024)
                                          : smem_desc(w_tile + kk * 2048, kWBoxBytes, 1024);
    wgmma_m64k16<Elem, kWeightKMajor ? 0 : 1>(acc, a_desc, w_desc, accumulate || kk != 0);
  }
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Where a ring of shared-memory stages stands: the stage to use next and the
// parity of its current phase.
template <int kStages>
struct StageRing {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
};

// Shared-memory addresses of a k-step's x rows and w columns for a warpgroup.
struct StepTiles {
  uint32_t a, w;
};

// A warpgroup's k_tiles k-steps of one 64 x N result (acc zeroed first):
// waits for each stage to be full, and frees the one before once its wgmmas
// are done (an arrive per warp on empty). Returns the last stage, its
// wgmmas complete and still held: the caller frees or keeps it.
// tiles(stage) gives the stage's StepTiles.
template <typename Elem, bool kWeightKMajor, int kStages, typename Tiles, int kAcc>
__device__ __forceinline__ int run_k_steps(float (&acc)[kAcc], StageRing<kStages>& ring, uint64_t* full,
                                           uint64_t* empty, int k_tiles, int lane, Tiles tiles) {
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  int previous = 0;
  for (int kt = 0; kt < k_tiles; ++kt) {
    sm90::mbar_wait(&full[ring.stage], ring.phase);
    const StepTiles t = tiles(ring.stage);
    wgmma_k_step<Elem, kWeightKMajor>(acc, t.a, t.w, kt != 0);
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    if (kt > 0 && lane == 0) sm90::mbar_arrive(&empty[previous]);
    previous = ring.stage;
    ring.advance();
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  return previous;
}

// A 16-bit value's bits (the low half of `bits`) as float.
__device__ __forceinline__ float bits_to_acc(__nv_bfloat16, uint32_t bits) { return __uint_as_float(bits << 16); }
__device__ __forceinline__ float bits_to_acc(__half, uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// The bias of the columns a lane holds in a 64 x N accumulator tile starting at
// column col0 (wgmma's layout, below): columns 8g + 2(lane%4) + {0, 1} as one
// 16-bit pair per column group g; 0 (+0.0) past n. Loaded ahead of the tile's
// park, so that the park waits on no global load.
template <int kGroups>
__device__ __forceinline__ void load_bias_bits(const void* bias, int64_t col0, int n, int lane,
                                               uint32_t (&bits)[kGroups]) {
  const auto* b = static_cast<const unsigned short*>(bias);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int64_t col = col0 + g * 8 + (lane % 4) * 2;  // n % 8 == 0: col < n covers col + 1
    bits[g] = col < n ? b[col] | static_cast<uint32_t>(b[col + 1]) << 16 : 0u;
  }
}

// Rounds a warpgroup's 64 x N accumulators (plus the bias in fp32, from
// load_bias_bits) into rows row0 .. row0 + 63 of a parked tile, in the
// 128-byte-swizzled layout of the N / 64 kBoxRows x 64 TMA boxes that store
// it. wgmma's accumulator layout: register 4i + {0, 1} holds row warp*16 +
// lane/4, columns 8i + 2(lane%4) + {0, 1}; 4i + {2, 3} the same columns 8 rows
// down. That is stmatrix's 8 x 8 fragment layout, so one stmatrix.x4 writes
// column groups i and i + 1 of the warp's 16 rows (a quarter of the
// instructions 4-byte stores take).
template <typename Elem, bool kBias, int kBoxRows, int kAcc>
__device__ __forceinline__ void park_tile(const float (&acc)[kAcc], uint8_t* tile,
                                          const uint32_t (&bias_bits)[kAcc / 4], int row0, int warp, int lane) {
  // Lane l addresses row l % 8 of matrix l / 8: matrices 0 and 1 are the top
  // and bottom 8 rows of group i, 2 and 3 those of group i + 1.
  const int matrix = lane / 8;
  const int row = row0 + warp * 16 + (matrix & 1) * 8 + lane % 8;
  const uint32_t row_base = shared_address(tile) + row * 128;
#pragma unroll
  for (int i = 0; i < kAcc / 4; i += 2) {
    float b[4] = {0.f, 0.f, 0.f, 0.f};  // columns of groups i and i + 1 this lane holds
    if constexpr (kBias) {
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        b[2 * g] = bits_to_acc(Elem{}, bias_bits[i + g] & 0xffffu);
        b[2 * g + 1] = bits_to_acc(Elem{}, bias_bits[i + g] >> 16);
      }
    }
    // Without a bias the sums are skipped (x + 0.f is not free: it turns -0 into +0).
    const auto at_col = [&](int r, int g) { return kBias ? acc[r] + b[g] : acc[r]; };
    const int group = i + (matrix >> 1);
    // 16-byte chunk (group % 8) of a 128-byte row, XOR-swizzled by the row.
    const uint32_t at = row_base + (group / 8) * (kBoxRows * 128) + (((group % 8) ^ (row % 8)) * 16);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(at),
                 "r"(pack_pair(Elem{}, at_col(4 * i, 0), at_col(4 * i + 1, 1))),
                 "r"(pack_pair(Elem{}, at_col(4 * i + 2, 0), at_col(4 * i + 3, 1))),
                 "r"(pack_pair(Elem{}, at_col(4 * i + 4, 2), at_col(4 * i + 5, 3))),
                 "r"(pack_pair(Elem{}, at_col(4 * i + 6, 2), at_col(4 * i + 7, 3)))
                 : "memory");
  }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

// The driver's tensor-map encoder, through the runtime (no libcuda link).
inline EncodeTiled tensor_map_encoder() {
  static const EncodeTiled fn = []() -> EncodeTiled {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                             cudaEnableDefault, &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A row-major rows x cols matrix of 16-bit elements read or written in
// box_rows x 64 boxes with the 128-byte swizzle; zeros past the edges.
inline bool encode_map(CUtensorMap* map, ScalarKind kind, const void* base, uint64_t rows, uint64_t cols,
                uint32_t box_rows) {
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * 2};
  const cuuint32_t box[2] = {kBoxCols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const auto type = kind == ScalarKind::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return tensor_map_encoder()(map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace make_inplace::kernels::wgmma_sm90
