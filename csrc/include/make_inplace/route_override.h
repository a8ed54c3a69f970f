#pragma once
// The one private switch tests and sweeps use to force a kernel choice
// (Python: make_inplace._testing.forced_route; docs/routing.md). It is set
// through the op make_inplace::_set_route_override, never from the
// environment, and read per call by square_matmul_'s bindings and by the
// row-wise kernels' staged-rows plan. Header-only and torch-free: the kernels
// read it too.
#include <atomic>

#include "make_inplace/square_matmul_route.h"

namespace make_inplace {

struct RouteOverride {
  square_matmul::Override square_matmul;
  bool staged_rows = true;  // false: softmax_/layer_norm_ never stage rows in shared memory
};

namespace detail {
struct RouteOverrideStore {
  std::atomic<int> route{static_cast<int>(square_matmul::Forced::kNone)};
  std::atomic<int> tiles_per_cta{0};
  std::atomic<int> col_tile{0};
  std::atomic<bool> panels_batched{true};
  std::atomic<bool> staged_rows{true};
};
inline RouteOverrideStore& route_override_store() {
  static RouteOverrideStore store;
  return store;
}
}  // namespace detail

inline RouteOverride route_override() {
  const detail::RouteOverrideStore& s = detail::route_override_store();
  RouteOverride o;
  o.square_matmul.route = static_cast<square_matmul::Forced>(s.route.load());
  o.square_matmul.tiles_per_cta = s.tiles_per_cta.load();
  o.square_matmul.col_tile = s.col_tile.load();
  o.square_matmul.panels_batched = s.panels_batched.load();
  o.staged_rows = s.staged_rows.load();
  return o;
}

inline void set_route_override(const RouteOverride& o) {
  detail::RouteOverrideStore& s = detail::route_override_store();
  s.route.store(static_cast<int>(o.square_matmul.route));
  s.tiles_per_cta.store(o.square_matmul.tiles_per_cta);
  s.col_tile.store(o.square_matmul.col_tile);
  s.panels_batched.store(o.square_matmul.panels_batched);
  s.staged_rows.store(o.staged_rows);
}

}  // namespace make_inplace
