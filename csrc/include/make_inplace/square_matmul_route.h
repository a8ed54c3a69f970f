#pragma once
// square_matmul_'s routing policy: which kernel computes x <- x @ W (+ bias)
// for one call, as a pure function of the call (shape, dtype, weight layout,
// pointer alignment, workspace bound, TF32 permission) and the device facts
// (compute capability, the sm_90a build, how many blocks of each kernel fit
// at once). It queries nothing: the bindings fill the facts and execute the
// plan, and tests call it on CPU with facts of their own. docs/routing.md
// describes the routes and the rules.
#include <cstdint>
#include <string>

#include "make_inplace/kernels/scalar_kind.h"
#include "make_inplace/kernels/square_matmul_geometry.h"
#include "make_inplace/square_matmul_workspace.h"

namespace make_inplace::square_matmul {

enum class Route {
  kEmpty,              // no rows: nothing to do
  kUnsupported,        // CUDA: too wide for the waves kernel and no room for one panel row
  kWgmmaCounted,       // Hopper wgmma, a cooperative grid meeting on row-block counters
  kWgmmaClusters,      // Hopper wgmma, thread-block clusters, no memory at all
  kWgmmaGrid,          // Hopper wgmma, a cooperative grid meeting at its barrier once a round, no memory at all
  kWgmmaRows,          // Hopper wgmma, a CTA per 64-row block of up to 512 columns, no memory at all
  kFfmaCounted,        // fp32 FFMA, a cooperative grid meeting on row-block counters
  kFfmaGrid,           // fp32 FFMA, a cooperative grid meeting at its barrier once a round, no memory at all
  kPanelsSmallBlocks,  // cuBLAS on row panels, workspace in 1 MiB blocks (bounds of 2-10 MiB)
  kPanelsOneBuffer,    // cuBLAS on row panels, workspace in one buffer (bounds of 10 MiB and more)
  kWaves,              // zero-workspace cooperative kernel in waves of row-blocks (any dtype, sm_80+)
  kCpuRows,            // CPU: one row at a time, n accumulators per thread
  kCpuPanels,          // CPU: ATen GEMMs on row panels into one workspace
};

const char* route_name(Route route);

// One call of square_matmul_.
struct Call {
  int64_t rows = 0;  // x viewed as rows x n
  int64_t n = 0;
  kernels::ScalarKind kind = kernels::ScalarKind::kFloat32;
  bool transpose = false;     // x @ W^T (the weight as stored is read transposed)
  bool x_aligned16 = true;    // x's data pointer is 16-byte aligned
  bool w_aligned16 = true;
  bool bias_aligned16 = true; // true without a bias
  int64_t workspace_bound = 0;  // bytes, see workspace_bound()
  bool allow_tf32 = false;    // torch.backends.cuda.matmul.allow_tf32
};

// What the policy needs to know about the device, for the call's dtype and
// weight layout. The CUDA binding fills it once per (device, dtype, layout).
struct Device {
  bool cuda = false;          // false: the CPU routes
  int major = 0, minor = 0;   // compute capability
  bool sm90a_built = false;   // this library carries the sm_90a (wgmma) kernels
  bool tensor_maps = false;   // the driver can encode TMA tensor maps
  kernels::Residency wgmma[kernels::wgmma::kMaxTilesPerCta];  // [tiles per CTA - 1], 256-column tiles
  kernels::Residency wgmma_narrow[kernels::wgmma::kMaxTilesPerCta];  // the same, 192-column tiles
  int wgmma_rows_ctas = 0;    // CTAs of the 64-row wgmma kernel that fit at once
  int ffma_ctas[kernels::ffma::kMaxTilesPerCta] = {};  // [tiles per CTA - 1]: FFMA CTAs that fit at once
  int64_t waves_max_width = 0;  // widest n the waves kernel takes (0: it cannot run)
  int64_t cpu_l2_bytes = 0;     // CPU: one core's L2 cache (0: unknown, or no L2 rule)
  bool cpu_bf16_dot = true;     // CPU: bfloat16 dot products in hardware (torch's bf16 GEMM fast)
  bool cpu_amx = false;         // CPU: AMX tiles, which torch's bf16 GEMM runs on (faster still)
  bool cpu_rows_bf16_dot = false;  // CPU: the row kernel multiplies bfloat16 pairs with dot products
};

// A route forced by tests and sweeps (docs/routing.md): the forced route runs
// wherever it can run this call, whatever the thresholds say; where it cannot,
// the policy decides as usual.
enum class Forced {
  kNone,
  kWgmma,          // any of the four, the policy's choice
  kWgmmaCounted,
  kWgmmaClusters,
  kWgmmaGrid,
  kWgmmaRows,
  kFfma,           // either mode, by the bound
  kFfmaCounted,
  kFfmaGrid,
  kPanels,
  kWaves,
};

struct Override {
  Forced route = Forced::kNone;
  int tiles_per_cta = 0;       // wgmma and FFMA: 0 the policy's choice, else 1 or 2 only
  int col_tile = 0;            // the 128-row wgmma kernel: 0 the policy's choice, else 256 or 192 only
  bool panels_batched = true;  // false: one GEMM per workspace block
};

// Parses a forced route's name ("", "wgmma", "wgmma_counted", ...); false for
// an unknown name.
bool parse_forced(const std::string& name, Forced* out);
const char* forced_name(Forced forced);
// The accepted names, for error messages.
const char* forced_names();

struct Plan {
  Route route = Route::kEmpty;
  kernels::RowBlockLaunch groups;  // wgmma and FFMA routes (wgmma_rows: groups of one CTA)
  int64_t counter_bytes = 0;       // counted routes: device memory for the counters
  PanelPlan panels;                // panel routes (CUDA and CPU)
};

Plan plan(const Call& call, const Device& device, const Override& forced = {});

// The error for Route::kUnsupported.
std::string unsupported_message(const Call& call);

}  // namespace make_inplace::square_matmul
