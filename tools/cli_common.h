// Options and helpers shared by the model-running subcommands (generate, chat, serve, bench).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/engine.h"
#include "runtime/serving_model.h"
#include "sample/sampling_params.h"
#include "tools/args.h"

namespace pagellm::cli {

// --model --device
void add_model_options(std::vector<std::string>& spec);
// --max-num-seqs --max-num-batched-tokens --max-model-len --kv-cache-memory
// --gpu-memory-utilization --block-size --no-prefix-caching --batching --max-waiting
void add_engine_options(std::vector<std::string>& spec);
// --max-tokens --temperature --top-p --top-k --min-p --repetition-penalty --seed --logprobs
// --ignore-eos
void add_sampling_options(std::vector<std::string>& spec);

Result<std::unique_ptr<ServingModel>> load_model_from_args(const Args& a);
Result<EngineConfig> engine_config_from_args(const Args& a);
Result<std::unique_ptr<Engine>> make_engine_from_args(const Args& a, ServingModel& m);
Result<SamplingParams> sampling_from_args(const Args& a);

// Prints "pagellm <command>: <message>" to stderr and returns 1.
int fail(const char* command, const Status& s);

}  // namespace pagellm::cli
