// The message of the last failed call in the process, for callers that get
// only MindSpore's "Return value ... is N" (see bridge.h). Process-wide, not
// per thread: MindSpore launches kernels on its own worker threads.
#include <cstdio>
#include <mutex>

#include "bridge.h"

namespace {
std::mutex last_error_mutex;
char last_error[1024] = "";
char last_error_copy[1024] = "";
}  // namespace

void make_inplace::mindspore::set_last_error(const char* text) {
  std::lock_guard<std::mutex> lock(last_error_mutex);
  std::snprintf(last_error, sizeof(last_error), "%s", text);
}

// The message of the last failed call ("" if none failed). The pointer stays
// valid until the next call of this function.
MAKE_INPLACE_MS_EXPORT const char* MakeInplaceLastError() {
  std::lock_guard<std::mutex> lock(last_error_mutex);
  std::snprintf(last_error_copy, sizeof(last_error_copy), "%s", last_error);
  return last_error_copy;
}
