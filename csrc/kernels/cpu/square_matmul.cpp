// The torch-free CPU in-place square matmul (see the header): x <- x @ w
// (+ bias), or x @ w^T, without a workspace.
//
// Each thread takes a chunk of rows and walks it in panels of R rows: the
// panel is copied (as float) to a stack buffer, after which its rows in x are
// free to receive results. The copy interleaves each group of MR rows
// (element k of row r at k * MR + r, through register transposes), so the
// micro-tile reads its broadcasts from one stream. The product is then a
// small GEMM against the copy, blocked as in GotoBLAS: for each NR-column
// tile and KC-deep slice of w, the slice is packed (a copy, or a register
// transpose for w^T) into a stack buffer that stays in L1, and an MR x NR
// register tile of results accumulates over it. Slices past the first add
// to a float tile on the stack; the last one adds the bias and writes x.
// Half types compute in float32; bfloat16 rows of even width on AVX-512 CPUs
// with AVX512-BF16 keep pairs of k as 32-bit words in the copy and the packed
// slices and multiply them with vdpbf16ps (micro_tile_pairs), twice the
// multiply-adds of float32 FMAs. float64 keeps a plain double loop. The
// stack holds the panel + a slice + the partial tile: about 140 KiB, or 1.5
// MiB for a tall panel with all of w packed, on a thread whose stack has that
// much room to spare (on the heap where not even the first fits). Only rows
// wider than kPanelBytes / 4 elements (float64: kStackDoubles) take one heap
// row buffer per chunk instead. float32 rows of at most 64 elements skip the
// panel on AVX-512: each group of rows fits in registers whole (RegisterRows).
#include "make_inplace/kernels/square_matmul.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu_rows.h"
#include "cpu_stack.h"
#include "make_inplace/kernels/cpu_facts.h"
#include "make_inplace/kernels/cpu_parallel.h"

namespace make_inplace::kernels {
namespace {

// Rows in registers (MR) and vectors per row (NV, NR = NV * width) of the
// result tile: 16-24 accumulators plus the loaded w vectors fit the register
// file of each target. MR is at most the vector width where the width is
// above one (the interleaving copy transposes W x W blocks). kNarrowRows:
// the tile height for rows narrower than kTallTileFromWidth, where the copy
// weighs more against the product than a taller tile saves.
template <typename V>
struct Tile {
  static constexpr int kRows = 8, kNarrowRows = 8, kVecs = 2;
};
template <>
struct Tile<cpu::VecPortable> {
  static constexpr int kRows = 4, kNarrowRows = 4, kVecs = 4;
};
#if MAKE_INPLACE_CPU_X86
template <>
struct Tile<cpu::VecAvx2> {
  static constexpr int kRows = 6, kNarrowRows = 6, kVecs = 2;
};
template <>
struct Tile<cpu::VecAvx512> {
  static constexpr int kRows = 12, kNarrowRows = 8, kVecs = 2;
};
#endif
constexpr int64_t kTallTileFromWidth = 256;

constexpr int64_t kPanelBytes = 96 * 1024;       // the copied rows (float) on any thread
constexpr int64_t kTallPanelBytes = 384 * 1024;  // ... where the thread's stack has room
constexpr int64_t kStackMargin = 64 * 1024;      // left for the frames the kernel calls
constexpr int64_t kKc = 256;                     // depth of a packed slice of w
constexpr int64_t kPackedWFloats = 512 * 512;    // all of w packed, with a tall panel
constexpr int64_t kMaxNr = 32;                   // widest tile (AVX-512: 2 x 16)

// Most panel rows when n > kKc: the partial tile's height.
constexpr int64_t panel_rows_sliced(int64_t panel_bytes) { return panel_bytes / (4 * (kKc + 1)); }

struct Call {
  void* x;
  const void* w;
  const void* bias;
  int64_t n;
  bool transpose;
};

// acc[r][v] += a(k, r) * b[k * NR + v * W + lane] over k < kc (a: element k
// of row r of the group, b: the packed slice). The accumulators are copied to
// a local array whose address never escapes, so the compiler keeps all of
// them in registers across the k loop.
template <typename V, int MR, int NV, typename A>
inline void micro_tile(const A& a, const float* b, int64_t kc, V (&acc)[MR][NV]) {
  constexpr int64_t W = V::kWidth, NR = NV * W;
  V c[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[r][v] = acc[r][v];
  for (int64_t k = 0; k < kc; ++k) {
    V bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = V::load(b + k * NR + v * W);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const V av = V::broadcast(a(k, r));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = V::fma(av, bv[v], c[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = c[r][v];
}

#if MAKE_INPLACE_CPU_X86
#define MAKE_INPLACE_TARGET_AVX512_BF16 \
  __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

// micro_tile for bfloat16 with hardware dot products (AVX512-BF16): a and b
// hold pairs of k as 32-bit words (a: pair p of row r at p * MR + r; b: pair
// p of column c at p * NR + c), and one vdpbf16ps adds both products of a
// pair to each lane, twice the multiply-adds of an FMA at the same rate.
template <int MR, int NV>
MAKE_INPLACE_TARGET_AVX512_BF16 inline void micro_tile_pairs(const uint32_t* a, const uint32_t* b, int64_t kc2,
                                                             cpu::VecAvx512 (&acc)[MR][NV]) {
  constexpr int64_t NR = NV * 16;
  __m512 c[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[r][v] = acc[r][v].v;
  for (int64_t p = 0; p < kc2; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + p * NR + v * 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[p * MR + r]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v].v = c[r][v];
}

// slice[p][c] = (w[k0 + 2p][j0 + c], w[k0 + 2p + 1][j0 + c]) as one 32-bit
// word, for p < kc2 and c < NR (0 past `cols`): the two rows' columns
// interleaved by one two-source 16-bit permute per 16 columns.
template <int NV>
MAKE_INPLACE_TARGET_AVX512_BF16 inline void pack_pairs(const c10::BFloat16* w, int64_t n, int64_t j0, int64_t cols,
                                                       int64_t k0, int64_t kc2, uint32_t* slice) {
  constexpr int64_t NR = NV * 16;
  alignas(64) static constexpr short kIdx[2][32] = {
      {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
      {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
       24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};
  const __mmask32 live = cols >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << cols) - 1);
  for (int64_t p = 0; p < kc2; ++p) {
    const c10::BFloat16* r0 = w + (k0 + 2 * p) * n + j0;
    const __m512i lo = _mm512_maskz_loadu_epi16(live, r0);
    const __m512i hi = _mm512_maskz_loadu_epi16(live, r0 + n);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const __m512i idx = _mm512_load_si512(kIdx[v]);
      _mm512_storeu_si512(slice + p * NR + v * 16, _mm512_permutex2var_epi16(lo, idx, hi));
    }
  }
}
#endif

// A panel of PB bytes of copied rows with its packed slice of w and partial
// tile: on the stack where it fits, else (threads with small stacks) on the
// heap. The tall panel's buffers also hold all of w packed (n <= 512), so a
// thread packs w once per call instead of once per panel.
template <int64_t PB>
struct Buffers {
  static constexpr int64_t kPanelFloats = PB / 4;
  static constexpr int64_t kPackedFloats = PB == kTallPanelBytes ? kPackedWFloats : 1;
  alignas(64) float panel[kPanelFloats];
  alignas(64) float slice[kKc * kMaxNr];
  alignas(64) float partial[panel_rows_sliced(PB) * kMaxNr];
  alignas(64) float packed[kPackedFloats];
};

template <typename T>
struct PanelKernel {
  // Panel rows: as many as the buffer holds. Rows so wide that fewer than MR
  // fit take a shorter register tile; wider than the whole buffer, one row at
  // a time from the heap.
  // PAIRS (bfloat16, even n, AVX512-BF16): the copy and the packed slices
  // hold pairs of k as 32-bit words, and the micro-tile is micro_tile_pairs.
  template <typename V, bool PAIRS, int64_t PB>
  static void run(const Call* c, int64_t begin, int64_t end, Buffers<PB>& b) {
    constexpr int MR = Tile<V>::kRows, NARROW = Tile<V>::kNarrowRows;
    const int64_t fit = PB / (4 * depth<PAIRS>(c->n));
    if (MR != NARROW && c->n < kTallTileFromWidth) {
      return run_panels<V, NARROW, PAIRS>(c, begin, end, fit / NARROW * NARROW, b);
    }
    if (fit >= MR) return run_panels<V, MR, PAIRS>(c, begin, end, fit / MR * MR, b);
    if (fit >= 4) return run_panels<V, 4, PAIRS>(c, begin, end, fit / 4 * 4, b);
    if (fit >= 2) return run_panels<V, 2, PAIRS>(c, begin, end, fit / 2 * 2, b);
    run_panels<V, 1, PAIRS>(c, begin, end, 1, b);
  }

  // 32-bit entries of k in a row of the copy: n, or n / 2 pairs.
  template <bool PAIRS>
  static constexpr int64_t depth(int64_t n) { return PAIRS ? n / 2 : n; }

  template <typename V, int MR, bool PAIRS, int64_t PB>
  static void run_panels(const Call* c, int64_t begin, int64_t end, int64_t panel_rows, Buffers<PB>& b) {
    constexpr int NV = Tile<V>::kVecs;
    constexpr int64_t W = V::kWidth, NR = NV * W;
    static_assert(NR <= kMaxNr, "tile wider than the partial-sum buffer");
    const int64_t n = c->n, d = depth<PAIRS>(n);
    T* x = static_cast<T*>(c->x);
    const T* w = static_cast<const T*>(c->w);
    const T* bias = static_cast<const T*>(c->bias);

    std::vector<float> heap_panel;
    float* panel = b.panel;
    if (panel_rows * d > Buffers<PB>::kPanelFloats) {
      heap_panel.resize(static_cast<size_t>(panel_rows * d));
      panel = heap_panel.data();
    }
    float* const slice = b.slice;
    float* const partial = b.partial;
    if (d > kKc) std::fill(partial, partial + panel_rows * NR, 0.f);  // read only past the first slice
    const float* packed = nullptr;
    if constexpr (Buffers<PB>::kPackedFloats > 1) {
      if (Buffers<PB>::kPackedFloats >= d * ((n + W - 1) / W * W) && end - begin > panel_rows) {
        for (int64_t j0 = 0; j0 < n; j0 += NR) {
          const int64_t cols = std::min(NR, n - j0);
          if (NV > 1 && cols <= W) {
            pack<V, 1, PAIRS>(w, n, j0, cols, 0, d, c->transpose, b.packed + j0 * d);
          } else {
            pack<V, NV, PAIRS>(w, n, j0, cols, 0, d, c->transpose, b.packed + j0 * d);
          }
        }
        packed = b.packed;
      }
    }

    for (int64_t p0 = begin; p0 < end; p0 += panel_rows) {
      const int64_t rows = std::min(panel_rows, end - p0);
      const int64_t padded = (rows + MR - 1) / MR * MR;  // <= panel_rows, a multiple of MR
      // The pad rows of the last group read as zeros.
      for (int64_t g = 0; g < padded; g += MR) {
        const int64_t live = std::min<int64_t>(MR, rows - g);
        if constexpr (PAIRS) {  // pairs move as 32-bit words, through the float copy's transposes
          PanelKernel<float>::copy_group<V, MR>(reinterpret_cast<const float*>(x + (p0 + g) * n), d, live,
                                                panel + g * d);
        } else {
          copy_group<V, MR>(x + (p0 + g) * n, n, live, panel + g * n);
        }
      }
      const Panel panel_args{x + p0 * n, w, bias, n, d, c->transpose, rows, padded, panel, packed, slice, partial};
      for (int64_t j0 = 0; j0 < n; j0 += NR) {
        const int64_t cols = std::min(NR, n - j0);
        // A last tile of at most one vector's columns runs one vector wide.
        if (NV > 1 && cols <= W) {
          tile<V, MR, 1, PAIRS>(panel_args, j0, cols);
        } else {
          tile<V, MR, NV, PAIRS>(panel_args, j0, cols);
        }
      }
    }
  }

  // Rows [0, live) of a group of MR rows of x as float, interleaved: element
  // k of row r at dst[k * MR + r]; rows from `live` on read as zeros.
  template <typename V, int MR>
  static void copy_group(const T* src, int64_t n, int64_t live, float* dst) {
    constexpr int64_t W = V::kWidth;
    if constexpr (W > 1) {
      static_assert(MR <= W, "a group is transposed in W x W blocks");
      for (int64_t k0 = 0; k0 < n; k0 += W) {
        const int64_t depth = std::min(W, n - k0);
        V block[W];
        for (int64_t r = 0; r < W; ++r) {
          const T* row = src + r * n + k0;
          block[r] = r >= live ? V::broadcast(0.f) : (depth == W ? V::load(row) : V::load(row, depth, 0.f));
        }
        V::transpose(block);
        for (int64_t t = 0; t < depth; ++t) block[t].store(dst + (k0 + t) * MR, MR);
      }
    } else {
      for (int64_t k = 0; k < n; ++k) {
        for (int r = 0; r < MR; ++r) dst[k * MR + r] = r < live ? static_cast<float>(src[r * n + k]) : 0.f;
      }
    }
  }

  struct Panel {
    T* x;  // the panel's first row in x
    const T* w;
    const T* bias;
    int64_t n;
    int64_t depth;  // 32-bit entries of k per row of the copy (depth<PAIRS>)
    bool transpose;
    int64_t rows, padded;  // live rows; rows rounded up to the tile's MR
    const float* a;        // the panel's copy, padded rows zero
    const float* packed;   // all of w packed (the tile at j0 from j0 * n), or null
    float* slice;
    float* partial;
  };

  // Columns [j0, j0 + cols) of the panel's result, cols <= NV * W.
  template <typename V, int MR, int NV, bool PAIRS>
  static void tile(const Panel& p, int64_t j0, int64_t cols) {
    constexpr int64_t W = V::kWidth, NR = NV * W;
    const int64_t n = p.n, d = p.depth;
    for (int64_t k0 = 0; k0 < d; k0 += kKc) {
      const int64_t kc = std::min(kKc, d - k0);
      const bool first = k0 == 0, last = k0 + kc == d;
      const float* slice = p.packed ? p.packed + j0 * d + k0 * NR : p.slice;
      if (!p.packed) pack<V, NV, PAIRS>(p.w, n, j0, cols, k0, kc, p.transpose, p.slice);
      for (int64_t g = 0; g < p.padded; g += MR) {
        V acc[MR][NV];
        for (int r = 0; r < MR; ++r)
          for (int v = 0; v < NV; ++v)
            acc[r][v] = first || g + r >= p.rows ? V::broadcast(0.f) : V::load(p.partial + (g + r) * NR + v * W);
        const float* a = p.a + g * d + k0 * MR;  // the group's interleaved copy
        if constexpr (PAIRS) {
#if MAKE_INPLACE_CPU_X86
          micro_tile_pairs<MR, NV>(reinterpret_cast<const uint32_t*>(a), reinterpret_cast<const uint32_t*>(slice),
                                   kc, acc);
#endif
        } else {
          micro_tile<V, MR, NV>([a](int64_t k, int r) { return a[k * MR + r]; }, slice, kc, acc);
        }
        const int64_t live = std::min<int64_t>(MR, p.rows - g);
        for (int64_t r = 0; r < live; ++r) {
          if (!last) {
            for (int v = 0; v < NV; ++v) acc[r][v].store(p.partial + (g + r) * NR + v * W);
            continue;
          }
          T* out = p.x + (g + r) * n + j0;
          for (int v = 0; v < NV; ++v) {
            const int64_t count = std::min<int64_t>(W, cols - v * W);
            if (count <= 0) break;
            V y = acc[r][v];
            if (p.bias) y = y + cpu::load_n<V>(p.bias + j0 + v * W, count);
            if (count == W) {
              y.store(out + v * W);
            } else {
              y.store(out + v * W, count);
            }
          }
        }
      }
    }
  }

  // The slice of B for columns [j0, j0 + cols) and entries [k0, k0 + kc) of
  // k: floats (pack_slice), or with PAIRS pairs of k (k0, kc in pairs). w^T's
  // pairs are adjacent in its rows: a 32-bit transpose, pack_slice's own on
  // w viewed as floats.
  template <typename V, int NV, bool PAIRS>
  static void pack(const T* w, int64_t n, int64_t j0, int64_t cols, int64_t k0, int64_t kc, bool transpose,
                   float* slice) {
    if constexpr (PAIRS) {
      if (transpose) {
        PanelKernel<float>::pack_slice<V, NV>(reinterpret_cast<const float*>(w), n / 2, j0, cols, k0, kc, true,
                                              slice);
      } else {
#if MAKE_INPLACE_CPU_X86
        pack_pairs<NV>(w, n, j0, cols, 2 * k0, kc, reinterpret_cast<uint32_t*>(slice));
#endif
      }
    } else {
      pack_slice<V, NV>(w, n, j0, cols, k0, kc, transpose, slice);
    }
  }

  // slice[k][c] = B[k0 + k][j0 + c] for k < kc, c < NR (0 past `cols`), where
  // B = w, or w^T with `transpose` (then W x W blocks go through registers).
  template <typename V, int NV>
  static void pack_slice(const T* w, int64_t n, int64_t j0, int64_t cols, int64_t k0, int64_t kc, bool transpose,
                         float* slice) {
    constexpr int64_t W = V::kWidth, NR = NV * W;
    if (!transpose) {
      for (int64_t k = 0; k < kc; ++k) {
        const T* src = w + (k0 + k) * n + j0;
        for (int v = 0; v < NV; ++v) {
          const int64_t count = std::min<int64_t>(W, cols - v * W);
          const V b = count >= W ? V::load(src + v * W) : V::load(src + v * W, std::max<int64_t>(count, 0), 0.f);
          b.store(slice + k * NR + v * W);
        }
      }
      return;
    }
    for (int v = 0; v < NV; ++v) {
      for (int64_t kk = 0; kk < kc; kk += W) {
        const int64_t depth = std::min(W, kc - kk);
        V block[W];
        for (int64_t i = 0; i < W; ++i) {
          const int64_t col = v * W + i;  // row j0 + col of w
          const T* src = w + (j0 + col) * n + k0 + kk;
          block[i] = col >= cols ? V::broadcast(0.f) : (depth == W ? V::load(src) : V::load(src, depth, 0.f));
        }
        V::transpose(block);
        for (int64_t t = 0; t < depth; ++t) block[t].store(slice + (kk + t) * NR + v * W);
      }
    }
  }
};

// Rows of at most kRegisterWidth elements (AVX-512): each group of MR rows is
// computed whole in registers (up to 6 x 4 vectors), broadcasting straight
// from x, and written back over the same rows, so no panel copy is needed
// (at n = 64 the copy's transposes cost a third of the product). w is packed
// once per chunk into a float [k][NR] stack buffer (16 KiB), transposed for w^T.
// A last vector with only a column or two (n = 33) would cost n FMAs per row
// for them; those columns are dot products of the row with w's column instead.
constexpr int64_t kRegisterWidth = 64;
constexpr int kRegisterRows = 6;
constexpr int64_t kMaxDotColumns = 3;
constexpr int64_t kDotReduceCost = 8;  // FMAs' worth of a horizontal sum (fits n = 17-51 measured)

inline bool register_rows_fit(int64_t n) {
#if MAKE_INPLACE_CPU_X86
  return n <= kRegisterWidth && cpu_isa() == CpuIsa::kAvx512;
#else
  return false;
#endif
}

// Whether the last n % width columns go cheaper as dot products (each: one FMA
// per vector of the row and a horizontal sum) than as one more broadcast vector
// (n FMAs a row).
constexpr bool dot_columns_pay(int64_t n, int64_t width) {
  const int64_t full = n / width, rest = n % width;
  return full >= 1 && rest >= 1 && rest <= kMaxDotColumns && rest * (full + 1 + kDotReduceCost) < n;
}

template <typename T>
struct RegisterRows {
  template <typename V>
  static void run(const Call* c, int64_t begin, int64_t end) {
    constexpr int64_t W = V::kWidth;
    if constexpr (W * 4 >= kRegisterWidth) {
      if (dot_columns_pay(c->n, W)) {
        switch (c->n / W) {
          case 1: return run_nv<V, 1, true>(c, begin, end);
          case 2: return run_nv<V, 2, true>(c, begin, end);
          default: return run_nv<V, 3, true>(c, begin, end);
        }
      }
      switch ((c->n + W - 1) / W) {
        case 1: return run_nv<V, 1, false>(c, begin, end);
        case 2: return run_nv<V, 2, false>(c, begin, end);
        case 3: return run_nv<V, 3, false>(c, begin, end);
        default: return run_nv<V, 4, false>(c, begin, end);
      }
    }
  }

  // The columns past the NV broadcast vectors (Dots) are each w's column as
  // a row of k, zero-padded to NV + 1 vectors.
  template <bool Dots>
  struct Packed {
    static constexpr int64_t kDotFloats = Dots ? kMaxDotColumns * kRegisterWidth : 1;
    alignas(64) float w[kRegisterWidth * kRegisterWidth];
    alignas(64) float dot_w[kDotFloats];
    int64_t dots;
  };

  template <typename V, int NV, bool Dots>
  static void run_nv(const Call* c, int64_t begin, int64_t end) {
    constexpr int64_t W = V::kWidth;
    const int64_t n = c->n;
    const T* w = static_cast<const T*>(c->w);
    Packed<Dots> p;
    PanelKernel<T>::template pack_slice<V, NV>(w, n, 0, Dots ? NV * W : n, 0, n, c->transpose, p.w);
    p.dots = Dots ? n - NV * W : 0;
    if constexpr (Dots) {
      for (int64_t j = 0; j < p.dots; ++j) {
        const int64_t col = NV * W + j;
        float* dst = p.dot_w + j * kRegisterWidth;
        for (int64_t k = 0; k < (NV + 1) * W; ++k) {
          dst[k] = k >= n ? 0.f : static_cast<float>(c->transpose ? w[col * n + k] : w[k * n + col]);
        }
      }
    }
    T* x = static_cast<T*>(c->x);
    const T* bias = static_cast<const T*>(c->bias);
    int64_t r = begin;
    for (; r + kRegisterRows <= end; r += kRegisterRows) group<V, NV, kRegisterRows>(x + r * n, n, p, bias);
    switch (end - r) {
      case 5: return group<V, NV, 5>(x + r * n, n, p, bias);
      case 4: return group<V, NV, 4>(x + r * n, n, p, bias);
      case 3: return group<V, NV, 3>(x + r * n, n, p, bias);
      case 2: return group<V, NV, 2>(x + r * n, n, p, bias);
      case 1: return group<V, NV, 1>(x + r * n, n, p, bias);
      default: return;
    }
  }

  template <typename V, int NV, int MR, bool Dots>
  static void group(T* x, int64_t n, const Packed<Dots>& p, const T* bias) {
    constexpr int64_t W = V::kWidth;
    V acc[MR][NV];
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = V::broadcast(0.f);
    micro_tile<V, MR, NV>([x, n](int64_t k, int r) { return static_cast<float>(x[r * n + k]); }, p.w, n, acc);
    [[maybe_unused]] float dot[MR][kMaxDotColumns];
    if constexpr (Dots) {  // read before any row of the group is written
      for (int r = 0; r < MR; ++r) {
        const T* row = x + r * n;
        V xv[NV + 1];
        for (int v = 0; v < NV; ++v) xv[v] = V::load(row + v * W);
        xv[NV] = V::load(row + NV * W, p.dots, 0.f);
        for (int64_t j = 0; j < p.dots; ++j) {
          const float* col = p.dot_w + j * kRegisterWidth;
          V s = V::broadcast(0.f);
          for (int v = 0; v <= NV; ++v) s = V::fma(xv[v], V::load(col + v * W), s);
          dot[r][j] = s.sum();
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      for (int v = 0; v < NV; ++v) {
        const int64_t count = std::min<int64_t>(W, n - v * W);
        V y = acc[r][v];
        if (bias) y = y + cpu::load_n<V>(bias + v * W, count);
        if (count == W) {
          y.store(x + r * n + v * W);
        } else {
          y.store(x + r * n + v * W, count);
        }
      }
      if constexpr (Dots) {
        for (int64_t j = 0; j < p.dots; ++j) {
          const int64_t col = NV * W + j;
          x[r * n + col] = static_cast<T>(dot[r][j] + (bias ? static_cast<float>(bias[col]) : 0.f));
        }
      }
    }
  }
};

// Where a thread's buffers live: PB bytes of panel on its stack, or (PB = 0,
// threads with small stacks) a short panel's buffers on the heap.
template <typename T, int64_t PB, bool PAIRS = false>
struct Panels {
  template <typename V>
  static void run(const Call* c, int64_t begin, int64_t end) {
    if constexpr (PB == 0) {
      const auto buffers = std::make_unique<Buffers<kPanelBytes>>();
      PanelKernel<T>::template run<V, PAIRS>(c, begin, end, *buffers);
    } else {
      Buffers<PB> buffers;
      PanelKernel<T>::template run<V, PAIRS>(c, begin, end, buffers);
    }
  }
};

#if MAKE_INPLACE_CPU_X86
// The AVX-512 kernels compiled with AVX512-BF16 as well (the pairs micro-tile).
template <typename K>
MAKE_INPLACE_TARGET_AVX512_BF16 MAKE_INPLACE_FLATTEN void run_avx512_bf16(const Call* c, int64_t begin, int64_t end) {
  K::template run<cpu::VecAvx512>(c, begin, end);
}
#endif

// Whether bfloat16 rows take the pairs micro-tile.
inline bool pairs_fit(const Call* c) { return c->n % 2 == 0 && square_matmul_rows_bf16_dot(); }

// The panel size for a thread's chunk of `rows` rows: the tall panel repacks w
// four times less often (at n = 512 the packing is a tenth of the time with
// the short one) where the stack has room for it.
inline int64_t panel_bytes(int64_t rows, int64_t n) {
  const int64_t room = cpu::stack_room();
  if (rows * n * 4 > kPanelBytes && room >= int64_t{sizeof(Buffers<kTallPanelBytes>)} + kStackMargin) {
    return kTallPanelBytes;
  }
  return room < 0 || room >= int64_t{sizeof(Buffers<kPanelBytes>)} + kStackMargin ? kPanelBytes : 0;
}

template <typename T>
void run_chunk(const Call* c, int64_t begin, int64_t end) {
  // Half types keep the panels: their copy converts to float once per element,
  // where the register rows would convert each broadcast.
  if constexpr (std::is_same_v<T, float>) {
    if (register_rows_fit(c->n)) return cpu::run_best<RegisterRows<T>>(c, begin, end);
  }
#if MAKE_INPLACE_CPU_X86
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (pairs_fit(c)) {
      switch (panel_bytes(end - begin, c->n)) {
        case kTallPanelBytes: return run_avx512_bf16<Panels<T, kTallPanelBytes, true>>(c, begin, end);
        case kPanelBytes: return run_avx512_bf16<Panels<T, kPanelBytes, true>>(c, begin, end);
        default: return run_avx512_bf16<Panels<T, 0, true>>(c, begin, end);
      }
    }
  }
#endif
  switch (panel_bytes(end - begin, c->n)) {
    case kTallPanelBytes: return cpu::run_best<Panels<T, kTallPanelBytes>>(c, begin, end);
    case kPanelBytes: return cpu::run_best<Panels<T, kPanelBytes>>(c, begin, end);
    default: return cpu::run_best<Panels<T, 0>>(c, begin, end);
  }
}

// float64: one row at a time in double, n accumulators per chunk (on the
// stack up to kStackDoubles, else on the heap).
constexpr int64_t kStackDoubles = 8192;

void rows_double(const Call& c, int64_t begin, int64_t end) {
  const int64_t n = c.n;
  double* x = static_cast<double*>(c.x);
  const double* w = static_cast<const double*>(c.w);
  const double* bias = static_cast<const double*>(c.bias);
  double stack_acc[kStackDoubles];
  std::vector<double> heap_acc(static_cast<size_t>(n > kStackDoubles ? n : 0));
  double* acc = n > kStackDoubles ? heap_acc.data() : stack_acc;
  for (int64_t r = begin; r < end; ++r) {
    double* row = x + r * n;
    if (c.transpose) {  // acc[j] = sum_k row[k] * w[j, k]
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t k = 0; k < n; ++k) s += row[k] * w[j * n + k];
        acc[j] = s;
      }
    } else {  // acc[j] = sum_k row[k] * w[k, j]
      std::fill(acc, acc + n, 0.0);
      for (int64_t k = 0; k < n; ++k) {
        const double a = row[k];
        for (int64_t j = 0; j < n; ++j) acc[j] += a * w[k * n + j];
      }
    }
    for (int64_t j = 0; j < n; ++j) row[j] = bias ? acc[j] + bias[j] : acc[j];
  }
}

}  // namespace

bool square_matmul_rows_bf16_dot() {
#if MAKE_INPLACE_CPU_X86
  return cpu_isa() == CpuIsa::kAvx512 && cpu_has_bf16_dot();
#else
  return false;
#endif
}

int square_matmul_rowwise(ScalarKind kind, void* x, const void* w, const void* bias, int64_t rows, int64_t n,
                          bool transpose) {
  if (rows <= 0 || n <= 0) return 0;
  const Call call{x, w, bias, n, transpose};
  // A chunk of rows worth a thread: about 2^19 multiply-adds.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 19) / (n * n));
  switch (kind) {
    case ScalarKind::kFloat16:
      cpu_parallel_for(rows, grain, [&](int64_t b, int64_t e) { run_chunk<c10::Half>(&call, b, e); });
      return 0;
    case ScalarKind::kBFloat16:
      cpu_parallel_for(rows, grain, [&](int64_t b, int64_t e) { run_chunk<c10::BFloat16>(&call, b, e); });
      return 0;
    case ScalarKind::kFloat32:
      cpu_parallel_for(rows, grain, [&](int64_t b, int64_t e) { run_chunk<float>(&call, b, e); });
      return 0;
    case ScalarKind::kFloat64:
      cpu_parallel_for(rows, grain, [&](int64_t b, int64_t e) { rows_double(call, b, e); });
      return 0;
  }
  return -1;
}

}  // namespace make_inplace::kernels
