// The golden checkpoints converted to GGUF (scripts/hf_to_gguf.py, llama.cpp's layout with its
// q/k row permutation) must give the log-probabilities their safetensors originals give: the same
// transformers reference, through a different file format, weight naming and permutation.
// Conversions that keep the stored values exactly (f32 always; bf16 for bf16 checkpoints) are held
// to the safetensors bound. Lossy ones (Q8_0, or bf16 from an f16/f32 checkpoint) change the model
// itself, so transformers' logits are no reference for them; their weights are checked against the
// originals within the quantization step in tests/unit/io/gguf_convert_test.cpp instead.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "runtime/sequence_runner.h"
#include "source_dir.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kSource = test_source_dir();

double max_logprob_error(const std::string& gguf, const json& ref, int* n_out) {
  auto ckpt = open_checkpoint(gguf);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  if (!ckpt.ok()) return 1e9;
  auto backend = make_cpu_backend();
  auto model = load_model(*ckpt, *backend);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return 1e9;
  const int64_t V = (*model)->config().vocab_size;
  SequenceRunner runner(**model, *backend, 128, 16, 13);
  double max_err = 0;
  for (const json& c : ref["cases"]) {
    std::vector<int32_t> full = c["prompt"].get<std::vector<int32_t>>();
    for (int32_t t : c["greedy"]) full.push_back(t);
    runner.reset();
    auto lg = runner.feed(full, LogitsWanted::kAll);
    EXPECT_TRUE(lg.ok());
    if (!lg.ok()) return 1e9;
    for (size_t i = 1; i < full.size(); ++i) {
      const float* row = lg->data() + (i - 1) * V;
      double mx = row[0], sum = 0;
      for (int64_t j = 1; j < V; ++j) mx = std::max(mx, double{row[j]});
      for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
      const double lp = row[full[i]] - mx - std::log(sum);
      max_err = std::max(max_err, std::fabs(lp - c["full_logprobs"][i].get<double>()));
      ++*n_out;
    }
  }
  return max_err;
}

TEST(GoldenGguf, ConvertedCheckpointsGiveTheSameLogprobs) {
  const fs::path python = kSource / ".venv" / "bin" / "python";
  ASSERT_TRUE(fs::exists(python)) << python << " is missing: run scripts/setup.sh";
  const fs::path tmp = fs::temp_directory_path() / ("pagellm_golden_gguf_" + std::to_string(getpid()));
  fs::create_directories(tmp);
  int n_models = 0;
  // llama_dynamic has no GGUF form (llama.cpp has no dynamic NTK).
  for (const char* name : {"llama", "llama3_rope", "llama_mqa_bias", "mistral", "qwen2", "qwen3"}) {
    std::ifstream f(kSource / "tests/data/golden" / name / "reference.json");
    const json ref = json::parse(f);
    const std::string wdt = ref["weight_dtype"];
    for (const char* type : {"f32", "bf16"}) {
      if (std::string(type) == "bf16" && wdt != "bfloat16") continue;  // lossy: see above
      const fs::path out = tmp / (std::string(name) + "-" + type + ".gguf");
      const std::string cmd = "'" + python.string() + "' '" + (kSource / "scripts/hf_to_gguf.py").string() +
                              "' --no-tokenizer --outtype " + type + " --outfile '" + out.string() +
                              "' '" + (kSource / "tests/data/golden" / name).string() + "' >/dev/null";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
      int n = 0;
      const double err = max_logprob_error(out.string(), ref, &n);
      std::printf("[ golden-gguf ] %-15s %-5s max |dlogprob| %.5f over %d positions\n", name, type, err, n);
      ASSERT_GT(n, 0);
      EXPECT_LE(err, 2e-3) << name << " as " << type;
      ++n_models;
    }
  }
  EXPECT_EQ(n_models, 9);  // 6 in f32, the 3 bf16 checkpoints also in bf16
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace pagellm
