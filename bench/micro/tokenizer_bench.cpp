// Tokenizer throughput on English text: encode (MB/s of input), decode and streaming decode.
//   build/<dir>/bench/tokenizer_bench [--benchmark_filter=Encode]
// Uses the default model's GGUF tokenizer (byte-level BPE, 49k vocab) when present, and the
// Llama-3-style fixture (regex Split + ByteLevel) from tests/data/tokenizer.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "io/default_model.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

// Fixtures are found relative to the working directory (run from the repository root).
#ifndef PAGELLM_SOURCE_DIR
#define PAGELLM_SOURCE_DIR "."
#endif

namespace {

using pagellm::Tokenizer;

// ~1 MB of English-like prose: sentences drawn from a fixed vocabulary, with punctuation,
// numbers and newlines, so the word cache sees a realistic mix of repeats and new words.
const std::string& english_text() {
  static const std::string text = [] {
    const char* words[] = {
        "the", "of", "and", "to", "in", "is", "that", "it", "was", "for", "on", "are", "with", "as", "his", "they",
        "be", "at", "one", "have", "this", "from", "or", "had", "by", "word", "but", "what", "some", "we", "can",
        "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said", "an", "each", "she",
        "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would",
        "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day",
        "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my", "over", "know", "water",
        "than", "call", "first", "who", "may", "down", "side", "been", "now", "find", "tokenization", "inference",
        "engine", "throughput", "latency", "scheduler", "attention", "Monday", "London", "Einstein's", "don't",
        "reasonable", "extraordinary", "notwithstanding", "approximately", "implementation", "characteristics"};
    std::mt19937 rng(42);
    std::string out;
    while (out.size() < (1u << 20)) {
      const int n = 5 + static_cast<int>(rng() % 20);
      for (int i = 0; i < n; ++i) {
        std::string w = words[rng() % (sizeof(words) / sizeof(words[0]))];
        if (i == 0) w[0] = static_cast<char>(std::toupper(w[0]));
        out += w;
        if (rng() % 17 == 0) out += ",";
        if (rng() % 41 == 0) out += " " + std::to_string(rng() % 100000);
        out += i + 1 < n ? " " : "";
      }
      out += rng() % 5 == 0 ? ".\n\n" : ". ";
    }
    return out;
  }();
  return text;
}

const Tokenizer* load(const std::string& path) {
  auto t = pagellm::load_tokenizer(path);
  return t.ok() ? std::move(t).value().release() : nullptr;
}

const Tokenizer* gguf_tokenizer() {
  static const Tokenizer* t = load(pagellm::default_model_path());
  return t;
}
const Tokenizer* llama3_tokenizer() {
  static const Tokenizer* t = load(std::string(PAGELLM_SOURCE_DIR) + "/tests/data/tokenizer/llama3");
  return t;
}

void run_encode(benchmark::State& state, const Tokenizer* tok) {
  if (!tok) {
    state.SkipWithError("tokenizer not available");
    return;
  }
  const std::string& text = english_text();
  size_t n_tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text, false);
    n_tokens = ids->size();
    benchmark::DoNotOptimize(ids);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(n_tokens);
}

void BM_EncodeGgufSmolLM2(benchmark::State& state) { run_encode(state, gguf_tokenizer()); }
void BM_EncodeLlama3Style(benchmark::State& state) { run_encode(state, llama3_tokenizer()); }

void BM_DecodeGgufSmolLM2(benchmark::State& state) {
  const Tokenizer* tok = gguf_tokenizer();
  if (!tok) {
    state.SkipWithError("tokenizer not available");
    return;
  }
  const auto ids = tok->encode(english_text(), false).value();
  for (auto _ : state) benchmark::DoNotOptimize(tok->decode(ids, false));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * english_text().size()));
}

void BM_StreamDecodeGgufSmolLM2(benchmark::State& state) {
  const Tokenizer* tok = gguf_tokenizer();
  if (!tok) {
    state.SkipWithError("tokenizer not available");
    return;
  }
  const auto all = tok->encode(english_text().substr(0, 64 << 10), false).value();
  for (auto _ : state) {
    pagellm::IncrementalDetokenizer d(*tok, true);
    for (int32_t id : all) benchmark::DoNotOptimize(d.add(id));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * all.size()));
}

BENCHMARK(BM_EncodeGgufSmolLM2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeLlama3Style)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeGgufSmolLM2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StreamDecodeGgufSmolLM2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
