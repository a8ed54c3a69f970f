// The private ops over the routing policy, in every build (no GPU needed):
//  * _square_matmul_route: the policy's plan for a call described by its
//    shape, dtype, layout facts and device facts (tests and docs/routing.md);
//  * _set_route_override / _route_override: the one switch that forces a
//    route (make_inplace._testing.forced_route).
#include <torch/library.h>

#include <string>
#include <tuple>

#include "make_inplace/kernels/cpu_facts.h"
#include "make_inplace/kernels/square_matmul.h"
#include "make_inplace/route_override.h"
#include "make_inplace/square_matmul_route.h"
#include "make_inplace/torch_kinds.h"

namespace make_inplace {
namespace {

using square_matmul::Forced;

Forced parse_forced_or_throw(const std::string& name) {
  Forced forced = Forced::kNone;
  TORCH_CHECK(square_matmul::parse_forced(name, &forced), "square_matmul route must be one of ",
              square_matmul::forced_names(), ", got '", name, "'");
  return forced;
}

void check_launch_override(int64_t tiles_per_cta, int64_t col_tile) {
  TORCH_CHECK(tiles_per_cta >= 0 && tiles_per_cta <= kernels::wgmma::kMaxTilesPerCta,
              "tiles_per_cta must be 0 (the policy's choice), 1 or 2, got ", tiles_per_cta);
  TORCH_CHECK(col_tile == 0 || col_tile == kernels::wgmma::kColTile || col_tile == kernels::wgmma::kNarrowColTile,
              "col_tile must be 0 (the policy's choice), ", kernels::wgmma::kColTile, " or ",
              kernels::wgmma::kNarrowColTile, ", got ", col_tile);
}

kernels::Residency residency(int64_t ctas, c10::IntArrayRef clusters, const char* name) {
  TORCH_CHECK(ctas >= 0, name, "_ctas must be >= 0, got ", ctas);
  TORCH_CHECK(static_cast<int64_t>(clusters.size()) <= kernels::kMaxClusterCtas + 1, name,
              "_clusters holds clusters per size 0..", kernels::kMaxClusterCtas, ", got ", clusters.size(),
              " entries");
  kernels::Residency r;
  r.ctas = static_cast<int>(ctas);
  for (size_t c = 1; c < clusters.size(); ++c) {
    TORCH_CHECK(clusters[c] >= 0, name, "_clusters must be >= 0, got ", clusters);
    r.clusters[c] = static_cast<int>(clusters[c]);
  }
  return r;
}

using PlanTuple =
    std::tuple<std::string, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>;

PlanTuple square_matmul_route_op(int64_t rows, int64_t n, at::ScalarType dtype, c10::string_view device,
                              bool transpose, std::optional<int64_t> workspace_bytes, bool x_aligned,
                              bool weight_aligned, bool bias_aligned, bool allow_tf32, int64_t capability_major,
                              int64_t capability_minor, bool sm90a, bool tensor_maps, int64_t wgmma_ctas,
                              c10::IntArrayRef wgmma_clusters, int64_t ffma_ctas,
                              int64_t waves_max_width, c10::string_view forced, int64_t tiles_per_cta,
                              int64_t col_tile, bool panels_batched, std::optional<int64_t> cpu_l2_bytes,
                              std::optional<bool> cpu_bf16_dot, std::optional<bool> cpu_amx,
                              std::optional<bool> cpu_rows_bf16_dot) {
  TORCH_CHECK(rows >= 0 && n >= 1, "rows must be >= 0 and n >= 1, got rows = ", rows, ", n = ", n);
  TORCH_CHECK(device == "cuda" || device == "cpu", "device must be 'cuda' or 'cpu', got '", device, "'");
  TORCH_CHECK(!workspace_bytes.has_value() || *workspace_bytes >= 0, "workspace_bytes must be None or >= 0, got ",
              workspace_bytes.value_or(0));
  check_launch_override(tiles_per_cta, col_tile);
  square_matmul::Call call;
  call.rows = rows;
  call.n = n;
  call.kind = scalar_kind(dtype);
  call.transpose = transpose;
  call.x_aligned16 = x_aligned;
  call.w_aligned16 = weight_aligned;
  call.bias_aligned16 = bias_aligned;
  call.workspace_bound =
      square_matmul::workspace_bound(rows * n * kernels::element_size(call.kind), workspace_bytes);
  call.allow_tf32 = allow_tf32;
  square_matmul::Device d;
  if (device == "cuda") {
    d.cuda = true;
    d.major = static_cast<int>(capability_major);
    d.minor = static_cast<int>(capability_minor);
    d.sm90a_built = sm90a;
    d.tensor_maps = tensor_maps;
    // The same residency for every tiles-per-CTA and tile-width variant of
    // each kernel, and for the 64-row wgmma kernel (on an H100 and H200 all
    // fit one CTA per SM, the FFMA kernel two).
    d.wgmma[0] = d.wgmma[1] = residency(wgmma_ctas, wgmma_clusters, "wgmma");
    d.wgmma_narrow[0] = d.wgmma_narrow[1] = d.wgmma[0];
    d.wgmma_rows_ctas = d.wgmma[0].ctas;
    TORCH_CHECK(ffma_ctas >= 0, "ffma_ctas must be >= 0, got ", ffma_ctas);
    d.ffma_ctas[0] = d.ffma_ctas[1] = static_cast<int>(ffma_ctas);
    d.waves_max_width = waves_max_width;
  } else {
    // None: this machine's, as square_matmul_ itself uses.
    TORCH_CHECK(cpu_l2_bytes.value_or(0) >= 0, "cpu_l2_bytes must be None or >= 0, got ", cpu_l2_bytes.value_or(0));
    d.cpu_l2_bytes = cpu_l2_bytes.has_value() ? *cpu_l2_bytes : kernels::cpu_l2_rule_bytes();
    d.cpu_bf16_dot = cpu_bf16_dot.has_value() ? *cpu_bf16_dot : kernels::cpu_has_bf16_dot();
    d.cpu_amx = cpu_amx.has_value() ? *cpu_amx : kernels::cpu_has_amx();
    d.cpu_rows_bf16_dot = cpu_rows_bf16_dot.has_value() ? *cpu_rows_bf16_dot : kernels::square_matmul_rows_bf16_dot();
  }
  square_matmul::Override o;
  o.route = parse_forced_or_throw(std::string(forced));
  o.tiles_per_cta = static_cast<int>(tiles_per_cta);
  o.col_tile = static_cast<int>(col_tile);
  o.panels_batched = panels_batched;
  const square_matmul::Plan p = square_matmul::plan(call, d, o);
  TORCH_CHECK(p.route != square_matmul::Route::kUnsupported, "make_inplace.", square_matmul::unsupported_message(call));
  const bool wgmma = p.route == square_matmul::Route::kWgmmaCounted || p.route == square_matmul::Route::kWgmmaClusters ||
                     p.route == square_matmul::Route::kWgmmaGrid;
  return {square_matmul::route_name(p.route), p.groups.tiles_per_cta, p.groups.group_ctas, p.groups.groups,
          wgmma ? p.groups.col_tile : 0, p.counter_bytes, p.panels.blocks, p.panels.rows_per_block,
          p.panels.block_bytes, p.panels.batched};
}

void set_route_override_op(c10::string_view square_matmul_route, int64_t tiles_per_cta, int64_t col_tile,
                           bool panels_batched, bool staged_rows) {
  check_launch_override(tiles_per_cta, col_tile);
  RouteOverride o;
  o.square_matmul.route = parse_forced_or_throw(std::string(square_matmul_route));
  o.square_matmul.tiles_per_cta = static_cast<int>(tiles_per_cta);
  o.square_matmul.col_tile = static_cast<int>(col_tile);
  o.square_matmul.panels_batched = panels_batched;
  o.staged_rows = staged_rows;
  set_route_override(o);
}

std::tuple<std::string, int64_t, int64_t, bool, bool> route_override_op() {
  const RouteOverride o = route_override();
  return {square_matmul::forced_name(o.square_matmul.route), o.square_matmul.tiles_per_cta,
          o.square_matmul.col_tile, o.square_matmul.panels_batched, o.staged_rows};
}

}  // namespace

TORCH_LIBRARY_IMPL(make_inplace, CompositeExplicitAutograd, m) {
  m.impl("_square_matmul_route", &square_matmul_route_op);
  m.impl("_set_route_override", &set_route_override_op);
  m.impl("_route_override", &route_override_op);
}

}  // namespace make_inplace
