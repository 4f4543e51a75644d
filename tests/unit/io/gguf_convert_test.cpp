// End to end: a tiny random Llama checkpoint (bf16 safetensors) converted by scripts/hf_to_gguf.py
// to every tensor type, read back through GgufWeightSource, must equal the safetensors tensors:
// bit-exact for f32 and bf16, within f16 rounding for f16, within the quantization step for
// q8_0 / q4_0 / q4_1. q_proj/k_proj (weights and biases) are compared like every other tensor, so a
// wrong un-permutation fails by whole weights, far beyond any tolerance.
//
// The fixture is generated at test time by tests/unit/io/make_gguf_fixture.py with the repository's
// .venv python (which also cross-checks the converter's permutation against transformers') into
// the temporary folder, once per content of its inputs; a missing .venv fails the test.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numbers>

#include "io/gguf.h"
#include "io/safetensors.h"
#include "source_dir.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

std::vector<float> as_f32(const TensorInfo& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  std::vector<float> out(static_cast<size_t>(n));
  to_f32(t.dtype, t.data, out.data(), n);
  return out;
}

// Half an f16 ulp at v: the error of storing v (a scale or a minimum) in f16. 2^-25 is half the
// smallest subnormal; the tiny rows of the fixture have scales in that range.
double f16_error(double v) { return std::max(std::abs(v) * std::ldexp(1.0, -11), std::ldexp(1.0, -25)); }

// Largest acceptable |gguf - source| for one 32-value block of source values `x`: the rounding of
// ggml's quantizers (gguf.quants) with the exact scale, plus |q| times the error of storing the
// scale (and the minimum) in f16, plus f32 arithmetic slack.
double block_tolerance(DType t, const float* x, int n) {
  double amax = 0, lo = x[0], hi = x[0];
  for (int i = 0; i < n; ++i) {
    amax = std::max(amax, std::abs(static_cast<double>(x[i])));
    lo = std::min(lo, static_cast<double>(x[i]));
    hi = std::max(hi, static_cast<double>(x[i]));
  }
  const double slack = amax * 1e-6;
  switch (t) {
    case DType::kQ8_0: {  // d = amax / 127, q = round(x / d) in [-127, 127]: half a step
      const double d = amax / 127;
      return 0.5 * d + 127 * f16_error(d) + slack;
    }
    case DType::kQ4_0: {  // d = max / -8, q - 8 in [-8, 7]: the side opposite the max clips, a full step
      const double d = amax / 8;
      return d + 8 * f16_error(d) + slack;
    }
    case DType::kQ4_1: {  // d = (max - min) / 15, m = min, q in [0, 15]: half a step
      const double d = (hi - lo) / 15;
      return 0.5 * d + 15 * f16_error(d) + f16_error(lo) + slack;
    }
    default:
      return 0;
  }
}

class GgufConverted : public ::testing::Test {
 protected:
  // The fixture is keyed by the contents of the scripts that make it and of the golden folder, and
  // generated once into a temporary folder that is then renamed into place, so the tests of one
  // run (separate processes under CTest, possibly in parallel) share it.
  static void SetUpTestSuite() {
    const std::string src = test_source_dir();
    const std::string python = src + "/.venv/bin/python";
    if (access(python.c_str(), X_OK) != 0) {
      setup_error_ = python + " is missing: create the test environment (scripts/setup.sh)";
      return;
    }
    size_t key = 0;
    auto mix = [&](const std::string& s) { key = key * 1000003u ^ std::hash<std::string>{}(s); };
    for (const char* f : {"/tests/unit/io/make_gguf_fixture.py", "/scripts/hf_to_gguf.py"}) {
      std::ifstream in(src + f, std::ios::binary);
      mix(std::string(std::istreambuf_iterator<char>(in), {}));
    }
    for (const auto& e : fs::recursive_directory_iterator(src + "/tests/data/golden"))
      if (e.is_regular_file()) mix(e.path().string() + ":" + std::to_string(e.file_size()));
    dir_ = ::testing::TempDir() + "pagellm_gguf_fixture_" + std::to_string(key);
    if (fs::exists(dir_ + "/done")) return;
    const std::string tmp = dir_ + ".tmp" + std::to_string(getpid());
    fs::remove_all(tmp);
    const std::string cmd = "'" + python + "' '" + src + "/tests/unit/io/make_gguf_fixture.py' --out '" + tmp + "'";
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
      setup_error_ = "fixture generation failed (exit " + std::to_string(WEXITSTATUS(rc)) + "): " + cmd;
      return;
    }
    std::ofstream(tmp + "/done") << "ok\n";
    std::error_code ec;
    fs::rename(tmp, dir_, ec);
    if (ec) fs::remove_all(tmp);  // another process got there first; its copy is identical
  }
  void SetUp() override { ASSERT_TRUE(setup_error_.empty()) << setup_error_; }

  static std::string dir_;
  static std::string setup_error_;
};
std::string GgufConverted::dir_;
std::string GgufConverted::setup_error_;

TEST_F(GgufConverted, ConfigMatchesTheCheckpoint) {
  auto ck = open_gguf_checkpoint(dir_ + "/model-q8_0.gguf");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& c = ck->config;
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.vocab_size, 320);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position_embeddings, 128);
  EXPECT_NEAR(c.rms_norm_eps, 1e-5, 1e-11);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.type, RopeType::kDefault);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, std::optional<int32_t>(1));
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});

  // The tokenizer metadata is readable through the public getters.
  auto f = GgufFile::open(dir_ + "/model-q8_0.gguf");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f->get_string("tokenizer.ggml.model"), "gpt2");
  auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(tokens->size(), 320u);
  EXPECT_EQ((*tokens)[2], "</s>");
  auto types = f->get_i32_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  EXPECT_EQ((*types)[2], 3);  // control
  EXPECT_GT(f->get_string_array("tokenizer.ggml.merges")->size(), 0u);
}

TEST_F(GgufConverted, EveryTensorEqualsTheSafetensorsOne) {
  auto st = open_safetensors_weights(dir_ + "/hf");
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  const WeightSource& ref = **st;
  const std::pair<const char*, DType> types[] = {{"f32", DType::kF32},   {"f16", DType::kF16},
                                                 {"bf16", DType::kBF16}, {"q8_0", DType::kQ8_0},
                                                 {"q4_0", DType::kQ4_0}, {"q4_1", DType::kQ4_1}};
  for (const auto& [type, dtype] : types) {
    SCOPED_TRACE(type);
    auto ck = open_gguf_checkpoint(dir_ + "/model-" + type + ".gguf");
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    const WeightSource& gg = *ck->weights;
    ASSERT_EQ(gg.tensors().size(), ref.tensors().size());
    int n_compared = 0;
    for (const TensorInfo& want : ref.tensors()) {
      SCOPED_TRACE(want.name);
      const TensorInfo* got = gg.find(want.name);
      ASSERT_NE(got, nullptr);
      ASSERT_EQ(got->shape, want.shape);
      const std::vector<float> a = as_f32(*got), b = as_f32(want);
      const bool is_1d = want.shape.size() == 1;
      // 1-D tensors (norms, biases) are always stored f32; 2-D ones in the chosen type.
      EXPECT_EQ(got->dtype, is_1d ? DType::kF32 : dtype);
      const DType t = got->dtype;
      const int64_t cols = want.shape.back();
      size_t n_bad = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        double tol = 0;
        if (t == DType::kF16) {
          // Half an f16 ulp: 2^-11 relative for normals, 2^-25 absolute in the subnormal range.
          tol = f16_error(b[i]);
        } else if (is_quantized(t)) {
          const size_t row = i / cols, blk = (i % cols) / kQuantBlock;
          tol = block_tolerance(t, &b[row * cols + blk * kQuantBlock], kQuantBlock);
        }  // f32 and bf16: exact (the source is bf16)
        const double err = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
        if (!(err <= tol)) {
          if (n_bad++ < 3)
            ADD_FAILURE() << "element " << i << ": gguf " << a[i] << " vs safetensors " << b[i] << " (tolerance "
                          << tol << ", " << dtype_name(t) << ")";
        }
      }
      EXPECT_EQ(n_bad, 0u);
      ++n_compared;
    }
    EXPECT_EQ(n_compared, 29);  // 2 layers x 13 + embed_tokens + norm + lm_head
  }
}

// Every golden checkpoint of tests/model converted to GGUF gives the config that its config.json
// gives (so the golden tests can run the GGUF files against the same reference) and the same
// tensors, exactly (f32 output of bf16/f16/f32 sources).
TEST_F(GgufConverted, GoldenCheckpointsKeepTheirConfigAndWeights) {
  const std::string golden = test_source_dir() + "/tests/data/golden";
  int n_models = 0;
  for (const auto& entry : fs::directory_iterator(golden)) {
    const std::string name = entry.path().filename().string();
    if (name == "llama_dynamic" || !fs::exists(entry.path() / "config.json")) continue;
    SCOPED_TRACE(name);
    auto hf = load_hf_config(entry.path().string());
    ASSERT_TRUE(hf.ok()) << hf.status().to_string();
    // MoE / MLA and 4-bit packed checkpoints: not converted (make_gguf_fixture.py).
    if (hf->n_routed_experts > 0 || hf->quantization) continue;
    auto ck = open_gguf_checkpoint(dir_ + "/golden/" + name + ".gguf");
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    const ModelConfig& a = ck->config;
    const ModelConfig& b = *hf;
    // Mistral files say "llama": the same network (Llama with a sliding window).
    EXPECT_EQ(a.architecture, b.architecture == "MistralForCausalLM" ? "LlamaForCausalLM" : b.architecture);
    EXPECT_EQ(a.vocab_size, b.vocab_size);
    EXPECT_EQ(a.hidden_size, b.hidden_size);
    EXPECT_EQ(a.intermediate_size, b.intermediate_size);
    EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
    EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
    EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
    EXPECT_EQ(a.head_dim, b.head_dim);
    EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
    EXPECT_NEAR(a.rms_norm_eps, b.rms_norm_eps, b.rms_norm_eps * 1e-6);  // stored as f32
    EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
    EXPECT_EQ(a.attention_bias, b.attention_bias);
    EXPECT_EQ(a.o_proj_bias, b.o_proj_bias);
    EXPECT_EQ(a.mlp_bias, b.mlp_bias);
    EXPECT_EQ(a.qk_norm, b.qk_norm);
    EXPECT_EQ(a.sliding_window, b.sliding_window);
    EXPECT_EQ(a.rotary_dim(), b.rotary_dim());
    EXPECT_NEAR(a.rope.theta, b.rope.theta, b.rope.theta * 1e-7);
    EXPECT_EQ(a.rope.type, b.rope.type);
    if (b.rope.type == RopeType::kLlama3) {
      // Recovered up to a common scale of (low, high, original context): compare the ramp ends.
      EXPECT_NEAR(a.rope.factor, b.rope.factor, 1e-6);
      const double a_lo = a.rope.original_max_position_embeddings / a.rope.low_freq_factor;
      const double b_lo = b.rope.original_max_position_embeddings / b.rope.low_freq_factor;
      const double a_hi = a.rope.original_max_position_embeddings / a.rope.high_freq_factor;
      const double b_hi = b.rope.original_max_position_embeddings / b.rope.high_freq_factor;
      // Only the divisors at the model's frequencies are pinned down; check those.
      for (int64_t i = 0; i < b.rotary_dim() / 2; ++i) {
        const double wl = 2 * std::numbers::pi *
                          std::pow(b.rope.theta, 2.0 * static_cast<double>(i) / static_cast<double>(b.rotary_dim()));
        auto div = [&](const RopeConfig& r, double lo_wl, double hi_wl) {
          if (wl < hi_wl) return 1.0;
          if (wl > lo_wl) return r.factor;
          const double s = (r.original_max_position_embeddings / wl - r.low_freq_factor) /
                           (r.high_freq_factor - r.low_freq_factor);
          return 1.0 / ((1 - s) / r.factor + s);
        };
        EXPECT_NEAR(div(a.rope, a_lo, a_hi), div(b.rope, b_lo, b_hi), 1e-5) << "frequency " << i;
      }
    } else if (b.rope.type != RopeType::kDefault) {
      EXPECT_NEAR(a.rope.factor, b.rope.factor, 1e-6);
    }
    if (b.rope.type == RopeType::kYarn) {
      EXPECT_EQ(a.rope.original_max_position_embeddings, b.rope.original_max_position_embeddings);
      EXPECT_EQ(a.rope.beta_fast, b.rope.beta_fast);
      EXPECT_EQ(a.rope.beta_slow, b.rope.beta_slow);
    }
    EXPECT_EQ(a.bos_token_id, b.bos_token_id);
    ASSERT_FALSE(b.eos_token_ids.empty());
    EXPECT_EQ(a.eos_token_ids, std::vector<int32_t>{b.eos_token_ids[0]});

    auto st = open_safetensors_weights(entry.path().string());
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    for (const TensorInfo& want : (*st)->tensors()) {
      if (b.tie_word_embeddings && want.name == "lm_head.weight") continue;
      SCOPED_TRACE(want.name);
      const TensorInfo* got = ck->weights->find(want.name);
      ASSERT_NE(got, nullptr);
      ASSERT_EQ(got->shape, want.shape);
      EXPECT_EQ(as_f32(*got), as_f32(want));
    }
    ++n_models;
  }
  EXPECT_EQ(n_models, 9);
}

}  // namespace
}  // namespace pagellm
