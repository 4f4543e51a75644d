#include "core/tuning.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "core/check.h"
#include "core/log.h"

namespace pagellm::tuning {
namespace {

Setting switch_of(std::string_view name, bool fallback, std::string_view what) {
  Setting s;
  s.name = name;
  s.kind = Kind::kSwitch;
  s.fallback = fallback ? 1 : 0;
  s.what = what;
  return s;
}

Setting int_of(std::string_view name, int64_t fallback, bool (*valid)(int64_t),
               std::string_view what) {
  Setting s;
  s.name = name;
  s.kind = Kind::kInt;
  s.fallback = fallback;
  s.valid = valid;
  s.what = what;
  return s;
}

Setting words_of(std::string_view name, std::string_view fallback,
                 std::vector<std::string_view> words, bool list, std::string_view what) {
  Setting s;
  s.name = name;
  s.kind = Kind::kWords;
  s.fallback_words = fallback;
  s.words = std::move(words);
  s.list = list;
  s.what = what;
  return s;
}

// The table. Defaults that are a kernel's own constants (kMinChunk, kMaxCluster, kDefaultStages)
// are CHECKed against them where the kernel reads the setting.
std::vector<Setting> make_table() {
  return {
      // --- CPU backend and its thread pool ---
      int_of(
          "PAGELLM_NUM_THREADS", 0, [](int64_t v) { return v >= 0 && v <= 4096; },
          "threads of the CPU thread pool; 0: one per hardware thread"),
      int_of(
          "PAGELLM_SPIN_US", 200, [](int64_t v) { return v >= 0 && v <= 1000000; },
          "microseconds an idle pool thread polls for work before it blocks"),
      words_of("PAGELLM_CPU_ISA", "avx512", {"avx512", "avx2", "none"}, false,
               "the widest CPU kernels allowed (never more than the CPU has); none: plain loops"),
      int_of(
          "PAGELLM_GEMV_PREFETCH", 2048, [](int64_t v) { return v >= 0 && v <= 65536; },
          "bytes ahead of its reads the CPU GEMV prefetches weights; 0: no prefetch"),
      // --- CUDA: launches ---
      switch_of("PAGELLM_CUDA_PDL", true,
                "kernels launch overlapped with the one before (programmatic launch, sm_90)"),
      switch_of("PAGELLM_EARLY_RELEASE", true,
                "standalone norms and the MoE combine let the next kernel launch before their "
                "own wait"),
      // --- CUDA: batch-1 projections ---
      switch_of("PAGELLM_STREAM_CHAIN", true,
                "a one-row layer's projections run as one streamed launch (gemv_stream.cu)"),
      int_of(
          "PAGELLM_STREAM_STAGES", 3, [](int64_t v) { return v >= 2 && v <= 6; },
          "weight stages in flight in the streamed chain's ring"),
      words_of("PAGELLM_GEMV_FUSIONS", "swiglu", {"swiglu", "fold", "none"}, true,
               "steps the decode GEMV takes in: swiglu (its epilogue), fold (norm weights "
               "folded into the projections at load); none"),
      int_of(
          "PAGELLM_GEMV_MIN_BLOCKS", 0, [](int64_t v) { return v == 0 || v == 1 || v == 4; },
          "the one-row GEMV kernel: 0 picks per launch, 1 the uncapped one, 4 the one capped "
          "at 64 registers"),
      switch_of("PAGELLM_GEMM_PRELOAD", true,
                "start-up loads every cuBLASLt kernel a step of any length may use"),
      // --- CUDA: attention ---
      int_of(
          "PAGELLM_DECODE_MIN_CHUNK", 64,
          [](int64_t v) { return v >= 32 && v <= 1024 && v % 32 == 0; },
          "the shortest split of a sequence's keys the decode attention plan makes"),
      int_of(
          "PAGELLM_DECODE_CLUSTER", 16, [](int64_t v) { return v == 0 || (v >= 2 && v <= 16); },
          "most blocks of a decode attention cluster that merge in shared memory; 0: a "
          "global merge"),
      // --- CUDA: mixture of experts ---
      int_of(
          "PAGELLM_MOE_GEMV_SPLIT", 0,
          [](int64_t v) { return v == 0 || v == 1 || v == 2 || v == 4; },
          "warps a row of the routed experts' gate|up GEMV; 0: the rule of the shapes"),
      switch_of("PAGELLM_MOE_FUSED_COMBINE", true,
                "a one-token step's expert down products and combine run as one kernel"),
      // --- diagnostics: they change no default path ---
      switch_of("PAGELLM_CHAIN_TIMES", false,
                "the streamed chain times its phases, logged when the backend ends"),
      words_of("PAGELLM_ABLATE_OPS", "",
               {"attention", "rope_store_kv", "rms_norm", "add_rms_norm", "matmul", "matmul_add",
                "rms_norm_matmul", "rms_norm_swiglu", "matmul_swiglu", "projection_chain",
                "batched_matmul", "silu_mul", "rope", "moe_experts", "moe_order"},
               true, "these CUDA ops launch nothing (outputs wrong): what each costs in the step"),
  };
}

const Setting& must_find(std::string_view name, bool words) {
  const Setting& s = setting(name);
  PAGELLM_CHECK_MSG((s.kind == Kind::kWords) == words, "tuning: a setting read as the wrong kind");
  return s;
}

// A decimal integer filling the whole text (no spaces), in range of int64_t.
bool parse_int(const char* text, int64_t& out) {
  if (!(*text == '-' || (*text >= '0' && *text <= '9'))) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0') return false;
  out = v;
  return true;
}

// Calls f(word) for each comma-separated word of `value` (empty words included).
template <typename F>
void for_each_word(std::string_view value, F&& f) {
  while (true) {
    const size_t comma = value.find(',');
    f(value.substr(0, comma));
    if (comma == std::string_view::npos) return;
    value.remove_prefix(comma + 1);
  }
}

void warn_rejected(const Setting& s, const char* value, const std::string& fallback) {
  PAGELLM_LOG_WARN("%.*s=%s is not a value it takes; using '%s' (%.*s)",
                   static_cast<int>(s.name.size()), s.name.data(), value, fallback.c_str(),
                   static_cast<int>(s.what.size()), s.what.data());
}

}  // namespace

const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = make_table();
  return table;
}

const Setting& setting(std::string_view name) {
  for (const Setting& s : settings())
    if (s.name == name) return s;
  PAGELLM_CHECK_MSG(false, "tuning: a setting that is not in the table (core/tuning.cpp)");
  return settings().front();  // not reached
}

int64_t integer(std::string_view name) {
  const Setting& s = must_find(name, false);
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return s.fallback;
  int64_t x = 0;
  if (parse_int(v, x) && (s.kind == Kind::kSwitch ? x == 0 || x == 1 : s.valid(x))) return x;
  warn_rejected(s, v, std::to_string(s.fallback));
  return s.fallback;
}

int64_t integer(std::string_view name, int64_t kernel_default) {
  PAGELLM_CHECK_MSG(setting(name).fallback == kernel_default,
                    "tuning: a setting's default in the table is not the kernel's constant");
  return integer(name);
}

bool on(std::string_view name) {
  PAGELLM_CHECK_MSG(setting(name).kind == Kind::kSwitch, "tuning: on() reads a 0-or-1 setting");
  return integer(name) != 0;
}

std::string words(std::string_view name) {
  const Setting& s = must_find(name, true);
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return std::string(s.fallback_words);
  const std::string_view value = v;
  bool ok = true;
  int n = 0;
  if (!value.empty()) {  // an empty list: none of them
    for_each_word(value, [&](std::string_view w) {
      ++n;
      ok = ok && std::find(s.words.begin(), s.words.end(), w) != s.words.end();
    });
  }
  if (ok && (s.list || n == 1)) return std::string(value);
  warn_rejected(s, v, std::string(s.fallback_words));
  return std::string(s.fallback_words);
}

bool has_word(std::string_view value, std::string_view word) {
  bool found = false;
  for_each_word(value, [&](std::string_view w) { found = found || w == word; });
  return found;
}

}  // namespace pagellm::tuning
