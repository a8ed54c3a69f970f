// square_matmul_'s routing policy (see square_matmul_route.h and
// docs/routing.md). Torch-free and query-free: compiled into every build, so
// CPU-only CI tests the CUDA routing over tables of calls and device facts.
#include "make_inplace/square_matmul_route.h"

#include <algorithm>

#include "make_inplace/square_matmul_tuning.h"

namespace make_inplace::square_matmul {
namespace {

using kernels::RowBlockLaunch;
using kernels::ScalarKind;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Named {
  Forced forced;
  const char* name;
};
constexpr Named kForcedNames[] = {
    {Forced::kNone, ""},
    {Forced::kWgmma, "wgmma"},
    {Forced::kWgmmaCounted, "wgmma_counted"},
    {Forced::kWgmmaClusters, "wgmma_clusters"},
    {Forced::kWgmmaGrid, "wgmma_grid"},
    {Forced::kWgmmaRows, "wgmma_rows"},
    {Forced::kFfma, "ffma"},
    {Forced::kFfmaCounted, "ffma_counted"},
    {Forced::kFfmaGrid, "ffma_grid"},
    {Forced::kPanels, "panels"},
    {Forced::kWaves, "waves"},
};

// Whether cuBLAS's panels beat the waves kernel: a panel must fill the GPU
// (or hold all of x at once), and small blocks must keep enough of cuBLAS's
// 128-row tiles busy (a block of r rows keeps about r / (128 ceil(r / 128))).
bool panels_pay(const PanelPlan& p, int64_t rows, int64_t n, int element_size) {
  if (p.rows_per_block < 1) return false;
  const bool fills_gpu = p.panel_rows() * n >= kMinPanelTiles * 128 * 128 || p.panel_rows() >= rows;
  const int64_t tile_rows = ceil_div(p.rows_per_block, 128) * 128;
  const double share = element_size == 2 ? kWavesShareOfCublas16Bit : kWavesShareOfCublasOther;
  const bool tiles_busy = !p.small_blocks || static_cast<double>(p.rows_per_block) / tile_rows >= share;
  return fills_gpu && tiles_busy;
}

Plan panel_plan(const PanelPlan& panels) {
  Plan p;
  p.route = panels.small_blocks ? Route::kPanelsSmallBlocks : Route::kPanelsOneBuffer;
  p.panels = panels;
  return p;
}

// The wgmma kernel's residency for tiles of col_tile columns, tiles a CTA.
const kernels::Residency& wgmma_residency(const Device& d, int col_tile, int tiles) {
  return col_tile == kernels::wgmma::kNarrowColTile ? d.wgmma_narrow[tiles - 1] : d.wgmma[tiles - 1];
}

// What a wgmma plan costs, in 64-deep k-steps of one 256-column tile: its
// rounds of row-blocks, each a fixed kWgmmaRoundOverheadKSteps plus the
// k-steps of the tiles a CTA computes (a 192-column tile three quarters of a
// 256-column one).
double wgmma_cost(const RowBlockLaunch& l, int64_t row_blocks, int64_t n) {
  const double k_steps = static_cast<double>(ceil_div(n, 64));
  const double work = l.tiles_per_cta * (l.col_tile / static_cast<double>(kernels::wgmma::kColTile)) * k_steps;
  return static_cast<double>(ceil_div(row_blocks, l.groups)) * (kWgmmaRoundOverheadKSteps + work);
}

// The wgmma kernel's cheapest cluster plan for tiles of col_tile columns: one
// or two tiles a CTA, clusters of at most 16 CTAs that can be scheduled; one
// tile a CTA only up to 8 column tiles (wider rows pack the GPCs better in
// clusters half as large). `only` (1 or 2, from an override) allows that
// choice alone, at any width.
bool wgmma_clusters(const Call& c, const Device& d, int only, int col_tile, RowBlockLaunch* out) {
  const int64_t col_tiles = ceil_div(c.n, col_tile);
  const int64_t row_blocks = ceil_div(c.rows, kernels::wgmma::kRowBlock);
  bool found = false;
  for (int tiles = 1; tiles <= kernels::wgmma::kMaxTilesPerCta; ++tiles) {
    if (only != 0 ? only != tiles : tiles == 1 && col_tiles > kWgmmaOneTileMaxColTiles) continue;
    const int64_t ctas = ceil_div(col_tiles, tiles);
    if (ctas > kernels::kMaxClusterCtas) continue;
    const int clusters = wgmma_residency(d, col_tile, tiles).clusters[ctas];
    if (clusters == 0) continue;
    const RowBlockLaunch l{tiles, static_cast<int>(ctas), static_cast<int>(std::min<int64_t>(clusters, row_blocks)),
                           col_tile, kernels::GroupMeet::kClusters};
    if (!found || wgmma_cost(l, row_blocks, c.n) < wgmma_cost(*out, row_blocks, c.n)) *out = l;
    found = true;
  }
  return found;
}

// The plan of a cooperative grid (counters or the grid's barrier) for tiles
// of col_tile columns, `tiles` a CTA: groups of ceil(col_tiles / tiles) plain
// CTAs, every SM busy, if a group fits at once.
bool wgmma_grid(const Call& c, const Device& d, int tiles, int col_tile, kernels::GroupMeet meet,
                RowBlockLaunch* out) {
  const int64_t group = ceil_div(ceil_div(c.n, col_tile), tiles);
  const int resident = wgmma_residency(d, col_tile, tiles).ctas;
  if (resident < group) return false;
  const int64_t row_blocks = ceil_div(c.rows, kernels::wgmma::kRowBlock);
  *out = {tiles, static_cast<int>(group), static_cast<int>(std::min<int64_t>(resident / group, row_blocks)), col_tile,
          meet};
  return true;
}

// Of the plans of both tile widths `plan_for(col_tile, &launch)` finds, the
// cheaper (wgmma_cost; ties keep 256 columns); `only_col_tile` (256 or 192,
// from an override) allows that width alone.
template <typename PlanFor>
bool cheaper_width(const Call& c, int only_col_tile, PlanFor plan_for, RowBlockLaunch* out) {
  const int64_t row_blocks = ceil_div(c.rows, kernels::wgmma::kRowBlock);
  bool found = false;
  for (const int64_t width : {kernels::wgmma::kColTile, kernels::wgmma::kNarrowColTile}) {
    RowBlockLaunch l;
    if ((only_col_tile != 0 && only_col_tile != width) || !plan_for(static_cast<int>(width), &l)) continue;
    if (!found || wgmma_cost(l, row_blocks, c.n) < wgmma_cost(*out, row_blocks, c.n)) *out = l;
    found = true;
  }
  return found;
}

// Whether the wgmma kernels take the call: 16-bit types on sm_90 built for
// sm_90a, n a multiple of 8, 16-byte aligned x and W (TMA).
bool wgmma_runs(const Call& c, const Device& d) {
  return d.cuda && d.sm90a_built && d.tensor_maps && d.major == 9 && d.minor == 0 &&
         (c.kind == ScalarKind::kFloat16 || c.kind == ScalarKind::kBFloat16) && c.n >= 8 && c.n % 8 == 0 &&
         c.rows <= kernels::kMaxGroupRows && c.x_aligned16 && c.w_aligned16;
}

// The 64-row wgmma kernel: rows of 136 to 512 columns; unless forced, from
// kWgmmaRowsMinN in whole k-steps. It needs no memory, so the bound does not
// matter.
bool plan_wgmma_rows(const Call& c, const Device& d, bool forced, Plan* out) {
  if (!wgmma_runs(c, d) || c.n < kernels::wgmma_rows::kMinN || c.n > kernels::wgmma_rows::kMaxN ||
      d.wgmma_rows_ctas < 1) {
    return false;
  }
  if (!forced && (c.n < kWgmmaRowsMinN || c.n % kWgmmaRowsStepN != 0)) return false;
  const int64_t row_blocks = ceil_div(c.rows, kernels::wgmma_rows::kRowBlock);
  out->route = Route::kWgmmaRows;
  out->groups = {static_cast<int>(ceil_div(c.n, kernels::wgmma::kColTile)), 1,
                 static_cast<int>(std::min<int64_t>(d.wgmma_rows_ctas, row_blocks))};
  out->counter_bytes = 0;
  return true;
}

// The 128-row wgmma kernel in `mode`, for n up to 8192. Unforced (kNone,
// kWgmma): counters when the bound has room for them, else the grid's
// barrier (no memory); clusters only where the groups do not fit in one
// cooperative grid. The grid's barrier ran faster than clusters, which
// leave SMs idle, but mostly 1-3% slower than counters at the benchmark's
// large shapes (H100 and H200, docs/square_matmul.md). Tiles of 192 columns
// where their plan costs less than 256 columns' (more, smaller groups fill a
// last round that 256 columns leave mostly empty).
bool plan_wgmma(const Call& c, const Device& d, const Override& o, Forced mode, Plan* out) {
  if (!wgmma_runs(c, d) || c.n > kernels::wgmma::kMaxN) return false;
  const int tiles = o.tiles_per_cta == 2 ? 2 : 1;
  const auto grid_plan = [&](kernels::GroupMeet meet) {
    return [&c, &d, tiles, meet](int col_tile, RowBlockLaunch* l) { return wgmma_grid(c, d, tiles, col_tile, meet, l); };
  };
  RowBlockLaunch l;
  const int64_t counter_bytes = kernels::row_block_counter_bytes(c.rows);
  const bool counted = mode != Forced::kWgmmaClusters && mode != Forced::kWgmmaGrid &&
                       counters_fit(c.workspace_bound, counter_bytes) &&
                       cheaper_width(c, o.col_tile, grid_plan(kernels::GroupMeet::kCounters), &l);
  if (counted) {
    out->route = Route::kWgmmaCounted;
  } else if (mode == Forced::kWgmmaCounted) {
    return false;
  } else if (mode != Forced::kWgmmaClusters &&
             cheaper_width(c, o.col_tile, grid_plan(kernels::GroupMeet::kGridBarrier), &l)) {
    out->route = Route::kWgmmaGrid;
  } else {
    const auto cluster_plan = [&](int col_tile, RowBlockLaunch* p) {
      return wgmma_clusters(c, d, o.tiles_per_cta, col_tile, p);
    };
    if (mode == Forced::kWgmmaGrid || !cheaper_width(c, o.col_tile, cluster_plan, &l)) return false;
    out->route = Route::kWgmmaClusters;
  }
  out->groups = l;
  out->counter_bytes = counted ? counter_bytes : 0;
  return true;
}

// The FFMA kernel, counted (row-block counters) or at the grid barrier (no
// memory). It takes fp32 without TF32 (with TF32 allowed cuBLAS's TF32 is
// faster), n a multiple of 4 and 16-byte aligned x, W and bias (16-byte
// loads), and groups of ceil(n / (128 t)) CTAs that fit in the cooperative
// grid. A CTA computes t = 2 tiles where its rounds of row-blocks, at
// kFfmaTwoTileRoundCost one-tile rounds each, come to no more than those of
// t = 1 (groups half as large fit twice as often). `only` (1 or 2, from an
// override) allows that choice alone.
bool plan_ffma(const Call& c, const Device& d, bool counted, int only, Plan* out) {
  if (!d.cuda || c.kind != ScalarKind::kFloat32 || c.allow_tf32) return false;
  if (c.n < 4 || c.n % 4 != 0 || c.rows > kernels::kMaxGroupRows) return false;
  if (!c.x_aligned16 || !c.w_aligned16 || !c.bias_aligned16) return false;
  const int64_t col_tiles = ceil_div(c.n, kernels::ffma::kColTile);
  const int64_t row_blocks = ceil_div(c.rows, kernels::ffma::kRowBlock);
  int64_t groups[kernels::ffma::kMaxTilesPerCta] = {};  // groups at once per tiles-per-CTA, 0: none fit
  for (int tiles = 1; tiles <= kernels::ffma::kMaxTilesPerCta; ++tiles) {
    if (only == 0 || only == tiles) groups[tiles - 1] = d.ffma_ctas[tiles - 1] / ceil_div(col_tiles, tiles);
  }
  int tiles = 0;
  if (groups[0] > 0 && groups[1] > 0) {
    const double one = static_cast<double>(ceil_div(row_blocks, groups[0]));
    const double two = kFfmaTwoTileRoundCost * static_cast<double>(ceil_div(row_blocks, groups[1]));
    tiles = two <= one ? 2 : 1;
  } else if (groups[0] > 0 || (groups[1] > 0 && only == 2)) {
    tiles = groups[0] > 0 ? 1 : 2;
  } else {
    return false;
  }
  out->route = counted ? Route::kFfmaCounted : Route::kFfmaGrid;
  out->groups = {tiles, static_cast<int>(ceil_div(col_tiles, tiles)),
                 static_cast<int>(std::min(groups[tiles - 1], row_blocks)), static_cast<int>(kernels::ffma::kColTile),
                 counted ? kernels::GroupMeet::kCounters : kernels::GroupMeet::kGridBarrier};
  out->counter_bytes = counted ? kernels::row_block_counter_bytes(c.rows) : 0;
  return true;
}

Plan plan_cpu(const Call& c, const Device& d, int64_t row_bytes) {
  // Panels of a few rows turn into many tiny GEMM calls whose threading
  // overhead dominates; the row kernel is faster there and uses less memory.
  const int64_t panel_rows = std::min(c.rows, c.workspace_bound / row_bytes);
  const bool w_in_l2 = d.cpu_l2_bytes <= 0 || c.n * c.n * int64_t{4} <= d.cpu_l2_bytes;
  // torch's float16 GEMM has no fast CPU path; its bfloat16 GEMM has one
  // only with hardware bfloat16 dot products, and the row kernel matches it
  // there with the same dot products (even n), but not AMX's tiles.
  const bool bf16_rows = !d.cpu_bf16_dot || (d.cpu_rows_bf16_dot && !d.cpu_amx && c.n % 2 == 0);
  const bool rows_faster =
      c.n <= kCpuRowsUpToWidth &&
      (c.kind == kernels::ScalarKind::kFloat16 || (c.kind == kernels::ScalarKind::kBFloat16 && bf16_rows) ||
       (c.kind == kernels::ScalarKind::kFloat32 && w_in_l2));
  Plan p;
  if (rows_faster || panel_rows < std::min(c.rows, kCpuMinPanelRows)) {
    p.route = Route::kCpuRows;
    return p;
  }
  p.route = Route::kCpuPanels;
  p.panels.blocks = 1;
  p.panels.rows_per_block = panel_rows;
  p.panels.block_bytes = panel_rows * row_bytes;
  return p;
}

}  // namespace

const char* route_name(Route route) {
  switch (route) {
    case Route::kEmpty: return "empty";
    case Route::kUnsupported: return "unsupported";
    case Route::kWgmmaCounted: return "wgmma_counted";
    case Route::kWgmmaClusters: return "wgmma_clusters";
    case Route::kWgmmaGrid: return "wgmma_grid";
    case Route::kWgmmaRows: return "wgmma_rows";
    case Route::kFfmaCounted: return "ffma_counted";
    case Route::kFfmaGrid: return "ffma_grid";
    case Route::kPanelsSmallBlocks: return "panels_small_blocks";
    case Route::kPanelsOneBuffer: return "panels_one_buffer";
    case Route::kWaves: return "waves";
    case Route::kCpuRows: return "cpu_rows";
    case Route::kCpuPanels: return "cpu_panels";
  }
  return "?";
}

bool parse_forced(const std::string& name, Forced* out) {
  for (const Named& entry : kForcedNames) {
    if (name == entry.name) {
      *out = entry.forced;
      return true;
    }
  }
  return false;
}

const char* forced_name(Forced forced) {
  for (const Named& entry : kForcedNames) {
    if (entry.forced == forced) return entry.name;
  }
  return "?";
}

const char* forced_names() {
  return "'' (none), 'wgmma', 'wgmma_counted', 'wgmma_clusters', 'wgmma_grid', 'wgmma_rows', 'ffma', 'ffma_counted', "
         "'ffma_grid', 'panels', 'waves'";
}

Plan plan(const Call& c, const Device& d, const Override& o) {
  Plan p;
  if (c.rows <= 0) return p;  // Route::kEmpty
  const int element_size = kernels::element_size(c.kind);
  const int64_t row_bytes = c.n * element_size;
  if (!d.cuda) return plan_cpu(c, d, row_bytes);

  PanelPlan panels = plan_panels(c.workspace_bound, row_bytes, c.rows);
  panels.batched = panels.batched && o.panels_batched;
  const bool waves_run = c.n <= d.waves_max_width;
  const bool counters = counters_fit(c.workspace_bound, kernels::row_block_counter_bytes(c.rows));

  // A forced route runs wherever it can.
  switch (o.route) {
    case Forced::kWgmma:
      if ((o.tiles_per_cta == 0 && o.col_tile == 0 && plan_wgmma_rows(c, d, false, &p)) ||
          plan_wgmma(c, d, o, o.route, &p)) {
        return p;
      }
      break;
    case Forced::kWgmmaCounted:
    case Forced::kWgmmaClusters:
    case Forced::kWgmmaGrid:
      if (plan_wgmma(c, d, o, o.route, &p)) return p;
      break;
    case Forced::kWgmmaRows:
      if (plan_wgmma_rows(c, d, true, &p)) return p;
      break;
    case Forced::kFfma:
    case Forced::kFfmaCounted:
    case Forced::kFfmaGrid: {
      const bool counted = o.route == Forced::kFfma ? counters : o.route == Forced::kFfmaCounted;
      if ((counters || !counted) && plan_ffma(c, d, counted, o.tiles_per_cta, &p)) return p;
      break;
    }
    case Forced::kPanels:
      if (panels.rows_per_block >= 1) return panel_plan(panels);
      break;
    case Forced::kWaves:
      if (waves_run) {
        p.route = Route::kWaves;
        return p;
      }
      break;
    case Forced::kNone: break;
  }

  // The wgmma kernels whenever they take the case, whatever the bound and
  // however few the rows: they need at most counters, and beat panels and
  // the waves kernel even on one row-block. A tiles-per-CTA or tile-width
  // override asks for the 128-row kernel.
  if ((o.tiles_per_cta == 0 && o.col_tile == 0 && plan_wgmma_rows(c, d, false, &p)) ||
      plan_wgmma(c, d, o, Forced::kNone, &p)) {
    return p;
  }

  // fp32 without TF32: cuBLAS's SGEMM would run only on one-wave panels; the
  // FFMA kernel runs the whole product in place, from one whole row-block up.
  // From n = 4096 a contiguous panel buffer keeps cuBLAS ahead (the copy then
  // weighs 1/n of the GEMM).
  const bool panels_ahead = c.n >= kFfmaPanelsFromN && !panels.small_blocks &&
                            panels_pay(panels, c.rows, c.n, kernels::element_size(ScalarKind::kFloat32));
  if (c.rows >= kFfmaMinRows && !panels_ahead && plan_ffma(c, d, counters, o.tiles_per_cta, &p)) return p;

  // Panels when they fill the GPU, or when the waves kernel cannot take n.
  if (panels.rows_per_block >= 1 && (panels_pay(panels, c.rows, c.n, element_size) || !waves_run)) {
    return panel_plan(panels);
  }
  p.route = waves_run ? Route::kWaves : Route::kUnsupported;
  return p;
}

std::string unsupported_message(const Call& c) {
  const int64_t row_bytes = c.n * kernels::element_size(c.kind);
  return "square_matmul_: x's width n = " + std::to_string(c.n) +
         " is too wide for the zero-workspace kernel on this GPU, and a workspace bound of " +
         std::to_string(c.workspace_bound) + " bytes holds no panel (at least " +
         std::to_string(kSmallSegmentBytes) + " bytes and one row of " + std::to_string(row_bytes) +
         " bytes); pass a larger workspace_bytes";
}

}  // namespace make_inplace::square_matmul
