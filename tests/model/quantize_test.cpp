// pagellm quantize: a golden float checkpoint to AWQ, read back by the loader: every projection
// holds exactly the round-to-nearest blocks of its float weight, everything else is unchanged,
// and the model loads and generates. (The AWQ layout itself is checked against AutoAWQ's packer by
// the awq_* golden fixtures.)
#include "io/quantize.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "io/weights.h"
#include "model/model.h"
#include "source_dir.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;

TEST(Quantize, GoldenLlamaToAwqReadsBackAsRoundedWeights) {
  const std::string src = test_source_dir() + "/tests/data/golden/llama";
  const fs::path out = fs::temp_directory_path() / ("pagellm_quantize_" + std::to_string(getpid()));
  fs::remove_all(out);
  std::string summary;
  QuantizeOptions o;
  o.group_size = 32;  // the fixture's rows are 64 and 96 wide
  ASSERT_TRUE(quantize_checkpoint(src, out.string(), o, &summary).ok());
  EXPECT_NE(summary.find("14 weights packed"), std::string::npos) << summary;  // 2 layers x 7

  auto a = open_checkpoint(src);
  auto b = open_checkpoint(out.string());
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
  ASSERT_TRUE(b->config.quantization.has_value());
  int packed = 0;
  for (const TensorInfo& t : a->weights->tensors()) {
    const TensorInfo* q = b->weights->find(t.name);
    ASSERT_NE(q, nullptr) << t.name;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (q->dtype == DType::kI4G32) {
      std::vector<float> f(n);
      to_f32(t.dtype, t.data, f.data(), n);
      std::vector<uint8_t> want(dtype_bytes(DType::kI4G32, n));
      from_f32(DType::kI4G32, f.data(), want.data(), n);
      ASSERT_EQ(q->nbytes, static_cast<int64_t>(want.size())) << t.name;
      EXPECT_EQ(std::memcmp(q->data, want.data(), want.size()), 0) << t.name;
      ++packed;
    } else {
      ASSERT_EQ(q->dtype, t.dtype) << t.name;
      EXPECT_EQ(std::memcmp(q->data, t.data, t.nbytes), 0) << t.name;
    }
  }
  EXPECT_EQ(packed, 14);
  auto backend = make_cpu_backend(true);
  auto model = load_model(*b, *backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();

  // Refused: an already quantized folder, and the folder itself as output.
  EXPECT_FALSE(quantize_checkpoint(out.string(), (out / "again").string(), o, nullptr).ok());
  EXPECT_FALSE(quantize_checkpoint(src, src, o, nullptr).ok());
  o.group_size = 48;
  EXPECT_FALSE(quantize_checkpoint(src, (out / "g48").string(), o, nullptr).ok());
  fs::remove_all(out);
}

}  // namespace
}  // namespace pagellm
