// Feeds arbitrary bytes to the config.json and generation_config.json parsers, and describes what
// they accept. Errors are fine; crashes, sanitizer reports and uncaught exceptions are not.
#include <cstddef>
#include <cstdint>
#include <string>

#include "io/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  pagellm::Result<pagellm::ModelConfig> cfg = pagellm::parse_hf_config(text, "config.json");
  pagellm::ModelConfig c = cfg.ok() ? *cfg : pagellm::ModelConfig{};
  (void)pagellm::apply_generation_config(text, "generation_config.json", c);
  const std::string d = pagellm::describe(c);
  (void)d;
  return 0;
}
