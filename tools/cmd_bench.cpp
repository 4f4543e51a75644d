// pagellm bench: the engine's own benchmarks.
//   bench latency     batch-1 prefill and decode speed, and achieved GB/s of weight reads against
//                     the machine's measured memory bandwidth (measured in the same run);
//                     --profile adds the per-op time table of a prefill and of a decode step
//   bench throughput  offline throughput of many requests through the engine (like vLLM's
//                     benchmark_throughput): requests/s, total and output tokens/s, mean time to
//                     the first token and per output token, KV and prefix cache statistics;
//                     --temperature T (1.0; 0 greedy); --sequential submits one request at a time
//                     (the first one's TTFT on a fresh engine); --json prints one JSON object last
//   bench serve       open-loop load against an OpenAI-compatible server (cmd_bench_serve.cpp)
//   bench cost        $ per million tokens of `bench serve` reports (cmd_bench_serve.cpp)
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/op_profile.h"
#include "backend/profiling_backend.h"
#include "bench/stats.h"
#include "runtime/engine.h"
#include "runtime/sequence_runner.h"
#include "runtime/serving_model.h"
#include "tokenizer/tokenizer.h"
#include "tools/args.h"
#include "tools/cli_common.h"
#include "tools/cmd_bench_serve.h"

namespace pagellm::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  // Skip the lowest ids, where the special tokens of most vocabularies live.
  std::uniform_int_distribution<int32_t> d(std::min<int64_t>(100, vocab / 2), vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

constexpr const char* kLatencyAbout =
    R"(Batch-1 prefill and decode speed of one sequence, and the achieved GB/s of a decode step against
the memory bandwidth measured in the same run. With device sampling the decode is pipelined as
the serving engine runs it: each step is queued before the host has read the token it takes
(the device hands it over), and its tokens must equal those of one step-by-step pass. Also the
same decode steps queued back to back without sampling ("decode, queued"): the device's own time
a step, so that the difference to the decode figure is what a token costs around the forward
pass (the sampling kernel, and whatever of the token's trip the pipeline does not hide); not with
--profile. With --profile the whole run is eager (no graph replay), timed and profiled alike, so
its decode figures are those of launching every op; run without it for the graph-replayed decode
speed.)";

const Option kPeakTflops{"peak-tflops", "TFLOPS",
                         "the compute ceiling for --profile, TFLOP/s of the activation dtype; 0: "
                         "unknown, the column is left out",
                         std::nullopt, "798 (bf16 dense) on an H200, else 0"};
const Option kProfile{"profile", "",
                      "time every op (eager: no CUDA graphs, each op between two timestamps) and "
                      "print a table per step: op and shape, calls, time, share, GB/s and TFLOP/s "
                      "against the ceilings"};
const Option kJson{"json", "", "also print one JSON object as the last line"};

// The compute ceiling of --profile: --peak-tflops, else a measured figure for known devices.
Result<double> peak_tflops(const Args& a, const std::string& backend_name) {
  // 798 TFLOP/s: the bf16 cuBLASLt GEMM ceiling measured on an H200 (docs/PERF.md).
  const double fallback = backend_name.find("H200") != std::string::npos ? 798.0 : 0.0;
  if (!a.has("peak-tflops")) return fallback;
  auto v = a.get_double("peak-tflops");
  if (!v.ok()) return v.status();
  if (*v < 0) return invalid_argument("--peak-tflops must be >= 0 (0: unknown)");
  return *v;
}

int bench_latency(int argc, char** argv) {
  Args a("bench latency", kLatencyAbout,
         {model_options(),
          {"Workload",
           {{"input-len", "TOKENS", "prompt tokens (random ids)", "128"},
            {"output-len", "TOKENS", "generated tokens, >= 2", "128"},
            {"iters", "N", "timed repetitions after one warm-up; the best is reported", "3"},
            {"seed", "N", "seed of the random prompt", "0"},
            {"max-model-len", "TOKENS",
             "plan the decode graphs for contexts up to this many tokens, as a server of that "
             "max_model_len does; 0 (and least): input + output",
             "0"},
            {"sampling", "device|host",
             "how each next (greedy) token is picked: on the device, as the serving engine does "
             "there (only the id comes back), or on the host from the downloaded logits row",
             std::nullopt, "device where the backend samples, else host"},
            {"step-by-step", "",
             "decode without the pipeline (each token read before the next step is queued), for "
             "comparison"}}},
          {"Output", {kJson, kProfile, kPeakTflops}}});
  if (auto rc = parse_command_line(a, argc, argv)) return *rc;
  const bool profile = a.flag("profile");
  ServingModelOptions o;
  o.model_path = a.str("model");
  o.device = a.str("device");
  o.load_tokenizer = false;
  o.load_format = a.str("load-format");
  o.quantization = a.str("quantization");
  o.profile_ops = profile;
  const auto t_load = Clock::now();
  auto sm = load_serving_model(o);
  if (!sm.ok()) return fail("bench latency", sm.status());
  const double load_s = seconds_since(t_load);
  ServingModel& m = **sm;
  auto in = a.get_int("input-len"), out = a.get_int("output-len"), it = a.get_int("iters");
  auto max_len = a.get_int("max-model-len");
  if (!in.ok() || !out.ok() || !it.ok() || !max_len.ok() || *in < 1 || *out < 2 || *it < 1 ||
      *max_len < 0 || *max_len > INT32_MAX)
    return fail("bench latency",
                invalid_argument("--input-len >= 1, --output-len >= 2, --iters >= 1, "
                                 "0 <= --max-model-len < 2^31"));
  auto peak = peak_tflops(a, m.backend->name());
  if (!peak.ok()) return fail("bench latency", peak.status());
  const int64_t V = m.model->config().vocab_size;
  auto seed = a.get_int("seed");
  if (!seed.ok()) return fail("bench latency", seed.status());
  std::mt19937_64 rng(static_cast<uint64_t>(*seed));
  const auto prompt = random_tokens(rng, *in, V);
  SequenceRunner runner(*m.model, *m.backend,
                        static_cast<int32_t>(std::max<int64_t>(*in + *out, *max_len)), 16, 2048);

  const std::string sampling = a.has("sampling")                ? a.str("sampling")
                               : m.backend->supports_sampling() ? "device"
                                                                : "host";
  if (sampling != "device" && sampling != "host")
    return fail("bench latency", invalid_argument("--sampling must be device or host"));
  if (sampling == "device" && !m.backend->supports_sampling())
    return fail("bench latency", invalid_argument("--sampling device: the " + m.backend->name() +
                                                  " backend samples on the host"));
  // Feeds tokens and returns the greedy next token. On the device the logits stay there and one
  // sampling kernel picks the token, as the engine's step does; on the host the last row comes
  // back whole (vocab f32 values) and is scanned there.
  DeviceSampleRow greedy;
  greedy.flags = kSampleGreedy;
  const bool on_host = sampling == "host";
  // The token of a device sampling call's one row.
  auto sampled_token = [&](uint64_t ticket) -> Result<int32_t> {
    DeviceSampleResult r;
    m.backend->sample_results(ticket, &r);
    if (r.status != DeviceSampleStatus::kOk)
      return internal_error("device sampling failed (status " +
                            std::to_string(static_cast<int>(r.status)) + ")");
    return r.token;
  };
  auto next_token = [&](std::span<const int32_t> tokens) -> Result<int32_t> {
    if (on_host) {
      auto lg = runner.feed(tokens, LogitsWanted::kLast);
      if (!lg.ok()) return lg.status();
      return static_cast<int32_t>(std::max_element(lg->begin(), lg->end()) - lg->begin());
    }
    auto lg = runner.feed_on_device(tokens);
    if (!lg.ok()) return lg.status();
    return sampled_token(m.backend->sample_async(*lg, {&greedy, 1}));
  };
  // Decoding pipelined, as the serving engine does on a device: each step is queued before the
  // token it reads has reached the host (the device hands it over: SequenceRunner::feed_sampled),
  // and the host reads every token one step late. Step by step (each token read before the next
  // step is queued) where sampling is on the host, and once before the timed passes, whose tokens
  // the pipelined passes must reproduce.
  const bool pipelined = !on_host && !a.flag("step-by-step");
  auto decode_pipelined = [&](int32_t first, std::vector<int32_t>& tokens) -> Status {
    auto lg = runner.feed_on_device(std::span<const int32_t>(&first, 1));
    if (!lg.ok()) return lg.status();
    uint64_t ticket = m.backend->sample_async(*lg, {&greedy, 1});
    for (int64_t k = 1; k < *out; ++k) {
      uint64_t next = 0;
      if (k + 1 < *out) {
        auto l = runner.feed_sampled(ticket);
        if (!l.ok()) return l.status();
        next = m.backend->sample_async(*l, {&greedy, 1});
      }
      auto token = sampled_token(ticket);
      if (!token.ok()) return token.status();
      tokens.push_back(*token);
      ticket = next;
    }
    return Status::ok_status();
  };
  // The bandwidth ceiling first: its large copies evict the caches, which the timed runs warm.
  Backend& device = m.profiler ? m.profiler->inner() : *m.backend;
  const double bw = measure_memory_bandwidth_gbs(device);
  // best_first_decode: the decode step right after the prompt, the step --profile times.
  double best_prefill = 1e30, best_decode = 1e30, best_first_decode = 1e30;
  std::vector<int32_t> step_by_step_tokens, tokens;
  for (int64_t i = 0; i < *it + 1; ++i) {  // the first pass warms up, step by step
    runner.reset();
    auto t0 = Clock::now();
    auto first = next_token(prompt);
    if (!first.ok()) return fail("bench latency", first.status());
    const double prefill = seconds_since(t0);
    int32_t tok = *first;
    t0 = Clock::now();
    double first_decode = 0;
    tokens.clear();
    if (pipelined && i > 0) {
      if (Status s = decode_pipelined(tok, tokens); !s.ok()) return fail("bench latency", s);
    } else {
      for (int64_t k = 1; k < *out; ++k) {
        auto next = next_token(std::span<const int32_t>(&tok, 1));
        if (!next.ok()) return fail("bench latency", next.status());
        tok = *next;
        tokens.push_back(tok);
        if (k == 1) first_decode = seconds_since(t0);
      }
    }
    const double decode = seconds_since(t0);
    if (i == 0) {
      step_by_step_tokens = tokens;
      continue;
    }
    if (tokens != step_by_step_tokens)
      return fail("bench latency", internal_error("the pipelined decode picked other tokens than "
                                                  "the step-by-step decode of the same prompt"));
    best_prefill = std::min(best_prefill, prefill);
    best_decode = std::min(best_decode, decode);
    if (!pipelined) best_first_decode = std::min(best_first_decode, first_decode);
  }
  // --profile's reference for the first decode step: one step by itself.
  if (profile && pipelined) {
    runner.reset();
    auto first = next_token(prompt);
    if (!first.ok()) return fail("bench latency", first.status());
    const int32_t tok = *first;
    const auto t0 = Clock::now();
    auto next = next_token(std::span<const int32_t>(&tok, 1));
    if (!next.ok()) return fail("bench latency", next.status());
    best_first_decode = seconds_since(t0);
  }
  // The same decode steps back to back, each fed the prompt's next token without sampling or
  // waiting for it: the host queues step k + 1 while the device runs step k, so this is the
  // device's own time a step. Its difference from the decode above is what a token costs outside
  // the forward pass: the sampling kernel, the token's trip to the host and the host's work
  // before it queues the next step. Not with --profile: its steps are eager and timed op by op,
  // so nothing would be queued.
  double best_back_to_back = 1e30;
  for (int64_t i = 0; i < (profile ? 0 : std::min<int64_t>(*it, 2)); ++i) {
    runner.reset();
    auto first = next_token(prompt);
    if (!first.ok()) return fail("bench latency", first.status());
    const int32_t tok = *first;
    const auto t0 = Clock::now();
    for (int64_t k = 1; k < *out; ++k) {
      auto lg = runner.feed_on_device(std::span<const int32_t>(&tok, 1));
      if (!lg.ok()) return fail("bench latency", lg.status());
    }
    m.backend->synchronize();
    best_back_to_back = std::min(best_back_to_back, seconds_since(t0));
  }
  const double prefill_tps = *in / best_prefill;
  const double decode_tps = (*out - 1) / best_decode;
  const KvSpec kv = m.model->kv_spec();
  // Bytes a decode step reads: the weights, plus the KV cache of the context (its mean length).
  const double kv_bytes = static_cast<double>(kv.n_layers) *
                          kv.token_bytes_per_layer(dtype_bytes(m.backend->activation_dtype(), 1)) *
                          (*in + *out / 2.0);
  const double bytes_per_token = static_cast<double>(m.model->decode_weight_bytes()) + kv_bytes;
  const double achieved = bytes_per_token * decode_tps / 1e9;
  std::printf("model            %s\n", m.path.c_str());
  std::printf("backend          %s, load %.2f s, sampling on the %s\n", m.backend->name().c_str(),
              load_s, sampling.c_str());
  // The profiling decorator records no graphs, so every step of this run is eager: the decode
  // figures are those of launching each op, not of graph replay.
  if (profile) std::printf("mode             eager (--profile: no CUDA graphs in any step)\n");
  std::printf("prefill          %lld tokens: %.1f ms, %.1f tok/s\n", static_cast<long long>(*in),
              best_prefill * 1e3, prefill_tps);
  std::printf("decode           %lld tokens: %.2f ms/token, %.1f tok/s (%s)\n",
              static_cast<long long>(*out - 1), best_decode * 1e3 / (*out - 1), decode_tps,
              pipelined ? "pipelined: each step queued before the host reads the token before it"
                        : "step by step");
  if (!profile)
    std::printf(
        "decode, queued   %.2f ms/token, %.1f tok/s (steps back to back, no sampling: the "
        "device's step)\n",
        best_back_to_back * 1e3 / (*out - 1), (*out - 1) / best_back_to_back);
  std::printf("bytes/token      %.1f MB weights + %.1f MB KV\n",
              m.model->decode_weight_bytes() / 1e6, kv_bytes / 1e6);
  std::printf("achieved         %.1f GB/s of %.1f GB/s measured (%.0f%%)\n", achieved, bw,
              100.0 * achieved / bw);

  // --profile: the same prefill and first decode step again, every op timed; the first profiled
  // pass warms the timing path (timer resources are made on first use) and is discarded.
  std::optional<OpProfileTable> prefill_table, decode_table;
  if (profile) {
    ProfilingBackend& prof = *m.profiler;
    std::vector<OpSample> prefill_ops, decode_ops;
    for (int pass = 0; pass < 2; ++pass) {
      runner.reset();
      prof.start();
      auto first = next_token(prompt);
      if (!first.ok()) return fail("bench latency", first.status());
      prefill_ops = prof.stop();
      const int32_t tok = *first;
      prof.start();
      auto next = next_token(std::span<const int32_t>(&tok, 1));
      if (!next.ok()) return fail("bench latency", next.status());
      decode_ops = prof.stop();
    }
    const OpCeilings ceilings{bw, *peak};
    prefill_table = summarize_ops("prefill, " + std::to_string(*in) + " tokens", prefill_ops,
                                  best_prefill * 1e3, ceilings);
    decode_table = summarize_ops("decode step, context " + std::to_string(*in + 1), decode_ops,
                                 best_first_decode * 1e3, ceilings);
    std::printf(
        "\nper-op profile (ops one by one, no CUDA graphs; times between timestamps on the %s "
        "timeline)\n\n%s\n%s",
        device.device() == Device::kCpu ? "host" : "device",
        format_op_table(*prefill_table).c_str(), format_op_table(*decode_table).c_str());
  }
  if (a.flag("json")) {
    nlohmann::json j = {{"prefill_tokens_per_s", prefill_tps},
                        {"decode_tokens_per_s", decode_tps},
                        {"decode_gb_per_s", achieved},
                        {"memory_bandwidth_gb_per_s", bw},
                        {"bandwidth_fraction", achieved / bw},
                        {"input_len", *in},
                        {"output_len", *out},
                        {"load_seconds", load_s},
                        {"sampling", sampling},
                        {"pipelined", pipelined}};
    if (profile)
      j["profile"] = {{"prefill", op_table_json(*prefill_table)},
                      {"decode", op_table_json(*decode_table)}};
    else
      j["decode_back_to_back_tokens_per_s"] = (*out - 1) / best_back_to_back;
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

// One offline run: every request submitted at once (or, sequential, each when the one before has
// finished), and what came back.
struct OfflineRun {
  double elapsed_s = 0;
  int64_t failed = 0, prompt_tokens = 0, output_tokens = 0;
  // Each request's time to its first token and to its last, from its submission, and its token
  // count (bench/stats.h's RequestResult): TTFT, and TPOT as a streaming client sees it.
  std::vector<bench::RequestResult> timing;
  std::vector<std::vector<int32_t>> outputs;  // each request's tokens, when asked for
};

Result<OfflineRun> run_offline(Engine& engine, const std::vector<EngineRequest>& reqs,
                               bool sequential, bool keep_outputs) {
  OfflineRun run;
  std::mutex mu;
  std::condition_variable cv;
  int64_t done = 0;
  std::vector<Clock::time_point> submitted(reqs.size());
  run.timing.resize(reqs.size());
  run.outputs.resize(keep_outputs ? reqs.size() : 0);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (sequential) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done == static_cast<int64_t>(i); });
    }
    submitted[i] = Clock::now();
    auto id = engine.submit(reqs[i], [&, i](EngineOutput&& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (!ev.token_ids.empty()) {
        bench::RequestResult& t = run.timing[i];
        t.latency_s = seconds_since(submitted[i]);
        if (t.output_tokens == 0) t.ttft_s = t.latency_s;
        t.ok = true;
        t.output_tokens += static_cast<int64_t>(ev.token_ids.size());
        if (keep_outputs)
          run.outputs[i].insert(run.outputs[i].end(), ev.token_ids.begin(), ev.token_ids.end());
      }
      if (!ev.request_done) return;
      ++done;
      if (!ev.error.ok()) ++run.failed;
      run.prompt_tokens += ev.prompt_tokens;
      run.output_tokens += ev.completion_tokens;
      cv.notify_all();
    });
    if (!id.ok()) {  // the ones submitted finish before the engine may go
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done == static_cast<int64_t>(i); });
      return id.status();
    }
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == static_cast<int64_t>(reqs.size()); });
  run.elapsed_s = seconds_since(t0);
  return run;
}

int bench_throughput(int argc, char** argv) {
  // --profile: every op of the whole run timed (eager, no CUDA graphs), summed per op kind and
  // weight shape: where an offline run's time goes.
  Args a(
      "bench throughput",
      "Offline throughput of many requests through the engine (like vLLM's offline benchmark):\n"
      "requests/s, total and output tokens/s, mean time to the first token and per output\n"
      "token, KV and prefix cache statistics, and the host's share of the steps.",
      {model_options(),
       {"Workload",
        {{"num-prompts", "N", "requests, all submitted at once", "64"},
         {"input-len", "TOKENS", "prompt tokens of each request (random ids)", "128"},
         {"output-len", "TOKENS", "generated tokens of each request (end of sequence ignored)",
          "128"},
         {"shared-prefix-len", "TOKENS", "leading prompt tokens every request shares", "0"},
         {"dataset", "FILE.jsonl",
          "prompts from a file instead, one {\"prompt\": ..., \"max_tokens\": N} a line",
          std::nullopt, "random prompts"},
         {"seed", "N", "seed of the random prompts and of sampling", "0"},
         {"temperature", "T", "sampling temperature; 0 is greedy", "1.0"},
         {"logit-bias", "TOKEN:BIAS,...",
          "add BIAS to TOKEN's logit in every request (e.g. make random weights repeat a token, so "
          "that prompt lookup guesses right: speculation's cost at high acceptance)",
          std::nullopt, "none"},
         {"sequential", "",
          "submit one request at a time (the first one's TTFT on a fresh engine)"},
         {"tokenizer", "PATH",
          "use this tokenizer (tokenizer.json, .model, .gguf or a folder), e.g. beside "
          "--load-format dummy weights for --json-schema or --dataset",
          std::nullopt, "the model's own"},
         {"json-schema", "FILE",
          "constrain every request's output to this JSON schema (structured output); the "
          "report adds its compile time. Requests end when their JSON does",
          std::nullopt, "unconstrained"},
         {"unconstrained-baseline", "",
          "with --json-schema: then run new prompts of the same lengths unconstrained, each "
          "generating as many tokens as its constrained counterpart did, and report the "
          "constrained run's output tok/s against theirs (the grammar's cost on the same work)"}}},
       {"Output", {kJson, kProfile, kPeakTflops}},
       cache_options(),
       scheduler_options(),
       speculative_options()});
  if (auto rc = parse_command_line(a, argc, argv)) return *rc;
  ServingModelOptions o;
  o.model_path = a.str("model");
  o.device = a.str("device");
  o.load_tokenizer = (a.has("dataset") || a.has("json-schema")) && !a.has("tokenizer");
  o.load_format = a.str("load-format");
  o.quantization = a.str("quantization");
  o.speculative_model = a.str("speculative-model");
  o.load_mtp = a.str("speculative-method") == "mtp";
  const bool profile = a.flag("profile");
  o.profile_ops = profile;
  auto sm = load_serving_model(o);
  if (!sm.ok()) return fail("bench throughput", sm.status());
  ServingModel& m = **sm;
  if (a.has("tokenizer")) {
    auto t = load_tokenizer(a.str("tokenizer"));
    if (!t.ok()) return fail("bench throughput", t.status());
    m.tokenizer = std::move(*t);
  }
  auto peak = peak_tflops(a, m.backend->name());
  if (!peak.ok()) return fail("bench throughput", peak.status());
  auto n = a.get_int("num-prompts"), in = a.get_int("input-len"), out = a.get_int("output-len"),
       shared = a.get_int("shared-prefix-len");
  if (!n.ok() || !in.ok() || !out.ok() || !shared.ok() || *n < 1 || *in < 1 || *out < 1 ||
      *shared < 0 || *shared > *in)
    return fail("bench throughput",
                invalid_argument("sizes must be positive, shared prefix <= input"));
  // Sampling: 1.0 by default, as vLLM's offline benchmark samples; 0 is greedy.
  auto temperature = a.get_double("temperature");
  if (!temperature.ok() || *temperature < 0)
    return fail("bench throughput", invalid_argument("--temperature must be >= 0"));
  const int64_t V = m.model->config().vocab_size;
  auto seed = a.get_int("seed");
  if (!seed.ok()) return fail("bench throughput", seed.status());
  std::mt19937_64 rng(static_cast<uint64_t>(*seed));

  // Requests: random token prompts (optionally sharing a prefix), or a JSONL of {"prompt": ...}.
  std::vector<EngineRequest> reqs;
  if (a.has("dataset")) {
    if (!m.tokenizer)
      return fail("bench throughput", invalid_argument("--dataset needs a tokenizer"));
    std::ifstream f(a.str("dataset"));
    if (!f) return fail("bench throughput", not_found("cannot read " + a.str("dataset")));
    std::string line;
    while (static_cast<int64_t>(reqs.size()) < *n && std::getline(f, line)) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("prompt") || !j["prompt"].is_string())
        return fail("bench throughput",
                    invalid_argument("dataset lines must be {\"prompt\": \"...\"}"));
      auto ids = m.tokenizer->encode(j["prompt"].get<std::string>(), true);
      if (!ids.ok()) return fail("bench throughput", ids.status());
      EngineRequest r;
      r.prompt = std::move(*ids);
      r.params.max_tokens = j.contains("max_tokens") ? j["max_tokens"].get<int32_t>() : *out;
      reqs.push_back(std::move(r));
    }
  } else {
    const auto prefix = random_tokens(rng, *shared, V);
    for (int64_t i = 0; i < *n; ++i) {
      EngineRequest r;
      r.prompt = prefix;
      const auto rest = random_tokens(rng, *in - *shared, V);
      r.prompt.insert(r.prompt.end(), rest.begin(), rest.end());
      r.params.max_tokens = static_cast<int32_t>(*out);
      reqs.push_back(std::move(r));
    }
  }
  std::vector<LogitBias> bias;
  if (a.has("logit-bias")) {
    std::stringstream list(a.str("logit-bias"));
    for (std::string item; std::getline(list, item, ',');) {
      const size_t colon = item.find(':');
      char* end = nullptr;
      LogitBias b;
      b.token = static_cast<int32_t>(std::strtol(item.c_str(), &end, 10));
      if (colon == std::string::npos || end != item.c_str() + colon || b.token < 0 || b.token >= V)
        return fail("bench throughput",
                    invalid_argument("--logit-bias takes TOKEN:BIAS pairs with tokens below " +
                                     std::to_string(V) + ", got '" + item + "'"));
      b.bias = std::strtof(item.c_str() + colon + 1, &end);
      if (*end != '\0')
        return fail("bench throughput",
                    invalid_argument("--logit-bias: bad bias in '" + item + "'"));
      bias.push_back(b);
    }
  }
  for (auto& r : reqs) {
    r.params.logit_bias = bias;
    r.params.temperature = static_cast<float>(*temperature);
    r.params.seed = static_cast<uint64_t>(*seed);
    r.params.ignore_eos = true;
    r.detokenize = false;
  }

  auto cfg = engine_config_from_args(a, m);
  if (!cfg.ok()) return fail("bench throughput", cfg.status());
  // Offline: every request is queued at once.
  cfg->scheduler.max_waiting =
      std::max<int32_t>(cfg->scheduler.max_waiting, static_cast<int32_t>(reqs.size()));
  if (cfg->max_model_len == 0) {
    int64_t longest = 0;
    for (const auto& r : reqs)
      longest = std::max<int64_t>(longest, r.prompt.size() + *r.params.max_tokens);
    cfg->max_model_len =
        static_cast<int32_t>(std::min<int64_t>(longest, m.model->config().max_position_embeddings));
  }
  auto engine = Engine::create(*m.model, *m.backend, m.tokenizer.get(), *cfg);
  if (!engine.ok()) return fail("bench throughput", engine.status());
  // --json-schema: compiled once, as a server does for the first request with a new schema.
  double compile_s = 0;
  if (a.has("json-schema")) {
    std::ifstream f(a.str("json-schema"));
    if (!f) return fail("bench throughput", not_found("cannot read " + a.str("json-schema")));
    std::stringstream text;
    text << f.rdbuf();
    if (!(*engine)->grammars())
      return fail("bench throughput", invalid_argument("--json-schema needs the model's tokenizer"));
    const auto tc = Clock::now();
    auto g = (*engine)->grammars()->compile({GrammarKind::kJsonSchema, text.str()});
    compile_s = seconds_since(tc);
    if (!g.ok()) return fail("bench throughput", g.status());
    for (auto& r : reqs) r.grammar = *g;
  }

  // The ceilings of --profile, measured before the run (the copies evict the caches).
  OpCeilings ceilings;
  if (profile) {
    ceilings = {measure_memory_bandwidth_gbs(m.profiler->inner()), *peak};
    m.profiler->start();  // the engine is idle until the first submit
  }

  // --json-schema: each request's tokens, to check that its text parses.
  const bool structured = a.has("json-schema");
  // --sequential: each request is submitted when the one before has finished (one at a time, as a
  // single client would), so the first request's TTFT, on an engine that has served nothing yet,
  // compares with the same request's on a warm one.
  const bool sequential = a.flag("sequential");
  auto ran = run_offline(**engine, reqs, sequential, structured);
  if (!ran.ok()) return fail("bench throughput", ran.status());
  const double elapsed = ran->elapsed_s;
  const int64_t failed = ran->failed, prompt_tokens = ran->prompt_tokens,
                output_tokens = ran->output_tokens;
  const std::vector<bench::RequestResult>& timing = ran->timing;
  std::vector<std::vector<int32_t>>& outputs = ran->outputs;
  std::optional<OpProfileTable> run_table;
  if (profile) {
    std::vector<OpSample> ops = m.profiler->stop();  // every request is done: the engine is idle
    for (OpSample& op : ops) op.shape = step_independent_shape(op);
    run_table = summarize_ops("offline run, " + std::to_string(reqs.size()) +
                                  " requests (eager, every op timed; sizes summed over steps)",
                              ops, elapsed * 1e3, ceilings);
    // The run itself was profiled: the gap is host work (scheduling, sampling) plus launches.
    run_table->wall_of = "the same run";
  }
  // --unconstrained-baseline: the same work without the grammar. New prompts (the constrained
  // ones' blocks are in the prefix cache) of the same lengths; each request's max_tokens is the
  // number of tokens its constrained counterpart generated (ignore_eos keeps it going that far).
  const bool baseline = structured && a.flag("unconstrained-baseline");
  if (a.flag("unconstrained-baseline") && !structured)
    return fail("bench throughput",
                invalid_argument("--unconstrained-baseline needs --json-schema"));
  if (baseline && profile)
    return fail("bench throughput",
                invalid_argument("--unconstrained-baseline and --profile: profile one run"));
  // The constrained run's engine counts: taken before the baseline runs (its last step's counts
  // may be published after its last request finished: a step's error), else once the engine's
  // thread has ended.
  std::optional<EngineStats> first_stats;
  if (baseline) first_stats = (*engine)->stats();
  std::optional<OfflineRun> base;
  if (baseline) {
    std::vector<EngineRequest> same;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (timing[i].output_tokens == 0) continue;  // failed
      EngineRequest r = reqs[i];
      r.grammar = nullptr;
      r.prompt = random_tokens(rng, static_cast<int64_t>(r.prompt.size()), V);
      r.params.max_tokens = static_cast<int32_t>(timing[i].output_tokens);
      same.push_back(std::move(r));
    }
    auto b = run_offline(**engine, same, sequential, false);
    if (!b.ok()) return fail("bench throughput", b.status());
    base = std::move(*b);
  }
  (*engine)->shutdown();  // its last step's counts are in once its thread has ended
  const EngineStats st = first_stats ? *first_stats : (*engine)->stats();
  const double rps = reqs.size() / elapsed;
  const double total_tps = (prompt_tokens + output_tokens) / elapsed;
  const double out_tps = output_tokens / elapsed;
  std::vector<double> ttfts_ms, tpots_ms;  // of the requests that produced tokens
  for (const bench::RequestResult& t : timing) {
    if (t.output_tokens == 0) continue;
    ttfts_ms.push_back(1e3 * t.ttft_s);
    if (const auto tpot = bench::tpot_s(t)) tpots_ms.push_back(1e3 * *tpot);
  }
  const double ttft_ms = bench::summarize(ttfts_ms).mean, tpot_ms = bench::summarize(tpots_ms).mean;
  // The first request's TTFT, and the mean of the later ones' (0 unless both have tokens).
  const bool first_has_tokens = timing[0].output_tokens > 0;
  const double first_ttft_ms = first_has_tokens ? ttfts_ms[0] : 0;
  const double later_ms =
      first_has_tokens ? bench::summarize({ttfts_ms.begin() + 1, ttfts_ms.end()}).mean : 0;
  std::printf("requests         %zu (%lld failed) in %.2f s\n", reqs.size(),
              static_cast<long long>(failed), elapsed);
  std::printf("throughput       %.2f requests/s, %.1f total tok/s, %.1f output tok/s\n", rps,
              total_tps, out_tps);
  std::printf("latency          mean TTFT %.2f ms, mean TPOT %.3f ms (%.1f tok/s a request)\n",
              ttft_ms, tpot_ms, tpot_ms > 0 ? 1e3 / tpot_ms : 0.0);
  if (sequential && later_ms > 0) {
    std::printf("first request    TTFT %.2f ms, %.2fx the later requests' mean of %.2f ms\n",
                first_ttft_ms, first_ttft_ms / later_ms, later_ms);
  }
  std::printf(
      "engine           %lld steps (%lld planned ahead), busy %.1f%%, %lld preemptions, "
      "max-num-seqs %d\n",
      static_cast<long long>(st.steps), static_cast<long long>(st.steps_planned_ahead),
      100.0 * st.busy_seconds / elapsed, static_cast<long long>(st.scheduler.n_preemptions),
      cfg->scheduler.max_num_seqs);
  std::printf(
      "host work        %.1f%% of the run, %.3f ms a step (scheduling and packing before a "
      "step's forward, its tokens' handling after: the device idles meanwhile)\n",
      100.0 * st.host_seconds / elapsed,
      st.steps > 0 ? 1e3 * st.host_seconds / static_cast<double>(st.steps) : 0.0);
  std::printf("kv cache         %lld blocks of %lld bytes\n",
              static_cast<long long>(st.n_kv_blocks), static_cast<long long>(st.kv_block_bytes));
  std::printf("prefix cache     %lld of %lld prompt tokens hit (%.1f%%)\n",
              static_cast<long long>(st.scheduler.prefix.hits),
              static_cast<long long>(st.scheduler.prefix.queries),
              100.0 * st.scheduler.prefix.hit_rate());
  // Structured outputs: the texts the grammar completed (they end with its stop token; the others
  // reached max_tokens first), and how many of those parse as JSON.
  int64_t n_complete = 0, n_json = 0;
  for (std::vector<int32_t>& ids : outputs) {
    const auto& eos = m.model->config().eos_token_ids;
    if (ids.empty() || std::find(eos.begin(), eos.end(), ids.back()) == eos.end()) continue;
    ids.pop_back();
    ++n_complete;
    auto text = m.tokenizer->decode(ids, true);
    n_json += text.ok() && !nlohmann::json::parse(*text, nullptr, false).is_discarded() ? 1 : 0;
  }
  if (a.has("json-schema")) {
    std::printf(
        "structured       %lld of %zu outputs complete (the others reached max_tokens), "
        "%lld of them parse as JSON\n",
        static_cast<long long>(n_complete), outputs.size(), static_cast<long long>(n_json));
    std::printf("structured       every request bound to %s: compiled in %.1f ms; masks %.3f ms "
                "a step over %lld steps\n",
                a.str("json-schema").c_str(), 1e3 * compile_s,
                st.grammar_mask_steps > 0 ? 1e3 * st.grammar_mask_seconds /
                                                static_cast<double>(st.grammar_mask_steps)
                                          : 0.0,
                static_cast<long long>(st.grammar_mask_steps));
  }
  const double base_out_tps = base ? static_cast<double>(base->output_tokens) / base->elapsed_s : 0;
  if (base) {
    std::printf(
        "unconstrained    the same lengths without the grammar: %lld output tokens in %.2f s, "
        "%.1f output tok/s; constrained at %.1f%% of it\n",
        static_cast<long long>(base->output_tokens), base->elapsed_s, base_out_tps,
        100.0 * out_tps / base_out_tps);
  }
  const bool speculating = !st.spec_accepted_per_position.empty();
  const double spec_rate = st.spec_draft_tokens > 0 ? static_cast<double>(st.spec_accepted_tokens) /
                                                          static_cast<double>(st.spec_draft_tokens)
                                                    : 0.0;
  // Tokens a verifying step yields on average: its right guesses plus the model's own token.
  const double spec_len = st.spec_drafts > 0 ? 1.0 + static_cast<double>(st.spec_accepted_tokens) /
                                                         static_cast<double>(st.spec_drafts)
                                             : 0.0;
  if (speculating) {
    std::printf(
        "speculative      %lld drafts of %lld tokens, %lld right (acceptance %.1f%%, "
        "mean accepted length %.2f); drafting %.3f s\n",
        static_cast<long long>(st.spec_drafts), static_cast<long long>(st.spec_draft_tokens),
        static_cast<long long>(st.spec_accepted_tokens), 100.0 * spec_rate, spec_len,
        st.spec_draft_seconds);
  }
  if (run_table) std::printf("\n%s", format_op_table(*run_table).c_str());
  if (a.flag("json")) {
    nlohmann::json j = {{"requests_per_s", rps},
                        {"total_tokens_per_s", total_tps},
                        {"output_tokens_per_s", out_tps},
                        {"num_requests", reqs.size()},
                        {"failed", failed},
                        {"elapsed_s", elapsed},
                        {"mean_ttft_ms", ttft_ms},
                        {"mean_tpot_ms", tpot_ms},
                        {"first_ttft_ms", first_ttft_ms},
                        {"later_ttft_ms", later_ms},
                        {"prompt_tokens", prompt_tokens},
                        {"output_tokens", output_tokens},
                        {"max_num_seqs", cfg->scheduler.max_num_seqs},
                        {"preemptions", st.scheduler.n_preemptions},
                        {"prefix_cache_queries", st.scheduler.prefix.queries},
                        {"prefix_cache_hits", st.scheduler.prefix.hits},
                        {"kv_blocks", st.n_kv_blocks},
                        {"engine_steps", st.steps},
                        {"engine_steps_planned_ahead", st.steps_planned_ahead},
                        {"engine_host_seconds", st.host_seconds}};
    if (a.has("json-schema")) {
      j["grammar_compile_seconds"] = compile_s;
      j["grammar_mask_seconds"] = st.grammar_mask_seconds;
      j["grammar_mask_steps"] = st.grammar_mask_steps;
      j["json_outputs_complete"] = n_complete;
      j["json_outputs_parsed"] = n_json;
    }
    if (base) {
      j["unconstrained_output_tokens"] = base->output_tokens;
      j["unconstrained_elapsed_s"] = base->elapsed_s;
      j["unconstrained_output_tokens_per_s"] = base_out_tps;
    }
    if (speculating) {
      j["spec_drafts"] = st.spec_drafts;
      j["spec_draft_tokens"] = st.spec_draft_tokens;
      j["spec_accepted_tokens"] = st.spec_accepted_tokens;
      j["spec_acceptance_rate"] = spec_rate;
      j["spec_mean_accepted_length"] = spec_len;
      j["spec_draft_seconds"] = st.spec_draft_seconds;
    }
    if (run_table) j["profile"] = op_table_json(*run_table);
    std::printf("%s\n", j.dump().c_str());
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

int run_bench(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "latency") return bench_latency(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "throughput")
    return bench_throughput(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "serve") return bench_serve(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "cost") return bench_cost(argc - 1, argv + 1);
  const bool help = argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h");
  std::fprintf(help ? stdout : stderr,
               "usage: pagellm bench latency|throughput|serve|cost [options]\n"
               "  latency     batch-1 prefill and decode speed against the memory bandwidth\n"
               "  throughput  offline throughput of many requests through the engine\n"
               "  serve       open-loop load against an OpenAI-compatible server\n"
               "  cost        $ per million tokens of `bench serve` reports\n"
               "pagellm bench <kind> --help lists a kind's options.\n");
  return help ? 0 : 2;
}

}  // namespace pagellm::cli
