#include "tools/cli_common.h"

#include <cstdio>

namespace pagellm::cli {

OptionGroup model_options() {
  return {
      "Model",
      {{"model", "DIR|FILE",
        "Hugging Face checkpoint folder (config.json, safetensors, tokenizer) or GGUF file; "
        "with --load-format dummy also a config.json alone",
        std::nullopt, "the default model, SmolLM2-135M-Instruct (scripts/fetch-default-model.sh)"},
       {"device", "cpu|cuda", "where the model runs", "cpu"},
       {"load-format", "auto|dummy",
        "auto: the checkpoint's weights; dummy: random weights of the config's shape, for "
        "benchmarks without the weights",
        "auto"},
       {"quantization", "Q",
        "with --load-format dummy: random weights in this format: awq | gptq (4-bit, CPU and "
        "GPU), q4_k (CPU), fp8 (per-channel) | fp8-block (128x128 blocks). A checkpoint's own "
        "quantization is read from the checkpoint",
        std::nullopt, "none (the config's dtype)"}}};
}

OptionGroup cache_options() {
  return {"KV cache",
          {{"max-model-len", "TOKENS", "longest prompt + output a request may have", "0",
            "0 = the model's max_position_embeddings"},
           {"kv-cache-memory", "BYTES",
            "KV cache pool size; units accepted (8GiB, 512MB); 0: the --gpu-memory-utilization "
            "share of the memory left after the weights and a profile run",
            "0"},
           {"gpu-memory-utilization", "FRACTION",
            "with --kv-cache-memory 0: the fraction of the device's (or host's) free memory the KV "
            "pool may take, in (0, 1]",
            "0.9"},
           {"block-size", "TOKENS", "tokens per KV cache block (the paging and prefix-cache unit)",
            "16"},
           {"kv-cache-dtype", "auto|fp8",
            "the KV cache's element type: auto, the activations' (f32 on the CPU, bf16 on a "
            "GPU); fp8 (also fp8_e4m3), float8_e4m3fn with the checkpoint's per-layer "
            "k_scale/v_scale or 1: a byte a value, twice the tokens of bf16 in the same memory "
            "(the CPU backend only, for now)",
            "auto"},
           {"no-prefix-caching", "",
            "turn prefix caching off: requests then never share KV blocks of a common prompt "
            "prefix"}}};
}

OptionGroup scheduler_options() {
  return {"Scheduler",
          {{"max-num-seqs", "N", "most sequences in one step (the decode batch)", "64"},
           {"max-num-batched-tokens", "TOKENS",
            "token budget of one step: decodes first, prompt chunks fill the rest", "2048"},
           {"max-waiting", "N",
            "most requests queued for admission; past it new requests get HTTP 429", "1024"},
           {"batching", "POLICY",
            "continuous (requests join and leave every step), static:B (batches of B that run "
            "to completion) or dynamic:B,T (wait up to T ms to fill B), for comparisons",
            "continuous"},
           {"enforce-eager", "",
            "run every step op by op: no CUDA graphs and no start-up warm-up (debugging)"},
           {"host-sampling", "",
            "sample on the host from downloaded logits even where the device can sample (same "
            "tokens; for comparison)"},
           {"no-plan-ahead", "",
            "wait for each decode step's tokens before queueing the next (for comparison)"}}};
}

OptionGroup speculative_options() {
  return {
      "Speculative decoding",
      {{"speculative-method", "METHOD",
        "guess the next tokens and check them all in one step (outputs unchanged): ngram "
        "(prompt lookup: what followed an earlier occurrence of the last tokens), draft_model "
        "(--speculative-model), mtp (DeepSeek-V3's multi-token-prediction layer, from the "
        "model's own checkpoint), or none",
        "none"},
       {"speculative-model", "DIR|FILE",
        "a smaller model of the same vocabulary that guesses by decoding ahead, greedily "
        "(implies --speculative-method draft_model)",
        std::nullopt, "none"},
       {"num-speculative-tokens", "K", "most tokens guessed per step", "4"},
       {"prompt-lookup-min", "N", "ngram: the shortest run of last tokens looked up", "2"},
       {"prompt-lookup-max", "N", "ngram: the longest run of last tokens looked up (first)", "4"},
       {"speculative-disable-by-batch-size", "N",
        "guess nothing while N or more sequences run (verifying steps run without CUDA graphs, "
        "for the whole batch); 0: always guess",
        "2"}}};
}

OptionGroup sampling_options(const SamplingDefaults& d) {
  return {
      "Sampling",
      {{"max-tokens", "N", "most tokens generated", d.max_tokens, "up to the context limit"},
       {"temperature", "T", "softmax temperature; 0 is greedy", d.temperature},
       {"top-p", "P", "nucleus sampling: the smallest set of tokens with this much mass", d.top_p},
       {"top-k", "K", "sample among the K most likely tokens; -1: all", "-1"},
       {"min-p", "P", "drop tokens below P times the most likely token's probability", "0"},
       {"repetition-penalty", "X",
        "divide the logits of tokens seen so far by X (> 1 repeats less)", "1.0"},
       {"seed", "N", "sampling seed: the same seed and prompt give the same tokens", std::nullopt,
        "drawn per request"},
       {"logprobs", "N", "also return the N most likely tokens' log-probabilities per step",
        std::nullopt, "none"},
       {"ignore-eos", "", "keep generating past the end-of-sequence token"}}};
}

Result<std::unique_ptr<ServingModel>> load_model_from_args(const Args& a) {
  ServingModelOptions o;
  o.model_path = a.str("model");
  o.device = a.str("device");
  o.load_format = a.str("load-format");
  o.quantization = a.str("quantization");
  o.speculative_model = a.str("speculative-model");
  o.load_mtp = a.str("speculative-method") == "mtp";
  return load_serving_model(o);
}

Result<EngineConfig> engine_config_from_args(const Args& a, const ServingModel& m) {
  EngineConfig c;
  PAGELLM_ASSIGN_OR_RETURN(int64_t seqs, a.get_int("max-num-seqs"));
  PAGELLM_ASSIGN_OR_RETURN(int64_t tokens, a.get_int("max-num-batched-tokens"));
  PAGELLM_ASSIGN_OR_RETURN(int64_t len, a.get_int("max-model-len"));
  PAGELLM_ASSIGN_OR_RETURN(int64_t kv, a.get_bytes("kv-cache-memory"));
  PAGELLM_ASSIGN_OR_RETURN(double util, a.get_double("gpu-memory-utilization"));
  PAGELLM_ASSIGN_OR_RETURN(int64_t bs, a.get_int("block-size"));
  PAGELLM_ASSIGN_OR_RETURN(int64_t waiting, a.get_int("max-waiting"));
  if (seqs < 1 || tokens < 1 || len < 0 || kv < 0 || bs < 1 || waiting < 1 || util <= 0 || util > 1)
    return invalid_argument(
        "engine options out of range (sizes must be positive, "
        "--gpu-memory-utilization in (0, 1])");
  c.scheduler.max_num_seqs = static_cast<int32_t>(seqs);
  c.scheduler.max_num_batched_tokens = static_cast<int32_t>(tokens);
  c.scheduler.max_waiting = static_cast<int32_t>(waiting);
  c.max_model_len = static_cast<int32_t>(len);
  c.kv_cache_memory = kv;
  c.memory_utilization = util;
  c.block_size = static_cast<int32_t>(bs);
  c.enable_prefix_caching = !a.flag("no-prefix-caching");
  const std::string kv_dtype = a.str("kv-cache-dtype");
  if (kv_dtype != "auto" && kv_dtype != "fp8" && kv_dtype != "fp8_e4m3")
    return invalid_argument("--kv-cache-dtype must be auto, fp8 or fp8_e4m3, got '" + kv_dtype +
                            "'");
  c.fp8_kv_cache = kv_dtype != "auto";
  c.enforce_eager = a.flag("enforce-eager");
  c.host_sampling = a.flag("host-sampling");
  c.plan_ahead = !a.flag("no-plan-ahead");
  PAGELLM_ASSIGN_OR_RETURN(c.scheduler.batching, parse_batching_policy(a.str("batching")));
  std::string method = a.str("speculative-method");
  if (m.draft_model && method == "none") method = "draft_model";
  if (method == "ngram") {
    c.speculative.method = SpeculativeConfig::Method::kNgram;
  } else if (method == "draft_model") {
    if (!m.draft_model)
      return invalid_argument("--speculative-method draft_model needs --speculative-model");
    c.speculative.method = SpeculativeConfig::Method::kDraftModel;
    c.speculative.draft_model = m.draft_model.get();
  } else if (method == "mtp") {
    if (!m.mtp) return invalid_argument("--speculative-method mtp: no MTP module was loaded");
    c.speculative.method = SpeculativeConfig::Method::kMtp;
    c.speculative.mtp = m.mtp.get();
  } else if (method != "none") {
    return invalid_argument("--speculative-method must be ngram, draft_model, mtp or none, not '" +
                            method + "'");
  }
  if (m.draft_model && method != "draft_model")
    return invalid_argument("--speculative-model is for --speculative-method draft_model");
  PAGELLM_ASSIGN_OR_RETURN(int64_t k, a.get_int("num-speculative-tokens"));
  PAGELLM_ASSIGN_OR_RETURN(int64_t lo, a.get_int("prompt-lookup-min"));
  PAGELLM_ASSIGN_OR_RETURN(int64_t hi, a.get_int("prompt-lookup-max"));
  PAGELLM_ASSIGN_OR_RETURN(int64_t off, a.get_int("speculative-disable-by-batch-size"));
  if (k < 1 || k > 64 || lo < 1 || hi < lo || hi > 64 || off < 0)
    return invalid_argument(
        "speculative options out of range (--num-speculative-tokens in [1, 64], 1 <= "
        "--prompt-lookup-min <= --prompt-lookup-max <= 64, "
        "--speculative-disable-by-batch-size >= 0)");
  c.speculative.num_tokens = static_cast<int32_t>(k);
  c.speculative.ngram = {static_cast<int32_t>(lo), static_cast<int32_t>(hi)};
  c.speculative.disable_by_batch_size = static_cast<int32_t>(off);
  return c;
}

Result<std::unique_ptr<Engine>> make_engine_from_args(const Args& a, ServingModel& m) {
  PAGELLM_ASSIGN_OR_RETURN(EngineConfig c, engine_config_from_args(a, m));
  return Engine::create(*m.model, *m.backend, m.tokenizer.get(), c);
}

Result<SamplingParams> sampling_from_args(const Args& a) {
  SamplingParams p;
  PAGELLM_ASSIGN_OR_RETURN(double t, a.get_double("temperature"));
  PAGELLM_ASSIGN_OR_RETURN(double tp, a.get_double("top-p"));
  PAGELLM_ASSIGN_OR_RETURN(double mp, a.get_double("min-p"));
  PAGELLM_ASSIGN_OR_RETURN(int64_t tk, a.get_int("top-k"));
  PAGELLM_ASSIGN_OR_RETURN(double rp, a.get_double("repetition-penalty"));
  p.temperature = static_cast<float>(t);
  p.top_p = static_cast<float>(tp);
  p.min_p = static_cast<float>(mp);
  p.top_k = static_cast<int32_t>(tk);
  p.repetition_penalty = static_cast<float>(rp);
  p.ignore_eos = a.flag("ignore-eos");
  if (a.get("max-tokens")) {
    PAGELLM_ASSIGN_OR_RETURN(int64_t mt, a.get_int("max-tokens"));
    p.max_tokens = static_cast<int32_t>(mt);
  }
  if (a.get("seed")) {
    PAGELLM_ASSIGN_OR_RETURN(int64_t seed, a.get_int("seed"));
    p.seed = static_cast<uint64_t>(seed);
  }
  if (a.get("logprobs")) {
    PAGELLM_ASSIGN_OR_RETURN(int64_t lp, a.get_int("logprobs"));
    p.logprobs = static_cast<int32_t>(lp);
  }
  return p;
}

int fail(const char* command, const Status& s) {
  std::fprintf(stderr, "pagellm %s: %s\n", command, s.message().c_str());
  return 1;
}

}  // namespace pagellm::cli
