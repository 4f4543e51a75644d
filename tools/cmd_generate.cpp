// pagellm generate: one prompt in, tokens out (batch 1). The JSON contract other checks rely on:
//   pagellm generate --model DIR --prompt-ids 5,17,42 --max-tokens 24 --temperature 0 \
//       --prompt-logprobs --logprobs 1 --json
// prints, as the last line of stdout, {"prompt_logprobs": [null, ...], "token_ids": [...],
// "logprobs": [...]} with natural-log probabilities from the full softmax of the model's raw
// logits; prompt_logprobs[i] = log P(prompt[i] | prompt[:i]).
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "runtime/sequence_runner.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"
#include "tools/args.h"

namespace pagellm::cli {
namespace {

using Clock = std::chrono::steady_clock;

int fail(const Status& s) {
  std::fprintf(stderr, "pagellm generate: %s\n", s.message().c_str());
  return 1;
}

// Reads the sampling options shared by generate-like commands.
Result<SamplingParams> sampling_from_args(const Args& a) {
  SamplingParams p;
  PAGELLM_ASSIGN_OR_RETURN(double t, a.get_double("temperature", 1.0));
  PAGELLM_ASSIGN_OR_RETURN(double tp, a.get_double("top-p", 1.0));
  PAGELLM_ASSIGN_OR_RETURN(double mp, a.get_double("min-p", 0.0));
  PAGELLM_ASSIGN_OR_RETURN(int64_t tk, a.get_int("top-k", -1));
  PAGELLM_ASSIGN_OR_RETURN(double rp, a.get_double("repetition-penalty", 1.0));
  PAGELLM_ASSIGN_OR_RETURN(int64_t mt, a.get_int("max-tokens", 16));
  p.temperature = static_cast<float>(t);
  p.top_p = static_cast<float>(tp);
  p.min_p = static_cast<float>(mp);
  p.top_k = static_cast<int32_t>(tk);
  p.repetition_penalty = static_cast<float>(rp);
  p.max_tokens = static_cast<int32_t>(mt);
  p.ignore_eos = a.flag("ignore-eos");
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

}  // namespace

int run_generate(int argc, char** argv) {
  Args a("generate", {"model", "prompt-ids", "max-tokens", "temperature", "top-p", "top-k", "min-p",
                      "repetition-penalty", "seed", "logprobs", "prompt-logprobs!", "json!",
                      "ignore-eos!", "device"});
  if (Status s = a.parse(argc, argv); !s.ok()) return fail(s);
  if (!a.has("model")) return fail(invalid_argument("--model DIR is required"));
  auto ids = a.get_int_list("prompt-ids");
  if (!ids.ok()) return fail(ids.status());
  if (ids->empty()) return fail(invalid_argument("give the prompt as --prompt-ids 5,17,42"));
  auto params = sampling_from_args(a);
  if (!params.ok()) return fail(params.status());

  auto ckpt = open_checkpoint(*a.get("model"));
  if (!ckpt.ok()) return fail(ckpt.status());
  const ModelConfig& cfg = ckpt->config;
  if (Status s = params->validate(static_cast<int32_t>(cfg.vocab_size)); !s.ok()) return fail(s);

  std::unique_ptr<Backend> backend;
  const std::string device = a.get_or("device", "cpu");
  if (device == "cuda") {
    auto b = make_cuda_backend(0);
    if (!b.ok()) return fail(b.status());
    backend = std::move(*b);
  } else if (device == "cpu") {
    backend = make_cpu_backend();
  } else {
    return fail(invalid_argument("--device must be cpu or cuda, got '" + device + "'"));
  }
  auto model = load_model(*ckpt, *backend);
  if (!model.ok()) return fail(model.status());

  const std::vector<int32_t>& prompt = *ids;
  const int32_t max_tokens = *params->max_tokens;
  const int64_t max_len = static_cast<int64_t>(prompt.size()) + max_tokens;
  if (cfg.max_position_embeddings > 0 && max_len > cfg.max_position_embeddings) {
    return fail(invalid_argument("prompt of " + std::to_string(prompt.size()) + " tokens + " +
                                 std::to_string(max_tokens) + " new tokens exceeds the model's " +
                                 std::to_string(cfg.max_position_embeddings) + "-token context"));
  }
  SequenceRunner runner(**model, *backend, static_cast<int32_t>(max_len));
  const int64_t V = cfg.vocab_size;
  const bool want_prompt_lp = a.flag("prompt-logprobs");

  const auto t0 = Clock::now();
  auto lg = runner.feed(prompt, want_prompt_lp ? LogitsWanted::kAll : LogitsWanted::kLast);
  if (!lg.ok()) return fail(lg.status());
  const auto t_prefill = Clock::now();

  nlohmann::json prompt_lp = nlohmann::json::array({nullptr});
  std::vector<float> row;
  if (want_prompt_lp) {
    const int64_t n = static_cast<int64_t>(prompt.size());
    if (n > 1) {
      std::vector<LogprobsResult> res(n - 1);
      Tensor rows(const_cast<float*>(lg->data()), DType::kF32, {n - 1, V});
      if (Status s = compute_prompt_logprobs(rows, std::span(prompt).subspan(1), 0, res); !s.ok())
        return fail(s);
      for (const auto& r : res) prompt_lp.push_back(r.logprob);
    }
    row.assign(lg->data() + (n - 1) * V, lg->data() + n * V);
  } else {
    row.assign(lg->begin(), lg->end());
  }

  SamplerConfig sc;
  sc.vocab_size = static_cast<int32_t>(V);
  sc.eos_token_ids = cfg.eos_token_ids;
  Sampler sampler(sc);
  const uint64_t seed = params->seed ? derive_sequence_seed(*params->seed, 0) : draw_random_seed();
  std::vector<int32_t> out;
  nlohmann::json logprobs = nlohmann::json::array(), top = nlohmann::json::array();
  const bool want_lp = params->logprobs.has_value();
  while (static_cast<int32_t>(out.size()) < max_tokens) {
    SampleRow sr{&*params, prompt, out, seed};
    SampleOutput so;
    Tensor lt(row.data(), DType::kF32, {1, V});
    if (Status s = sampler.sample(lt, {&sr, 1}, {&so, 1}); !s.ok()) return fail(s);
    if (!so.status.ok()) return fail(so.status);
    out.push_back(so.token);
    if (want_lp) {
      logprobs.push_back(so.logprob);
      nlohmann::json t = nlohmann::json::object();
      for (const auto& e : so.top_logprobs) t[std::to_string(e.token)] = e.logprob;
      top.push_back(t);
    }
    bool stop = false;
    for (int32_t s : params->stop_token_ids) stop |= s == so.token;
    if (!params->ignore_eos)
      for (int32_t e : cfg.eos_token_ids) stop |= e == so.token;
    if (stop || static_cast<int32_t>(out.size()) == max_tokens) break;
    auto next = runner.feed(std::vector<int32_t>{so.token}, LogitsWanted::kLast);
    if (!next.ok()) return fail(next.status());
    row.assign(next->begin(), next->end());
  }
  const auto t_end = Clock::now();

  const double prefill_s = std::chrono::duration<double>(t_prefill - t0).count();
  const double decode_s = std::chrono::duration<double>(t_end - t_prefill).count();
  std::fprintf(stderr, "prefill %zu tokens in %.3f s (%.1f tok/s); %zu tokens in %.3f s (%.1f tok/s)\n",
               prompt.size(), prefill_s, prompt.size() / prefill_s, out.size(), decode_s,
               out.size() > 1 ? (out.size() - 1) / decode_s : 0.0);
  if (a.flag("json")) {
    nlohmann::json j;
    j["token_ids"] = out;
    j["logprobs"] = want_lp ? logprobs : nlohmann::json(nullptr);
    if (want_lp) j["top_logprobs"] = top;
    j["prompt_logprobs"] = want_prompt_lp ? prompt_lp : nlohmann::json(nullptr);
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
  }
  return 0;
}

}  // namespace pagellm::cli
