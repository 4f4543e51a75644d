#include "io/default_model.h"

#include <cstdlib>

namespace pagellm {

namespace {
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}
}  // namespace

std::string cache_dir() {
  if (const char* c = env("PAGELLM_CACHE")) return c;
  if (const char* x = env("XDG_CACHE_HOME")) return std::string(x) + "/pagellm";
  if (const char* h = env("HOME")) return std::string(h) + "/.cache/pagellm";
  return ".cache/pagellm";
}

std::string default_model_path() { return cache_dir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf"; }

}  // namespace pagellm
