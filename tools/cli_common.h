// Options and helpers shared by the model-running subcommands (generate, chat, serve, bench).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/engine.h"
#include "runtime/serving_model.h"
#include "sample/sampling_params.h"
#include "tools/args.h"

namespace pagellm::cli {

// --model --device --load-format --quantization
OptionGroup model_options();
// --max-model-len --kv-cache-memory --gpu-memory-utilization --block-size --no-prefix-caching
OptionGroup cache_options();
// --max-num-seqs --max-num-batched-tokens --max-waiting --batching --enforce-eager
// --host-sampling --no-plan-ahead
OptionGroup scheduler_options();
// --speculative-method --speculative-model --num-speculative-tokens --prompt-lookup-min
// --prompt-lookup-max --speculative-disable-by-batch-size
OptionGroup speculative_options();
// --max-tokens --temperature --top-p --top-k --min-p --repetition-penalty --seed --logprobs
// --ignore-eos
// The defaults differ by command (chat samples more conservatively than generate).
struct SamplingDefaults {
  std::string temperature = "1.0";
  std::string top_p = "1.0";
  std::optional<std::string> max_tokens = std::nullopt;  // none: up to the context limit
};
OptionGroup sampling_options(const SamplingDefaults& d = {});

Result<std::unique_ptr<ServingModel>> load_model_from_args(const Args& a);
// The engine's settings; `m` gives the draft model of --speculative-model (its ServingModel
// must outlive the engine).
Result<EngineConfig> engine_config_from_args(const Args& a, const ServingModel& m);
Result<std::unique_ptr<Engine>> make_engine_from_args(const Args& a, ServingModel& m);
Result<SamplingParams> sampling_from_args(const Args& a);

// Prints "pagellm <command>: <message>" to stderr and returns 1.
int fail(const char* command, const Status& s);

}  // namespace pagellm::cli
