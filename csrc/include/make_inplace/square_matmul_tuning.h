#pragma once
// square_matmul_'s tuning constants and the allocator facts its workspace
// plan relies on, all in one place. The measurements behind each value are in
// docs/square_matmul.md; the policy that uses them in square_matmul_route.h.
#include <cstdint>

namespace make_inplace::square_matmul {

constexpr int64_t kMiB = int64_t{1} << 20;

// ---- The workspace bound (workspace_bytes=None)
constexpr int64_t kDefaultWorkspaceCap = 64 * kMiB;  // at most 64 MiB ...
constexpr int64_t kDefaultWorkspaceFraction = 16;    // ... and at most 1/16 of x

// ---- CUDA caching allocator facts (c10 AllocatorConfig.h: kSmallSize,
// kSmallBuffer, kMinLargeAlloc, kLargeBuffer, kRoundLarge). Requests up to
// 1 MiB share 2 MiB segments, 1-10 MiB requests get a 20 MiB segment, and from
// 10 MiB up requests are rounded to 2 MiB. The workspace plan keeps the memory
// *reserved* on a cold allocator within the bound.
constexpr int64_t kSmallBlockBytes = kMiB;        // the largest small-pool request
constexpr int64_t kSmallSegmentBytes = 2 * kMiB;  // what the small pool reserves at once
constexpr int64_t kOneBufferMinBound = 10 * kMiB; // from here one buffer stays within the bound ...
constexpr int64_t kLargeRoundBytes = 2 * kMiB;    // ... when rounded down to 2 MiB
// Block 0 of the small blocks keeps cuBLAS's device pointer arrays in its
// last bytes (an allocation of their own would cost a segment).
constexpr int64_t kPointerTailBytes = 4096;
// Workspace blocks of one panel (the copy kernel takes them by value).
constexpr int kMaxPanelBlocks = 32;

// ---- Routing thresholds (H100 measurements, docs/square_matmul.md)
// A panel needs this many 128 x 128 result tiles for cuBLAS to fill the GPU.
constexpr int64_t kMinPanelTiles = 96;
// The waves kernel's speed as a share of cuBLAS's: small-block panels that keep
// a smaller share of cuBLAS's 128-row tiles busy lose to it.
constexpr double kWavesShareOfCublas16Bit = 0.3;
constexpr double kWavesShareOfCublasOther = 0.5;
// From this width up to 512, in whole 64-column k-steps, the 64-row wgmma
// kernel (one CTA per row-block) beats the 128-row groups; narrower rows
// leave its second warpgroup mostly idle, and a partial k-step was slower.
constexpr int64_t kWgmmaRowsMinN = 448;
constexpr int64_t kWgmmaRowsStepN = 64;
// The wgmma plans (tile width 256 or 192, one or two tiles a CTA, clusters
// or counted groups) are weighed by their rounds of row-blocks, each costing
// this many 64-deep k-steps of one 256-column tile (the pipeline's fill and
// the epilogue) plus the k-steps of its tiles. Fitted on an H100 to 38
// measured cases (19 shapes, both modes): it takes the fastest plan, or one
// within 3%, at 36 of them; 0.5-1.5 fit as well (docs/square_matmul.md).
constexpr double kWgmmaRoundOverheadKSteps = 1.0;
// Up to this many column tiles a wgmma CTA in a cluster may compute one
// tile; wider rows take two (clusters half as large pack the GPCs better).
constexpr int64_t kWgmmaOneTileMaxColTiles = 8;
// The FFMA kernel needs this many rows, one whole row-block, to beat the
// waves kernel (whose row-blocks are 16 rows or fewer): on an H200 one row of
// 1024 took 0.104 ms against 0.063, 128 rows 0.106 against 0.135.
constexpr int64_t kFfmaMinRows = 128;
// An FFMA CTA computes two tiles where their rounds of row-blocks, at this
// cost each, come to no more than one tile's. Ties go to two: an H100 sweep
// found two tiles as fast or faster at all seven tied shapes it ran
// (docs/square_matmul.md).
constexpr double kFfmaTwoTileRoundCost = 2.0;
// From this width fp32 keeps cuBLAS's panels when their buffer is contiguous.
constexpr int64_t kFfmaPanelsFromN = 4096;
// CPU: panels of fewer rows lose to the row kernel (GEMM threading overhead).
constexpr int64_t kCpuMinPanelRows = 128;
// CPU: float32 and float16 up to this width take the row kernel whatever the
// bound (2 threads, AVX-512: 1.45-2.25x MKL's panels at n = 64-1024, 0.47x at
// 2048); bfloat16 keeps panels, where oneDNN is about twice the row kernel.
// On Intel CPUs float32 also needs w to fit one core's L2: the row kernel
// repacks w for every panel of 16-64 rows, which streams it from L3 once it
// does not, and MKL runs near the FMA peak there (2 MiB L2, MKL at 215
// GFLOP/s: rows 0.41-0.62x at n = 768 and 1024, panels 0.83-0.93x;
// docs/notes/cpu_kernels.md).
constexpr int64_t kCpuRowsUpToWidth = 1024;

}  // namespace make_inplace::square_matmul
