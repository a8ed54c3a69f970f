// The last error message of the calling thread, for callers that get only
// MindSpore's "Return value ... is N" (see bridge.h).
#include <cstdio>

#include "bridge.h"

namespace {
thread_local char last_error[1024] = "";
}  // namespace

void make_inplace::mindspore::set_last_error(const char* text) {
  std::snprintf(last_error, sizeof(last_error), "%s", text);
}

// The message of the calling thread's last failed call ("" if none failed).
MAKE_INPLACE_MS_EXPORT const char* MakeInplaceLastError() { return last_error; }
