// DeepSeek-V3 checkpoints carry num_nextn_predict_layers multi-token-prediction (MTP) layers after
// the decoder layers, as model.layers.<num_hidden_layers + i>.*: pagellm serves next-token
// prediction only, so it skips them when loading and says so in the log. The test appends an MTP
// layer to the tiny golden DeepSeek-V3 checkpoint (a copy of layer 1's tensors under the next
// index, plus the MTP-only eh_proj / enorm / hnorm / shared_head tensors) and sets
// num_nextn_predict_layers = 1: the model must load, log the skip, and give bit-identical logits
// to the checkpoint without it.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstring>
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

}  // namespace
}  // namespace pagellm
