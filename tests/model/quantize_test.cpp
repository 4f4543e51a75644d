// pagellm quantize: a golden float checkpoint to AWQ, read back by the loader: every projection
// holds exactly the round-to-nearest blocks of its float weight, everything else is unchanged,
// and the model loads and generates. (The AWQ layout itself is checked against AutoAWQ's packer by
// the awq_* golden fixtures.)
#include "io/quantize.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
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

// FP8, per row and per 128 x 128 block: each projection reads back (as F8B32 blocks) as
// s * e4m3(w / s) with s the largest magnitude it covers over 448, within e4m3's 2^-4 of w, and
// the model loads.
TEST(Quantize, GoldenLlamaToFp8ReadsBackAsRoundedWeights) {
  const std::string src = test_source_dir() + "/tests/data/golden/llama";
  for (const char* format : {"fp8", "fp8-block"}) {
    const bool blocks = std::string(format) == "fp8-block";
    const fs::path out =
        fs::temp_directory_path() / ("pagellm_quantize_" + std::string(format) + "_" + std::to_string(getpid()));
    fs::remove_all(out);
    QuantizeOptions o;
    o.format = format;
    std::string summary;
    ASSERT_TRUE(quantize_checkpoint(src, out.string(), o, &summary).ok()) << format;
    EXPECT_NE(summary.find("14 weights packed"), std::string::npos) << summary;
    auto a = open_checkpoint(src);
    auto b = open_checkpoint(out.string());
    ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
    int packed = 0;
    for (const TensorInfo& t : a->weights->tensors()) {
      const TensorInfo* q = b->weights->find(t.name);
      ASSERT_NE(q, nullptr) << t.name;
      if (q->dtype != DType::kF8B32) {
        ASSERT_EQ(q->dtype, t.dtype) << t.name;
        EXPECT_EQ(std::memcmp(q->data, t.data, t.nbytes), 0) << t.name;
        continue;
      }
      const int64_t n = t.shape[0], k = t.shape[1];
      std::vector<float> w(n * k), got(n * k);
      to_f32(t.dtype, t.data, w.data(), n * k);
      to_f32(DType::kF8B32, q->data, got.data(), n * k);
      const int64_t b0 = blocks ? 128 : 1, b1 = blocks ? 128 : k;
      int64_t bad = 0;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
          float amax = 0.0f;
          for (int64_t rr = r / b0 * b0; rr < std::min(n, r / b0 * b0 + b0); ++rr)
            for (int64_t cc = c / b1 * b1; cc < std::min(k, c / b1 * b1 + b1); ++cc)
              amax = std::max(amax, std::fabs(w[rr * k + cc]));
          const float s = amax > 0.0f ? amax / 448.0f : 1.0f, x = w[r * k + c];
          bad += got[r * k + c] != s * e4m3_to_f32(f32_to_e4m3(x / s)) ||
                 std::fabs(got[r * k + c] - x) > std::fabs(x) / 16 + s / 512;
        }
      EXPECT_EQ(bad, 0) << format << " " << t.name;
      ++packed;
    }
    EXPECT_EQ(packed, 14) << format;
    auto backend = make_cpu_backend(true);
    auto model = load_model(*b, *backend);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    fs::remove_all(out);
  }
  QuantizeOptions bad;
  bad.format = "int3";
  EXPECT_FALSE(quantize_checkpoint(src, (fs::temp_directory_path() / "pagellm_q_int3").string(),
                                   bad, nullptr)
                   .ok());
}

}  // namespace
}  // namespace pagellm
