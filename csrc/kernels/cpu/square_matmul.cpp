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
// Half types compute in float32; float64 keeps a plain double loop. The
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
  template <typename V, int64_t PB>
  static void run(const Call* c, int64_t begin, int64_t end, Buffers<PB>& b) {
    constexpr int MR = Tile<V>::kRows, NARROW = Tile<V>::kNarrowRows;
    const int64_t fit = PB / (4 * c->n);
    if (MR != NARROW && c->n < kTallTileFromWidth) return run_panels<V, NARROW>(c, begin, end, fit / NARROW * NARROW, b);
    if (fit >= MR) return run_panels<V, MR>(c, begin, end, fit / MR * MR, b);
    if (fit >= 4) return run_panels<V, 4>(c, begin, end, fit / 4 * 4, b);
    if (fit >= 2) return run_panels<V, 2>(c, begin, end, fit / 2 * 2, b);
    run_panels<V, 1>(c, begin, end, 1, b);
  }

  template <typename V, int MR, int64_t PB>
  static void run_panels(const Call* c, int64_t begin, int64_t end, int64_t panel_rows, Buffers<PB>& b) {
    constexpr int NV = Tile<V>::kVecs;
    constexpr int64_t W = V::kWidth, NR = NV * W;
    static_assert(NR <= kMaxNr, "tile wider than the partial-sum buffer");
    const int64_t n = c->n;
    T* x = static_cast<T*>(c->x);
    const T* w = static_cast<const T*>(c->w);
    const T* bias = static_cast<const T*>(c->bias);

    std::vector<float> heap_panel;
    float* panel = b.panel;
    if (panel_rows * n > Buffers<PB>::kPanelFloats) {
      heap_panel.resize(static_cast<size_t>(panel_rows * n));
      panel = heap_panel.data();
    }
    float* const slice = b.slice;
    float* const partial = b.partial;
    if (n > kKc) std::fill(partial, partial + panel_rows * NR, 0.f);  // read only past the first slice
    const float* packed = nullptr;
    if constexpr (Buffers<PB>::kPackedFloats > 1) {
      if (Buffers<PB>::kPackedFloats >= n * ((n + W - 1) / W * W) && end - begin > panel_rows) {
        for (int64_t j0 = 0; j0 < n; j0 += NR) {
          const int64_t cols = std::min(NR, n - j0);
          if (NV > 1 && cols <= W) {
            pack_slice<V, 1>(w, n, j0, cols, 0, n, c->transpose, b.packed + j0 * n);
          } else {
            pack_slice<V, NV>(w, n, j0, cols, 0, n, c->transpose, b.packed + j0 * n);
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
        copy_group<V, MR>(x + (p0 + g) * n, n, std::min<int64_t>(MR, rows - g), panel + g * n);
      }
      const Panel panel_args{x + p0 * n, w, bias, n, c->transpose, rows, padded, panel, packed, slice, partial};
      for (int64_t j0 = 0; j0 < n; j0 += NR) {
        const int64_t cols = std::min(NR, n - j0);
        // A last tile of at most one vector's columns runs one vector wide.
        if (NV > 1 && cols <= W) {
          tile<V, MR, 1>(panel_args, j0, cols);
        } else {
          tile<V, MR, NV>(panel_args, j0, cols);
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
    bool transpose;
    int64_t rows, padded;  // live rows; rows rounded up to the tile's MR
    const float* a;        // the panel's copy, padded rows zero
    const float* packed;   // all of w packed (the tile at j0 from j0 * n), or null
    float* slice;
    float* partial;
  };

  // Columns [j0, j0 + cols) of the panel's result, cols <= NV * W.
  template <typename V, int MR, int NV>
  static void tile(const Panel& p, int64_t j0, int64_t cols) {
    constexpr int64_t W = V::kWidth, NR = NV * W;
    const int64_t n = p.n;
    for (int64_t k0 = 0; k0 < n; k0 += kKc) {
      const int64_t kc = std::min(kKc, n - k0);
      const bool first = k0 == 0, last = k0 + kc == n;
      const float* slice = p.packed ? p.packed + j0 * n + k0 * NR : p.slice;
      if (!p.packed) pack_slice<V, NV>(p.w, n, j0, cols, k0, kc, p.transpose, p.slice);
      for (int64_t g = 0; g < p.padded; g += MR) {
        V acc[MR][NV];
        for (int r = 0; r < MR; ++r)
          for (int v = 0; v < NV; ++v)
            acc[r][v] = first || g + r >= p.rows ? V::broadcast(0.f) : V::load(p.partial + (g + r) * NR + v * W);
        const float* a = p.a + g * n + k0 * MR;  // the group's interleaved copy
        micro_tile<V, MR, NV>([a](int64_t k, int r) { return a[k * MR + r]; }, slice, kc, acc);
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
template <typename T, int64_t PB>
struct Panels {
  template <typename V>
  static void run(const Call* c, int64_t begin, int64_t end) {
    if constexpr (PB == 0) {
      const auto buffers = std::make_unique<Buffers<kPanelBytes>>();
      PanelKernel<T>::template run<V>(c, begin, end, *buffers);
    } else {
      Buffers<PB> buffers;
      PanelKernel<T>::template run<V>(c, begin, end, buffers);
    }
  }
};

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
