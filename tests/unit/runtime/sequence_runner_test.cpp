// SequenceRunner's two ways of feeding a sequence: feed() with the logits brought to the host, and
// feed_on_device() leaving the last token's logits where the backend computed them (what `bench
// latency` samples from on a GPU). On the golden Llama fixture, CPU backend: the same tokens give
// the same last row either way, at every chunking and through decode steps; bad input is refused
// without moving the sequence.
#include "runtime/sequence_runner.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "source_dir.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

struct Fixture {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  LoadedCheckpoint ckpt;
  std::unique_ptr<Model> model;
};

void load(Fixture& f) {
  auto ckpt = open_checkpoint((fs::path(test_source_dir()) / "tests/data/golden/llama").string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  f.ckpt = std::move(*ckpt);
  auto model = load_model(f.ckpt, *f.backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  f.model = std::move(*model);
}

std::vector<float> row_of(const Tensor& t) {
  EXPECT_EQ(t.ndim, 2);
  EXPECT_EQ(t.dtype, DType::kF32);  // the CPU backend's activations
  const float* p = t.ptr<float>();
  return std::vector<float>(p, p + t.cols());
}

std::vector<int32_t> prompt_of(int n, int64_t vocab) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = static_cast<int32_t>((37 * i + 11) % vocab);
  return p;
}

TEST(SequenceRunner, DeviceLogitsMatchTheDownloadedRow) {
  Fixture f;
  load(f);
  const int64_t V = f.model->config().vocab_size;
  const auto prompt = prompt_of(30, V);
  // Chunks of 13 tokens (so later chunks attend to cached blocks) and of the whole prompt.
  for (int32_t chunk : {13, 64}) {
    SCOPED_TRACE("max_chunk " + std::to_string(chunk));
    SequenceRunner host(*f.model, *f.backend, 64, 16, chunk);
    SequenceRunner device(*f.model, *f.backend, 64, 16, chunk);
    auto all = host.feed(prompt, LogitsWanted::kAll);  // every row; the last is compared
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    ASSERT_EQ(static_cast<int64_t>(all->size()), 30 * V);
    auto last = device.feed_on_device(prompt);
    ASSERT_TRUE(last.ok()) << last.status().to_string();
    ASSERT_EQ(last->rows(), 1);
    ASSERT_EQ(last->cols(), V);
    const std::vector<float> d = row_of(*last);
    for (int64_t v = 0; v < V; ++v) ASSERT_NEAR(d[v], (*all)[29 * V + v], 1e-4f) << "token " << v;
    EXPECT_EQ(host.length(), 30);
    EXPECT_EQ(device.length(), 30);
    // Decode steps: the host path's kLast row is the device row, downloaded.
    for (int32_t tok : {5, 17, 3}) {
      auto h = host.feed(std::vector<int32_t>{tok}, LogitsWanted::kLast);
      auto g = device.feed_on_device(std::vector<int32_t>{tok});
      ASSERT_TRUE(h.ok() && g.ok());
      const std::vector<float> dg = row_of(*g);
      ASSERT_EQ(h->size(), dg.size());
      EXPECT_EQ(std::memcmp(h->data(), dg.data(), dg.size() * sizeof(float)), 0);
    }
    EXPECT_EQ(device.length(), 33);
  }
}

TEST(SequenceRunner, BadInputLeavesTheSequenceWhereItWas) {
  Fixture f;
  load(f);
  const int64_t V = f.model->config().vocab_size;
  SequenceRunner r(*f.model, *f.backend, 16, 16, 8);
  ASSERT_TRUE(r.feed_on_device(prompt_of(10, V)).ok());
  EXPECT_FALSE(r.feed_on_device({}).ok());
  EXPECT_FALSE(r.feed_on_device(prompt_of(7, V)).ok());  // 17 tokens > max_len 16
  EXPECT_FALSE(r.feed_on_device(std::vector<int32_t>{static_cast<int32_t>(V)}).ok());
  EXPECT_FALSE(r.feed(std::vector<int32_t>{-1}, LogitsWanted::kLast).ok());
  EXPECT_EQ(r.length(), 10);
  ASSERT_TRUE(r.feed_on_device(prompt_of(6, V)).ok());  // exactly to max_len
  EXPECT_EQ(r.length(), 16);
}

}  // namespace
}  // namespace pagellm
