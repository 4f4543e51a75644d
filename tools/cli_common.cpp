#include "tools/cli_common.h"

#include <cstdio>

namespace pagellm::cli {

void add_model_options(std::vector<std::string>& spec) {
  for (const char* s : {"model", "device", "load-format", "quantization"}) spec.emplace_back(s);
  add_engine_options(spec);
}

void add_engine_options(std::vector<std::string>& spec) {
  for (const char* s :
       {"max-num-seqs", "max-num-batched-tokens", "max-model-len", "kv-cache-memory",
        "gpu-memory-utilization", "block-size", "no-prefix-caching!", "batching", "max-waiting",
        "enforce-eager!", "host-sampling!", "no-plan-ahead!"})
    spec.emplace_back(s);
}

void add_sampling_options(std::vector<std::string>& spec) {
  for (const char* s : {"max-tokens", "temperature", "top-p", "top-k", "min-p", "repetition-penalty",
                        "seed", "logprobs", "ignore-eos!"})
    spec.emplace_back(s);
}

Result<std::unique_ptr<ServingModel>> load_model_from_args(const Args& a) {
  ServingModelOptions o;
  o.model_path = a.get_or("model", "");
  o.device = a.get_or("device", "cpu");
  o.load_format = a.get_or("load-format", "auto");
  o.quantization = a.get_or("quantization", "");
  return load_serving_model(o);
}

Result<EngineConfig> engine_config_from_args(const Args& a) {
  EngineConfig c;
  PAGELLM_ASSIGN_OR_RETURN(int64_t seqs, a.get_int("max-num-seqs", 64));
  PAGELLM_ASSIGN_OR_RETURN(int64_t tokens, a.get_int("max-num-batched-tokens", 2048));
  PAGELLM_ASSIGN_OR_RETURN(int64_t len, a.get_int("max-model-len", 0));
  PAGELLM_ASSIGN_OR_RETURN(int64_t kv, a.get_int("kv-cache-memory", 0));
  PAGELLM_ASSIGN_OR_RETURN(double util, a.get_double("gpu-memory-utilization", 0.9));
  PAGELLM_ASSIGN_OR_RETURN(int64_t bs, a.get_int("block-size", 16));
  PAGELLM_ASSIGN_OR_RETURN(int64_t waiting, a.get_int("max-waiting", 1024));
  if (seqs < 1 || tokens < 1 || len < 0 || kv < 0 || bs < 1 || waiting < 1 || util <= 0 || util > 1)
    return invalid_argument("engine options out of range (sizes must be positive, "
                            "--gpu-memory-utilization in (0, 1])");
  c.scheduler.max_num_seqs = static_cast<int32_t>(seqs);
  c.scheduler.max_num_batched_tokens = static_cast<int32_t>(tokens);
  c.scheduler.max_waiting = static_cast<int32_t>(waiting);
  c.max_model_len = static_cast<int32_t>(len);
  c.kv_cache_memory = kv;
  c.memory_utilization = util;
  c.block_size = static_cast<int32_t>(bs);
  c.enable_prefix_caching = !a.flag("no-prefix-caching");
  c.enforce_eager = a.flag("enforce-eager");
  c.host_sampling = a.flag("host-sampling");
  c.plan_ahead = !a.flag("no-plan-ahead");
  if (a.has("batching")) {
    PAGELLM_ASSIGN_OR_RETURN(c.scheduler.batching, parse_batching_policy(*a.get("batching")));
  }
  return c;
}

Result<std::unique_ptr<Engine>> make_engine_from_args(const Args& a, ServingModel& m) {
  PAGELLM_ASSIGN_OR_RETURN(EngineConfig c, engine_config_from_args(a));
  return Engine::create(*m.model, *m.backend, m.tokenizer.get(), c);
}

Result<SamplingParams> sampling_from_args(const Args& a) {
  SamplingParams p;
  PAGELLM_ASSIGN_OR_RETURN(double t, a.get_double("temperature", 1.0));
  PAGELLM_ASSIGN_OR_RETURN(double tp, a.get_double("top-p", 1.0));
  PAGELLM_ASSIGN_OR_RETURN(double mp, a.get_double("min-p", 0.0));
  PAGELLM_ASSIGN_OR_RETURN(int64_t tk, a.get_int("top-k", -1));
  PAGELLM_ASSIGN_OR_RETURN(double rp, a.get_double("repetition-penalty", 1.0));
  p.temperature = static_cast<float>(t);
  p.top_p = static_cast<float>(tp);
  p.min_p = static_cast<float>(mp);
  p.top_k = static_cast<int32_t>(tk);
  p.repetition_penalty = static_cast<float>(rp);
  p.ignore_eos = a.flag("ignore-eos");
  if (a.has("max-tokens")) {
    PAGELLM_ASSIGN_OR_RETURN(int64_t mt, a.get_int("max-tokens", 16));
    p.max_tokens = static_cast<int32_t>(mt);
  }
  if (a.has("seed")) {
    PAGELLM_ASSIGN_OR_RETURN(int64_t seed, a.get_int("seed", 0));
    p.seed = static_cast<uint64_t>(seed);
  }
  if (a.has("logprobs")) {
    PAGELLM_ASSIGN_OR_RETURN(int64_t lp, a.get_int("logprobs", 0));
    p.logprobs = static_cast<int32_t>(lp);
  }
  return p;
}

int fail(const char* command, const Status& s) {
  std::fprintf(stderr, "pagellm %s: %s\n", command, s.message().c_str());
  return 1;
}

}  // namespace pagellm::cli
