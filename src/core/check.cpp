#include "core/check.h"

namespace pagellm::detail {

void check_failed(const char* file, int line, const char* expr, const char* msg) {
  std::fprintf(stderr, "CHECK failed at %s:%d: %s%s%s\n", file, line, expr, msg ? " — " : "",
               msg ? msg : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace pagellm::detail
