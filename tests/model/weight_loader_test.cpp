// WeightLoader's stacking and row reordering, on the CPU backend with an in-memory checkpoint:
// the values land where the architecture files expect them (a wrong row order would otherwise
// show only as slightly different logits in the golden tests, and not at all for the biases the
// tiny fixtures lack). And a model that does not fit its backend's memory: a Status naming the
// weight, the bytes wanted and the bytes free, never a crash (a GPU smaller than the model).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/weights.h"
#include "model/model.h"
#include "model/weight_loader.h"
#include "source_dir.h"
#include "unit/runtime/forwarding_backend.h"

namespace pagellm {
namespace {

// f32 tensors held in vectors; TensorInfo views them.
class MemorySource final : public WeightSource {
 public:
  void add(const std::string& name, std::vector<int64_t> shape, std::vector<float> values) {
    data_.push_back(std::move(values));
    infos_.push_back({name, DType::kF32, std::move(shape), data_.back().data(),
                      static_cast<int64_t>(data_.back().size() * sizeof(float)), "memory"});
  }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  const TensorInfo* find(const std::string& name) const override {
    for (const TensorInfo& t : infos_)
      if (t.name == name) return &t;
    return nullptr;
  }
  std::string description() const override { return "memory"; }

 private:
  // TensorInfo keeps raw pointers into the inner vectors, whose buffers stay put when data_ grows.
  std::vector<std::vector<float>> data_;
  std::vector<TensorInfo> infos_;
};

std::vector<float> to_vector(const Tensor& t) {
  const float* p = static_cast<const float*>(t.data);
  return std::vector<float>(p, p + t.numel());
}

TEST(WeightLoader, ReorderedMatrixAndVectorTakeTheRowRangesInOrder) {
  MemorySource src;
  // 5 rows of 3: row r holds r*10, r*10 + 1, r*10 + 2.
  std::vector<float> m;
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 3; ++c) m.push_back(static_cast<float>(r * 10 + c));
  src.add("w", {5, 3}, m);
  src.add("b", {5}, {0, 1, 2, 3, 4});
  auto backend = make_cpu_backend();
  LoadOptions opt;
  opt.weight_dtype = DType::kF32;
  WeightLoader ld(*backend, src, opt);
  // DeepSeek's case: the last rows first (k_pe), then the leading ones (c_kv).
  const WeightLoader::RowRanges ranges = {{3, 5}, {0, 3}};
  Result<Tensor> w = ld.reordered_matrix("w", {5, 3}, ranges);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->rows(), 5);
  EXPECT_EQ(w->cols(), 3);
  EXPECT_EQ(to_vector(*w),
            (std::vector<float>{30, 31, 32, 40, 41, 42, 0, 1, 2, 10, 11, 12, 20, 21, 22}));
  Result<Tensor> b = ld.reordered_vector("b", 5, 0.0f, ranges);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(to_vector(*b), (std::vector<float>{3, 4, 0, 1, 2}));
  // A subset of rows, in a new order, is allowed too.
  Result<Tensor> part = ld.reordered_matrix("w", {5, 3}, {{4, 5}, {1, 2}});
  ASSERT_TRUE(part.ok()) << part.status().message();
  EXPECT_EQ(to_vector(*part), (std::vector<float>{40, 41, 42, 10, 11, 12}));
  // A missing tensor is an error naming it, not a crash.
  Result<Tensor> missing = ld.reordered_matrix("absent", {5, 3}, ranges);
  EXPECT_FALSE(missing.ok());
}

TEST(WeightLoader, StackedMatrixConcatenatesThePartsByRows) {
  MemorySource src;
  src.add("q", {2, 2}, {1, 2, 3, 4});
  src.add("k", {1, 2}, {5, 6});
  auto backend = make_cpu_backend();
  LoadOptions opt;
  opt.weight_dtype = DType::kF32;
  WeightLoader ld(*backend, src, opt);
  Result<Tensor> s = ld.stacked_matrix({{"q", 2}, {"k", 1}}, 2);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->rows(), 3);
  EXPECT_EQ(to_vector(*s), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

// The CPU backend with `budget` bytes: an allocation past them fails as a full device's does.
class SmallMemoryBackend final : public ForwardingBackend {
 public:
  SmallMemoryBackend(Backend& inner, int64_t budget) : ForwardingBackend(inner), left_(budget) {}
  std::unique_ptr<Buffer> allocate(int64_t n) override {
    if (n > left_) return nullptr;
    left_ -= n;
    return ForwardingBackend::allocate(n);
  }
  int64_t free_memory() const override { return left_; }

 private:
  int64_t left_;
};

TEST(WeightLoader, AModelLargerThanTheMemoryIsAnErrorNamingTheWeight) {
  auto cpu = make_cpu_backend();
  Result<LoadedCheckpoint> ckpt =
      open_dummy_checkpoint(test_source_dir() + "/tests/data/golden/llama");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  SmallMemoryBackend small(*cpu, 64 << 10);  // the fixture's weights take more
  Result<std::unique_ptr<Model>> model = load_model(*ckpt, small);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), StatusCode::kResourceExhausted);
  const std::string& msg = model.status().message();
  EXPECT_NE(msg.find("is out of memory for weight '"), std::string::npos) << msg;
  EXPECT_NE(msg.find(" wanted, "), std::string::npos) << msg;
  EXPECT_NE(msg.find(" free"), std::string::npos) << msg;
  EXPECT_NE(msg.find(" of weights)"), std::string::npos) << msg;
  // The same load with the memory there succeeds: the budget, not the model, failed it.
  SmallMemoryBackend ample(*cpu, int64_t{1} << 30);
  Result<std::unique_ptr<Model>> fits = load_model(*ckpt, ample);
  EXPECT_TRUE(fits.ok()) << fits.status().message();
}

TEST(WeightLoader, MemorySizesReadAsPeopleWriteThem) {
  EXPECT_EQ(memory_size(512), "512 bytes");
  EXPECT_EQ(memory_size(3584), "3.5 KiB");
  EXPECT_EQ(memory_size(int64_t{12} << 20), "12.0 MiB");
  EXPECT_EQ(memory_size(int64_t{93} << 30), "93.00 GiB");
}

TEST(WeightLoader, AStackWithoutMemoryIsAnErrorNamingItsParts) {
  MemorySource src;
  src.add("q", {2, 2}, {1, 2, 3, 4});
  src.add("k", {1, 2}, {5, 6});
  auto cpu = make_cpu_backend();
  SmallMemoryBackend none(*cpu, 0);
  LoadOptions opt;
  opt.weight_dtype = DType::kF32;
  WeightLoader ld(none, src, opt);
  Result<Tensor> s = ld.stacked_matrix({{"q", 2}, {"k", 1}}, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted) << s.status().message();
  EXPECT_NE(s.status().message().find("the stack of 2 weights 'q' .. 'k'"), std::string::npos)
      << s.status().message();
}

// --load-format dummy --quantization: the decoder's projections whose rows fit the blocks get the
// 4-bit type, with values over the same range as the bf16 dummies; the rest stays bf16; the
// model loads and runs a step.
TEST(WeightLoader, DummyQuantizedProjections) {
  auto ck = open_dummy_checkpoint(test_source_dir() + "/tests/data/golden/awq_llama/config.json");
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto backend = make_cpu_backend(true);
  for (DType q : {DType::kI4G128, DType::kQ4_K}) {
    LoadOptions o;
    o.dummy_quantized = q;
    WeightLoader ld(*backend, *ck->weights, o);
    auto down = ld.matrix("model.layers.0.mlp.down_proj.weight", {128, 256});
    ASSERT_TRUE(down.ok()) << down.status().to_string();
    EXPECT_EQ(down->dtype, q);
    std::vector<float> v(128 * 256);
    to_f32(q, down->data, v.data(), static_cast<int64_t>(v.size()));
    const float a = std::sqrt(3.0f / 256.0f);
    float lo = v[0], hi = v[0];
    for (float x : v) lo = std::min(lo, x), hi = std::max(hi, x);
    // 16 levels cannot centre on 0: the range may be off by half a step (2a / 15 / 2).
    EXPECT_GE(lo, -a * 1.08f);
    EXPECT_LE(hi, a * 1.08f);
    EXPECT_LT(lo, -a * 0.8f);  // spread over the range, not a constant
    EXPECT_GT(hi, a * 0.8f);
    auto q_proj = ld.matrix("model.layers.0.self_attn.q_proj.weight", {128, 128});
    ASSERT_TRUE(q_proj.ok());
    EXPECT_EQ(q_proj->dtype, q == DType::kQ4_K ? DType::kBF16 : q);  // 128-wide rows: no Q4_K
    auto embed = ld.matrix("model.embed_tokens.weight", {256, 128});
    ASSERT_TRUE(embed.ok());
    EXPECT_EQ(embed->dtype, DType::kBF16);
    auto model = load_model(*ck, *backend, o);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
  }
}

}  // namespace
}  // namespace pagellm
