// FP8 checkpoints: the e4m3 conversions against the format's definition, F8B32 blocks built from
// each scale granularity to the exact products, the fp8 quantization_config variants, and every
// kind of broken scale refused with an error naming the tensor.
#include "io/fp8_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/quant_config.h"
#include "memory_source.h"

namespace pagellm {
namespace {

using ::testing::HasSubstr;

TEST(E4M3, EveryCodeDecodesAsTheFormatDefinesAndRoundTrips) {
  // The format: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; subnormals; S.1111.111 NaN.
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xff)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float v = e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(f32_to_e4m3(v), c == 0x80 ? 0x80 : c) << "code " << c << " value " << v;
  }
}

TEST(E4M3, RoundsToNearestEvenAndSaturates) {
  // Halfway between 1.0 (mantissa 0) and 1.125 (1): to the even mantissa, 1.0; between 1.125 and
  // 1.25: up to 1.25 (mantissa 2).
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.0625f)), 1.0f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.1875f)), 1.25f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1.07f)), 1.125f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(-3.3f)), -3.25f);
  // Subnormal halfway (1.5 x 2^-9): to even, 2 x 2^-9.
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(std::ldexp(1.5f, -9))), std::ldexp(2.0f, -9));
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(1e6f)), 448.0f);
  EXPECT_EQ(e4m3_to_f32(f32_to_e4m3(-464.0f)), -448.0f);
  EXPECT_EQ(f32_to_e4m3(std::nanf("")), 0x7f);
}

TEST(E4M3, BlocksQuantizeToTheirLargestMagnitude) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> x(96), back(96);
  for (float& v : x) v = u(rng);
  std::vector<uint8_t> blocks(dtype_bytes(DType::kF8B32, 96));
  from_f32(DType::kF8B32, x.data(), blocks.data(), 96);
  to_f32(DType::kF8B32, blocks.data(), back.data(), 96);
  for (int i = 0; i < 96; ++i)  // e4m3 keeps 3 mantissa bits: within 2^-4 relative
    EXPECT_NEAR(back[i], x[i], std::fabs(x[i]) / 16 + 1e-6) << i;
}

// An FP8 linear [m, k]: random codes (no NaN) and its scales.
struct Fp8Linear {
  int64_t m, k;
  std::vector<uint8_t> q;
  explicit Fp8Linear(int64_t m_, int64_t k_, uint32_t seed) : m(m_), k(k_) {
    std::mt19937 rng(seed);
    for (int64_t i = 0; i < m * k; ++i) {
      uint8_t c = static_cast<uint8_t>(rng() & 0xff);
      if ((c & 0x7f) == 0x7f) c = 0x38;
      q.push_back(c);
    }
  }
};

QuantConfig fp8_config(std::vector<int64_t> block = {}) {
  QuantConfig q;
  q.method = QuantMethod::kFp8;
  q.bits = 8;
  q.fp8_block = std::move(block);
  return q;
}

// The converted weight's values against d(row, col) * e4m3(code), exactly.
void expect_blocks(const WeightSource& w, const std::string& name, const Fp8Linear& l,
                   const std::function<float(int64_t, int64_t)>& scale) {
  const TensorInfo* t = w.find(name);
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->dtype, DType::kF8B32);
  ASSERT_EQ(t->shape, (std::vector<int64_t>{l.m, l.k}));
  std::vector<float> got(l.m * l.k);
  to_f32(DType::kF8B32, t->data, got.data(), l.m * l.k);
  int64_t bad = 0;
  for (int64_t r = 0; r < l.m; ++r)
    for (int64_t c = 0; c < l.k; ++c)
      bad += got[r * l.k + c] != scale(r, c) * e4m3_to_f32(l.q[r * l.k + c]);
  EXPECT_EQ(bad, 0) << name;
}

TEST(Fp8Weights, EachScaleGranularityGivesTheExactProducts) {
  MemorySource* src = new MemorySource;
  std::unique_ptr<WeightSource> owned(src);
  const Fp8Linear a(40, 96, 1), b(16, 64, 2), c(200, 288, 3);
  src->add("l.a.weight", DType::kF8E4M3, {40, 96}, a.q);
  src->add("l.a.weight_scale", DType::kF32, {}, std::vector<float>{0.5f});
  src->add("l.a.input_scale", DType::kF32, {}, std::vector<float>{0.01f});
  std::vector<uint16_t> row_scales;  // bf16 per row, [m, 1] as compressed-tensors stores them
  for (int64_t r = 0; r < 16; ++r) row_scales.push_back(f32_to_bf16(0.25f + 0.0625f * r));
  src->add("l.b.weight", DType::kF8E4M3, {16, 64}, b.q);
  src->add("l.b.weight_scale", DType::kBF16, {16, 1}, row_scales);
  std::vector<float> block_scales;  // [ceil(200 / 128), ceil(288 / 128)] = [2, 3]
  for (int i = 0; i < 6; ++i) block_scales.push_back(0.001f * static_cast<float>(i + 1));
  src->add("l.c.weight", DType::kF8E4M3, {200, 288}, c.q);
  src->add("l.c.weight_scale_inv", DType::kF32, {2, 3}, block_scales);
  src->add("l.norm.weight", DType::kBF16, {4}, std::vector<uint16_t>(4, f32_to_bf16(1.0f)));
  auto w = fp8_block_weights(std::move(owned), fp8_config({128, 128}));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  expect_blocks(**w, "l.a.weight", a, [](int64_t, int64_t) { return 0.5f; });
  expect_blocks(**w, "l.b.weight", b,
                [](int64_t r, int64_t) { return 0.25f + 0.0625f * static_cast<float>(r); });
  expect_blocks(**w, "l.c.weight", c, [&](int64_t r, int64_t col) {
    return block_scales[(r / 128) * 3 + col / 128];
  });
  // Scales are consumed; other tensors pass through.
  EXPECT_EQ((*w)->find("l.a.weight_scale"), nullptr);
  EXPECT_EQ((*w)->find("l.a.input_scale"), nullptr);
  EXPECT_EQ((*w)->find("l.c.weight_scale_inv"), nullptr);
  ASSERT_NE((*w)->find("l.norm.weight"), nullptr);
  EXPECT_EQ((*w)->find("l.norm.weight")->dtype, DType::kBF16);
}

TEST(Fp8Weights, BrokenScalesAreErrorsNamingTheTensor) {
  const Fp8Linear l(32, 64, 9);
  struct Case {
    const char* what;
    std::function<void(MemorySource&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"missing scale", [](MemorySource& s) { s.remove("l.w.weight_scale_inv"); },
       "has no scale"},
      {"NaN scale",
       [](MemorySource& s) {
         s.remove("l.w.weight_scale_inv");
         s.add("l.w.weight_scale_inv", DType::kF32, {1, 1}, std::vector<float>{std::nanf("")});
       },
       "must be finite and positive"},
      {"zero scale",
       [](MemorySource& s) {
         s.remove("l.w.weight_scale_inv");
         s.add("l.w.weight_scale_inv", DType::kF32, {1, 1}, std::vector<float>{0.0f});
       },
       "must be finite and positive"},
      {"wrong block count",
       [](MemorySource& s) {
         s.remove("l.w.weight_scale_inv");
         s.add("l.w.weight_scale_inv", DType::kF32, {2, 2}, std::vector<float>(4, 1.0f));
       },
       "expected [], [1], [32] or [32, 1] or [1, 1] (blocks of 128 x 128)"},
      {"integer scale",
       [](MemorySource& s) {
         s.remove("l.w.weight_scale_inv");
         s.add("l.w.weight_scale_inv", DType::kI32, {1, 1}, std::vector<int32_t>{1});
       },
       "expected a float scale"},
      {"NaN weight",
       [](MemorySource& s) {
         std::vector<uint8_t> q(32 * 64, 0x38);
         q[100] = 0xff;
         s.remove("l.w.weight");
         s.add("l.w.weight", DType::kF8E4M3, {32, 64}, q);
       },
       "holds a NaN (code 255) at 100"},
      {"orphan scale",
       [](MemorySource& s) {
         s.add("l.v.weight_scale", DType::kF32, {}, std::vector<float>{1.0f});
       },
       "belongs to no FP8 weight"},
      {"3-D FP8 tensor",
       [](MemorySource& s) { s.add("l.e.weight", DType::kF8E4M3, {2, 4, 32}, std::vector<uint8_t>(256)); },
       "must be 2-D"},
      {"FP8 non-weight",
       [](MemorySource& s) { s.add("l.bias", DType::kF8E4M3, {32}, std::vector<uint8_t>(32)); },
       "is FP8 but not a weight"},
  };
  for (const Case& c : cases) {
    auto* src = new MemorySource;
    std::unique_ptr<WeightSource> owned(src);
    src->add("l.w.weight", DType::kF8E4M3, {32, 64}, l.q);
    src->add("l.w.weight_scale_inv", DType::kF32, {1, 1}, std::vector<float>{0.5f});
    c.edit(*src);
    auto w = fp8_block_weights(std::move(owned), fp8_config({128, 128}));
    ASSERT_FALSE(w.ok()) << c.what;
    EXPECT_THAT(w.status().to_string(), HasSubstr(c.message)) << c.what;
    EXPECT_THAT(w.status().to_string(), HasSubstr("mem.safetensors: tensor 'l.")) << c.what;
  }
}

TEST(Fp8Weights, QuantizationConfigVariants) {
  auto parse = [](const std::string& text) { return parse_quant_config(text, "config.json"); };
  auto block = parse(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                          "weight_block_size": [128, 128]})");
  ASSERT_TRUE(block.ok()) << block.status().to_string();
  EXPECT_EQ(block->method, QuantMethod::kFp8);
  EXPECT_EQ(block->fp8_block, (std::vector<int64_t>{128, 128}));
  EXPECT_FALSE(block->fp8_static_activations);
  auto per_tensor = parse(R"({"quant_method": "fp8", "activation_scheme": "static"})");
  ASSERT_TRUE(per_tensor.ok());
  EXPECT_TRUE(per_tensor->fp8_block.empty());
  EXPECT_TRUE(per_tensor->fp8_static_activations);
  auto ct = parse(R"({"quant_method": "compressed-tensors", "format": "float-quantized",
    "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
    "strategy": "block", "block_structure": [128, 128]}, "input_activations": {"num_bits": 8,
    "type": "float", "dynamic": true}}}, "ignore": ["lm_head"]})");
  ASSERT_TRUE(ct.ok()) << ct.status().to_string();
  EXPECT_EQ(ct->method, QuantMethod::kFp8);
  EXPECT_EQ(ct->fp8_block, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(ct->unquantized_modules, std::vector<std::string>{"lm_head"});
  EXPECT_THAT(parse(R"({"quant_method": "fp8", "fmt": "e5m2"})").status().to_string(),
              HasSubstr("only e4m3"));
  EXPECT_THAT(parse(R"({"quant_method": "fp8", "weight_block_size": [128, 100]})")
                  .status()
                  .to_string(),
              HasSubstr("multiple of 32 columns"));
  EXPECT_THAT(parse(R"({"quant_method": "fp8", "weight_block_size": [128]})").status().to_string(),
              HasSubstr("two positive integers"));
}

}  // namespace
}  // namespace pagellm
