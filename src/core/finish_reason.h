// Why a generated sequence stopped, in OpenAI's finish_reason words. Shared by the scheduler
// (sched/), the stop checker (sample/) and the engine, so it lives in core.
#pragma once

#include <cstdint>

namespace pagellm {

enum class FinishReason : uint8_t {
  kNone = 0,  // still generating
  kStop,      // EOS, a stop token id or a stop string
  kLength,    // max_tokens, or the context limit
  kAbort,     // aborted by the client, or failed by the scheduler
};

// "stop", "length", "abort"; "" for kNone.
const char* finish_reason_name(FinishReason reason);

}  // namespace pagellm
