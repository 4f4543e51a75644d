// CHECK for programmer errors (broken invariants), never for user input: user input gets a Status.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace pagellm::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const char* msg);
}  // namespace pagellm::detail

#define PAGELLM_CHECK(cond)                                                          \
  do {                                                                               \
    if (!(cond)) ::pagellm::detail::check_failed(__FILE__, __LINE__, #cond, nullptr); \
  } while (0)
#define PAGELLM_CHECK_MSG(cond, msg)                                              \
  do {                                                                            \
    if (!(cond)) ::pagellm::detail::check_failed(__FILE__, __LINE__, #cond, msg); \
  } while (0)

#ifdef NDEBUG
#define PAGELLM_DCHECK(cond) ((void)0)
#else
#define PAGELLM_DCHECK(cond) PAGELLM_CHECK(cond)
#endif
