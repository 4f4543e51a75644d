// DecodeGraphs without a GPU: a backend whose "recording" keeps the recorded function and whose
// replay runs it again (on the CPU a rerun of the step's ops is what a replay does), whose freed
// buffers move the allocation epoch as a device backend's do (a recording may point at them), and
// a model wrapper that notes the context bound each step's attention was planned for. Checks the
// context tiers (runtime/decode_graphs.h): which tiers a max_model_len gets, that every step is
// planned for the smallest tier holding its longest context, that each (batch bucket, tier) is
// recorded once and replayed after, and that a replay gives the direct run's logits.
#include "runtime/decode_graphs.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "forwarding_backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "source_dir.h"

namespace pagellm {
namespace {

class RerunningBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  std::unique_ptr<Buffer> allocate(int64_t n) override {
    return std::make_unique<EpochBuffer>(in_.allocate(n), epoch_);
  }
  uint64_t allocation_epoch() const override { return *epoch_; }
  std::unique_ptr<OpGraph> capture(const std::function<void()>& record) override {
    ++n_captures;
    return std::make_unique<Rerun>(record, &n_replays);
  }
  int64_t n_captures = 0, n_replays = 0;

 private:
  // Moves the epoch when freed (the buffers may outlive the backend, hence the shared counter).
  struct EpochBuffer final : Buffer {
    EpochBuffer(std::unique_ptr<Buffer> in, std::shared_ptr<uint64_t> epoch)
        : in(std::move(in)), epoch(std::move(epoch)) {}
    ~EpochBuffer() override { ++*epoch; }
    void* data() const override { return in->data(); }
    int64_t nbytes() const override { return in->nbytes(); }
    std::unique_ptr<Buffer> in;
    std::shared_ptr<uint64_t> epoch;
  };
  std::shared_ptr<uint64_t> epoch_ = std::make_shared<uint64_t>(0);

  struct Rerun final : OpGraph {
    Rerun(std::function<void()> f, int64_t* count) : f(std::move(f)), count(count) {}
    void replay() override {
      ++*count;
      f();
    }
    std::function<void()> f;
    int64_t* count;
  };
};

// Forwards to the loaded model; notes each computed step's attention bound.
class PlanNotingModel final : public Model {
 public:
  explicit PlanNotingModel(Model& m) : m_(m) {}
  const ModelConfig& config() const override { return m_.config(); }
  KvSpec kv_spec() const override { return m_.kv_spec(); }
  Tensor last_logits() const override { return m_.last_logits(); }
  void download_logits(float* out) override { m_.download_logits(out); }
  void prepare(const StepBatch& b) override { m_.prepare(b); }
  void compute(const StepBatch& b, KvCache& cache) override {
    planned.push_back(b.attn.max_seqlen_kv);
    m_.compute(b, cache);
  }
  int64_t weight_bytes() const override { return m_.weight_bytes(); }
  int64_t decode_weight_bytes() const override { return m_.decode_weight_bytes(); }

  std::vector<int32_t> planned;

 private:
  Model& m_;
};

constexpr int32_t kBlockSize = 16;
constexpr int64_t kCacheBlocks = 64;

class DecodeGraphsTest : public testing::Test {
 protected:
  void SetUp() override {
    auto ckpt = open_checkpoint(test_source_dir() + "/tests/data/golden/llama");
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    ckpt_ = std::move(*ckpt);
    cpu_ = make_cpu_backend(false);
    backend_ = std::make_unique<RerunningBackend>(*cpu_);
    // The model allocates through the rerunning backend, so its regrown scratch moves the epoch.
    auto m = load_model(ckpt_, *backend_);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(*m);
    noting_ = std::make_unique<PlanNotingModel>(*model_);
    cache_ = KvCache::allocate(*backend_, model_->kv_spec(), kBlockSize, kCacheBlocks);
    // Zeros rather than whatever the allocation held: the long contexts below read every row.
    for (auto* layers : {&cache_.k, &cache_.v})
      for (Tensor& t : *layers) std::memset(t.data, 0, t.nbytes());
  }

  // A decode step of one token per sequence at each start position. Every sequence's table maps
  // logical block i to physical block i % kCacheBlocks: contexts far longer than the cache, whose
  // rows repeat, are enough to plan and run attention over them.
  std::vector<SeqChunk> step(const std::vector<int32_t>& start_pos, int32_t max_model_len) {
    table_.resize((max_model_len + kBlockSize - 1) / kBlockSize);
    for (size_t i = 0; i < table_.size(); ++i) table_[i] = static_cast<int32_t>(i % kCacheBlocks);
    std::vector<SeqChunk> seqs;
    for (size_t s = 0; s < start_pos.size(); ++s) {
      SeqChunk c;
      c.tokens = &kTokens[s % 4];
      c.n_tokens = 1;
      c.start_pos = start_pos[s];
      c.block_table = table_.data();
      c.n_blocks = start_pos[s] / kBlockSize + 1;
      seqs.push_back(c);
    }
    return seqs;
  }

  static std::vector<float> host_rows(const Tensor& logits) {
    const float* p = static_cast<const float*>(logits.data);
    return std::vector<float>(p, p + logits.numel());
  }

  static constexpr int32_t kTokens[4] = {5, 17, 42, 99};
  LoadedCheckpoint ckpt_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<RerunningBackend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<PlanNotingModel> noting_;
  KvCache cache_;
  std::vector<int32_t> table_;
};

TEST_F(DecodeGraphsTest, TiersOfAMaxModelLen) {
  const std::pair<int32_t, std::vector<int32_t>> cases[] = {
      {100, {100}},
      {8192, {8192}},
      {8193, {8192, 8193}},
      {40000, {8192, 32768, 40000}},
      {131072, {8192, 32768, 131072}},
  };
  for (const auto& [len, want] : cases) {
    auto g = DecodeGraphs::create(*noting_, *backend_, cache_, kBlockSize, 4, len);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->tiers(), want) << "max_model_len " << len;
  }
}

TEST_F(DecodeGraphsTest, StepsTakeTheSmallestTierHoldingTheirLongestContext) {
  constexpr int32_t kMaxLen = 40000;
  auto g = DecodeGraphs::create(*noting_, *backend_, cache_, kBlockSize, 4, kMaxLen);
  ASSERT_NE(g, nullptr);
  struct Case {
    std::vector<int32_t> start_pos;
    int32_t tier;
  };
  // The new token is at start_pos: a context of start_pos + 1 tokens.
  const Case cases[] = {
      {{10}, 8192},     {{8191, 3}, 8192},   {{8192}, 32768},  {{5, 20000, 9}, 32768},
      {{32767}, 32768}, {{32768, 1}, 40000}, {{39999}, 40000},
  };
  // A step of the largest bucket first sizes every buffer, so nothing regrows (and no recording
  // goes stale) below.
  g->run(step({1, 2, 3, 4}, kMaxLen));
  const uint64_t epoch = backend_->allocation_epoch();
  int64_t recorded = g->n_recorded();
  std::set<std::pair<int32_t, int32_t>> keys = {{4, 8192}};  // (batch bucket, tier) seen so far
  for (const Case& c : cases) {
    const std::string what = "contexts ending at " + testing::PrintToString(c.start_pos);
    const std::vector<SeqChunk> seqs = step(c.start_pos, kMaxLen);
    const int32_t n = static_cast<int32_t>(seqs.size()), bucket = n <= 2 ? n : 4;
    // The first run of a (bucket, tier) runs directly and records; a later one replays.
    const bool fresh = keys.insert({bucket, c.tier}).second;
    noting_->planned.clear();
    const std::vector<float> direct = host_rows(g->run(seqs));
    EXPECT_EQ(noting_->planned, std::vector<int32_t>{c.tier}) << what;
    recorded += fresh;
    EXPECT_EQ(g->n_recorded(), recorded) << what;
    // Again: replayed (the KV write repeats the same values), with the same logits.
    const int64_t replays = backend_->n_replays;
    noting_->planned.clear();
    const std::vector<float> replayed = host_rows(g->run(seqs));
    EXPECT_EQ(backend_->n_replays, replays + 1) << what;
    EXPECT_EQ(noting_->planned, std::vector<int32_t>{c.tier}) << what;
    EXPECT_EQ(g->n_recorded(), recorded) << what;
    EXPECT_EQ(replayed, direct) << what;
  }
  EXPECT_EQ(backend_->allocation_epoch(), epoch);
}

// A recording made before a buffer it uses was regrown is made again, not replayed.
TEST_F(DecodeGraphsTest, StaleRecordingsAreMadeAgain) {
  auto g = DecodeGraphs::create(*noting_, *backend_, cache_, kBlockSize, 4, 8192);
  ASSERT_NE(g, nullptr);
  g->run(step({10}, 8192));  // bucket 1: recorded
  g->run(step({10}, 8192));  // replayed
  EXPECT_EQ(g->n_recorded(), 1);
  EXPECT_EQ(backend_->n_replays, 1);
  const uint64_t epoch = backend_->allocation_epoch();
  g->run(step({10, 11, 12, 13}, 8192));  // bucket 4 grows the scratch: recorded
  EXPECT_GT(backend_->allocation_epoch(), epoch);
  const std::vector<float> again = host_rows(g->run(step({10}, 8192)));  // stale: recorded again
  EXPECT_EQ(g->n_recorded(), 3);
  EXPECT_EQ(backend_->n_replays, 1);
  const std::vector<float> replayed = host_rows(g->run(step({10}, 8192)));
  EXPECT_EQ(backend_->n_replays, 2);
  EXPECT_EQ(replayed, again);
}

TEST_F(DecodeGraphsTest, WarmUpRecordsEveryBucketOfEveryTier) {
  auto g = DecodeGraphs::create(*noting_, *backend_, cache_, kBlockSize, 4, 40000);
  ASSERT_NE(g, nullptr);
  noting_->planned.clear();
  g->warm_up();
  // Buckets 1, 2, 4, each tier, the longest tier first (it sizes the workspaces).
  EXPECT_EQ(g->n_recorded(), 9);
  EXPECT_EQ(noting_->planned,
            (std::vector<int32_t>{40000, 40000, 40000, 32768, 32768, 32768, 8192, 8192, 8192}));
  // A step of any size and tier now replays.
  const int64_t replays = backend_->n_replays;
  g->run(step({100, 30000, 7}, 40000));
  g->run(step({3}, 40000));
  EXPECT_EQ(backend_->n_replays, replays + 2);
  EXPECT_EQ(g->n_recorded(), 9);
}

}  // namespace
}  // namespace pagellm
