// DeepSeek-V3's multi-token-prediction (MTP) layers: num_nextn_predict_layers of them after the
// decoder layers, as model.layers.<num_hidden_layers + i>.*.
// - The model itself skips them (with a log line) and gives bit-identical logits to the checkpoint
//   without them: an MTP layer appended to the tiny golden DeepSeek-V3 checkpoint (a copy of layer
//   1's tensors under the next index, plus the MTP-only tensors).
// - The MTP module (load_mtp_module) against the reference of tests/model/make_mtp_fixture.py
//   (transformers' DeepseekV3DecoderLayer and torch, float32, on the golden model with a random MTP
//   layer, tests/data/mtp/deepseek_v3): its log-probabilities at every prompt position, and
//   its greedy chain of guesses from the prompt's end.
// - The MTP proposer: the guesses it makes from the target's hidden rows are that chain, and after
// a
//   verification that kept one guess, the same as a proposer that saw the resulting sequence at
//   once.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "runtime/mtp_proposer.h"
#include "runtime/sequence_runner.h"
#include "sample/logits_processors.h"
#include "source_dir.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The safetensors file of `src` with, appended, a copy of every "model.layers.<from>." tensor as
// "model.layers.<to>." and the named extra tensors (copies of `like`'s bytes and shape).
std::string with_mtp_layer(const std::string& file, int from, int to,
                           const std::vector<std::pair<std::string, std::string>>& extra) {
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  json header = json::parse(file.substr(8, header_len));
  std::string data = file.substr(8 + header_len);
  const std::string src = "model.layers." + std::to_string(from) + ".";
  const std::string dst = "model.layers." + std::to_string(to) + ".";
  auto append = [&](const std::string& name, const json& like) {
    const uint64_t b = like["data_offsets"][0], e = like["data_offsets"][1];
    json t = like;
    t["data_offsets"] = {data.size(), data.size() + (e - b)};
    data += file.substr(8 + header_len + b, e - b);
    header[name] = t;
  };
  std::vector<std::pair<std::string, json>> layer;
  for (auto& [name, t] : header.items())
    if (name.rfind(src, 0) == 0) layer.emplace_back(dst + name.substr(src.size()), t);
  for (auto& [name, t] : layer) append(name, t);
  for (auto& [name, like] : extra) append(dst + name, header.at(like));
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  const uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + h + data;
}

std::vector<float> last_logits(const std::string& dir, std::string* log) {
  auto ckpt = open_checkpoint(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  if (!ckpt.ok()) return {};
  auto backend = make_cpu_backend();
  if (log) testing::internal::CaptureStderr();
  auto model = load_model(*ckpt, *backend);
  if (log) *log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  if (!model.ok()) return {};
  SequenceRunner runner(**model, *backend, 64);
  const std::vector<int32_t> prompt = {5, 17, 42, 99, 3, 250, 7, 61};
  auto lg = runner.feed(prompt, LogitsWanted::kLast);
  EXPECT_TRUE(lg.ok()) << lg.status().to_string();
  return lg.ok() ? std::vector<float>(lg->begin(), lg->end()) : std::vector<float>{};
}

TEST(DeepseekMtp, LayersPastTheDecoderAreSkippedWithALogLine) {
  const fs::path golden = fs::path(test_source_dir()) / "tests" / "data" / "golden" / "deepseek_v3";
  json cfg = json::parse(read_file(golden / "config.json"));
  const int L = cfg["num_hidden_layers"];
  ASSERT_GE(L, 2);
  const fs::path dir = fs::temp_directory_path() / ("pagellm_mtp_" + std::to_string(getpid()));
  fs::create_directories(dir);
  cfg["num_nextn_predict_layers"] = 1;
  std::ofstream(dir / "config.json") << cfg.dump();
  const std::string norm = "model.layers.1.input_layernorm.weight";
  std::ofstream(dir / "model.safetensors", std::ios::binary)
      << with_mtp_layer(read_file(golden / "model.safetensors"), L - 1, L,
                        {{"enorm.weight", norm},
                         {"hnorm.weight", norm},
                         {"eh_proj.weight", "model.layers.1.self_attn.o_proj.weight"},
                         {"shared_head.norm.weight", "model.norm.weight"},
                         {"shared_head.head.weight", "lm_head.weight"}});

  std::string log;
  const std::vector<float> with_mtp = last_logits(dir.string(), &log);
  const std::vector<float> without = last_logits(golden.string(), nullptr);
  fs::remove_all(dir);
  EXPECT_NE(log.find("skipping 1 multi-token-prediction layer"), std::string::npos) << log;
  ASSERT_FALSE(without.empty());
  ASSERT_EQ(with_mtp.size(), without.size());
  EXPECT_EQ(std::memcmp(with_mtp.data(), without.data(), without.size() * sizeof(float)), 0)
      << "an MTP layer changed the logits";
}

// The golden DeepSeek-V3 model with its MTP layer, on the CPU backend (the reference one: logits
// that do not depend on how a step batches tokens) or the CUDA backend (skipped without a GPU).
// Tolerance: f32 on the CPU (2e-4 per logprob); on the GPU, bf16 activations and the MoE routing
// they may flip, against transformers' own bf16 noise on the model (the golden fixture's
// transformers_bf16_noise): the mean |dlogprob| within 3x its mean, and guesses equal where the
// reference's top-2 margin exceeds 0.3.
class MtpFixture : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cuda") {
      auto be = make_cuda_backend(0);
      if (!be.ok()) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
      backend_ = std::move(*be);
      const json noise = json::parse(read_file(fs::path(test_source_dir()) / "tests" / "data" /
                                               "golden" / "deepseek_v3" / "reference.json"));
      mean_tol_ = 3 * noise["transformers_bf16_noise"]["mean_abs_err"].get<double>();
    } else {
      backend_ = make_cpu_backend(false);
    }
    const fs::path dir = fs::path(test_source_dir()) / "tests" / "data" / "mtp" / "deepseek_v3";
    ref_ = json::parse(read_file(dir / "reference.json"));
    auto ckpt = open_checkpoint(dir.string());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    ckpt_ = std::move(*ckpt);
    auto model = load_model(ckpt_, *backend_);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    model_ = std::move(*model);
    auto mtp = load_mtp_module(ckpt_, *backend_, *model_);
    ASSERT_TRUE(mtp.ok()) << mtp.status().to_string();
    mtp_ = std::move(*mtp);
    prompt_ = ref_["prompt"].get<std::vector<int32_t>>();
    D_ = ckpt_.config.hidden_size;
    V_ = ckpt_.config.vocab_size;
  }
  void TearDown() override {
    if (n_compared_ > 0 && mean_tol_ > 0) {
      EXPECT_LE(sum_err_ / n_compared_, mean_tol_);
    }
  }
  bool on_gpu() const { return mean_tol_ > 0; }
  // Rows [first, first + n) of `m`'s last hidden rows, copied to a buffer of their own (the next
  // forward overwrites the model's), as a tensor on the backend's device.
  Tensor hidden_rows(const Model& m, int64_t first, int64_t n) {
    const Tensor h = m.last_hidden();
    EXPECT_TRUE(h.defined() && h.cols() == D_ && h.dtype == backend_->activation_dtype());
    const int64_t row = dtype_bytes(h.dtype, D_);
    buffers_.push_back(backend_->must_allocate(n * row, "test rows"));
    for (int64_t r = 0; r < n; ++r)
      backend_->copy(
          static_cast<char*>(buffers_.back()->data()) + r * row,
          static_cast<const char*>(h.data) + (first + r) * dtype_bytes(h.dtype, h.row_stride()),
          row);
    return buffers_.back()->view(h.dtype, {n, D_});
  }
  // The log-softmax of `logits` (one row) against `want`: within 2e-4 on the CPU; on the GPU
  // its mean error joins the test's (TearDown).
  void expect_logprobs(std::span<const float> logits, const json& want, const std::string& what) {
    ASSERT_EQ(static_cast<int64_t>(logits.size()), V_);
    double mx = -INFINITY, sum = 0;
    for (float x : logits) mx = std::max<double>(mx, x);
    for (float x : logits) sum += std::exp(x - mx);
    double worst = 0;
    for (int64_t v = 0; v < V_; ++v) {
      const double err = std::abs(logits[v] - mx - std::log(sum) - want[v].get<double>());
      worst = std::max(worst, err);
      sum_err_ += err;
      ++n_compared_;
    }
    if (!on_gpu()) {
      EXPECT_LT(worst, 2e-4) << what;
    }
  }
  // Whether the reference's guess i is clear enough to compare on this backend.
  bool clear_guess(size_t i) const {
    return !on_gpu() || ref_["chain_margins"][i].get<double>() > 0.3;
  }

  json ref_;
  LoadedCheckpoint ckpt_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<MtpModule> mtp_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<int32_t> prompt_;
  int64_t D_ = 0, V_ = 0;
  double mean_tol_ = 0, sum_err_ = 0;
  int64_t n_compared_ = 0;
};

TEST_P(MtpFixture, ModuleMatchesTheReference) {
  const int64_t n = static_cast<int64_t>(prompt_.size());
  SequenceRunner target(*model_, *backend_, 64);
  ASSERT_TRUE(target.feed(prompt_, LogitsWanted::kLast).ok());
  // Row j pairs token j + 1 with the target's hidden row j.
  mtp_->set_hidden_input(hidden_rows(*model_, 0, n - 1));
  // Op by op: a recorded graph would keep reading the hidden rows set when it was recorded.
  SequenceRunner module(mtp_->model(), *backend_, 64, 16, 512, /*use_graphs=*/false);
  auto lg = module.feed(std::span(prompt_).subspan(1), LogitsWanted::kAll);
  ASSERT_TRUE(lg.ok()) << lg.status().to_string();
  for (int64_t j = 0; j + 1 < n; ++j)
    expect_logprobs(lg->subspan(j * V_, V_), ref_["mtp_logprobs"][j],
                    "position " + std::to_string(j));
  // The chain: each guess goes in with the module's own hidden row before it (the reference's
  // guess, so that a near-tie the GPU breaks the other way does not change what follows).
  const auto chain = ref_["chain"].get<std::vector<int32_t>>();
  if (clear_guess(0)) {
    EXPECT_EQ(argmax_token(lg->subspan((n - 2) * V_, V_)), chain[0]);
  }
  for (size_t i = 1; i < chain.size(); ++i) {
    mtp_->set_hidden_input(hidden_rows(mtp_->model(), i == 1 ? n - 2 : 0, 1));
    auto next = module.feed(std::span(&chain[i - 1], 1), LogitsWanted::kLast);
    ASSERT_TRUE(next.ok()) << next.status().to_string();
    expect_logprobs(*next, ref_["chain_logprobs"][i], "guess " + std::to_string(i + 1));
    if (clear_guess(i)) {
      EXPECT_EQ(argmax_token(*next), chain[i]);
    }
  }
}

// The proposer fed as the engine feeds it: the target's prompt chunk (whose last row waits for
// the token after it), then a proposal once that token is known. On the CPU, then a verification
// that keeps one guess, after which its guesses are those of a proposer that saw the resulting
// sequence at once (the GPU's bf16 rows differ between those two ways of batching).
TEST_P(MtpFixture, ProposerGuessesTheModulesChainAndFollowsAVerification) {
  const int32_t n = static_cast<int32_t>(prompt_.size());
  const auto chain = ref_["chain"].get<std::vector<int32_t>>();
  const int32_t k = static_cast<int32_t>(chain.size());
  SamplerConfig sc;
  sc.vocab_size = static_cast<int32_t>(V_);
  MtpProposer proposer(*mtp_, *backend_, 64, 4, k, sc);
  // The prompt is tokens [0, n - 1); token n - 1 is the first output.
  const std::span<const int32_t> head(prompt_.data(), n - 1);
  std::vector<int32_t> outputs = {prompt_[n - 1]};
  SequenceRunner target(*model_, *backend_, 64);
  ASSERT_TRUE(target.feed(head, LogitsWanted::kLast).ok());
  TargetChunk c{7, 0, 0, n - 1, 0, head.data(), head, {}};
  proposer.observe(std::span(&c, 1), model_->last_hidden());
  std::vector<int32_t> draft;
  ProposalRequest p{7, 0, prompt_, k, &draft};
  proposer.propose(std::span(&p, 1));
  ASSERT_EQ(static_cast<int32_t>(draft.size()), k);
  for (int32_t i = 0; i < k && clear_guess(i); ++i) {
    EXPECT_EQ(draft[i], chain[i]) << "guess " << i;
  }
  if (on_gpu()) return;

  // Verification: the last token and the guesses in one target step; the first guess is kept,
  // the second replaced by another token.
  std::vector<int32_t> verify = {prompt_[n - 1]};
  verify.insert(verify.end(), draft.begin(), draft.end());
  ASSERT_TRUE(target.feed(verify, LogitsWanted::kAll).ok());
  TargetChunk v{7, 0, n - 1, static_cast<int32_t>(verify.size()), 0, verify.data(), head, outputs};
  proposer.observe(std::span(&v, 1), model_->last_hidden());
  outputs.push_back(draft[0]);
  outputs.push_back((draft[1] + 1) % static_cast<int32_t>(V_));
  std::vector<int32_t> tokens(head.begin(), head.end());
  tokens.insert(tokens.end(), outputs.begin(), outputs.end());
  std::vector<int32_t> after;
  ProposalRequest q{7, 0, tokens, k, &after};
  proposer.propose(std::span(&q, 1));

  // A proposer that sees the sequence before its last token as one prompt.
  MtpProposer fresh(*mtp_, *backend_, 64, 4, k, sc);
  const std::span<const int32_t> known(tokens.data(), tokens.size() - 1);
  SequenceRunner again(*model_, *backend_, 64);
  ASSERT_TRUE(again.feed(known, LogitsWanted::kLast).ok());
  TargetChunk f{9, 0, 0, static_cast<int32_t>(known.size()), 0, known.data(), known, {}};
  fresh.observe(std::span(&f, 1), model_->last_hidden());
  std::vector<int32_t> want;
  ProposalRequest r{9, 0, tokens, k, &want};
  fresh.propose(std::span(&r, 1));
  ASSERT_EQ(static_cast<int32_t>(want.size()), k);
  EXPECT_EQ(after, want);
  proposer.release(7);
  fresh.release(9);
}

INSTANTIATE_TEST_SUITE_P(Backends, MtpFixture, testing::Values("cpu", "cuda"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

TEST(DeepseekMtp, AModelWithoutMtpLayersIsAClearError) {
  auto ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/deepseek_v3");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  auto backend = make_cpu_backend();
  auto model = load_model(*ckpt, *backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto mtp = load_mtp_module(*ckpt, *backend, **model);
  ASSERT_FALSE(mtp.ok());
  EXPECT_NE(mtp.status().message().find("num_nextn_predict_layers"), std::string::npos)
      << mtp.status().to_string();
  auto llama = open_checkpoint(test_source_dir() + "/tests/data/golden/llama");
  ASSERT_TRUE(llama.ok());
  auto lm = load_model(*llama, *backend);
  ASSERT_TRUE(lm.ok());
  EXPECT_FALSE(load_mtp_module(*llama, *backend, **lm).ok());
}

}  // namespace
}  // namespace pagellm
