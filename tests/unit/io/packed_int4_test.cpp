// Packed 4-bit checkpoints: quantization_config parsing, each packing's layout unpacked to known
// values (the golden fixtures check the same against the writers' own libraries), and every kind
// of inconsistency refused with an error naming the tensor.
#include "io/packed_int4.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/quant_config.h"
#include "io/weights.h"
#include "memory_source.h"

namespace pagellm {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// A random linear: ints q [N, K], zero points and f16 scales [N, K/G].
struct Linear {
  int64_t n, k, g;
  std::vector<int> q, z;
  std::vector<uint16_t> s;
  Linear(int64_t n_, int64_t k_, int64_t g_, uint32_t seed, bool symmetric = false)
      : n(n_), k(k_), g(g_) {
    std::mt19937 rng(seed);
    for (int64_t i = 0; i < n * k; ++i) q.push_back(static_cast<int>(rng() % 16));
    for (int64_t i = 0; i < n * (k / g); ++i) {
      z.push_back(symmetric ? 8 : static_cast<int>(rng() % 16));
      // k / 256, k < 64: exact in f16 and in bf16 (compressed-tensors stores the model's dtype).
      s.push_back(f32_to_f16(static_cast<float>(1 + rng() % 63) / 256.0f));
    }
  }
  float value(int64_t r, int64_t c) const {
    const int64_t gi = r * (k / g) + c / g;
    return f16_to_f32(s[gi]) * static_cast<float>(q[r * k + c] - z[gi]);
  }
};

// Packs 8 nibbles per int32, value(i) in bits 4i.
int32_t word(const std::function<int(int)>& value) {
  uint32_t w = 0;
  for (int i = 0; i < 8; ++i) w |= static_cast<uint32_t>(value(i) & 0xf) << (4 * i);
  return static_cast<int32_t>(w);
}

constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

void add_awq(MemorySource& src, const std::string& prefix, const Linear& l) {
  std::vector<int32_t> qw, qz;
  std::vector<uint16_t> sc;
  for (int64_t c = 0; c < l.k; ++c)
    for (int64_t w = 0; w < l.n / 8; ++w)
      qw.push_back(word([&](int i) { return l.q[(8 * w + kAwqOrder[i]) * l.k + c]; }));
  for (int64_t gi = 0; gi < l.k / l.g; ++gi)
    for (int64_t w = 0; w < l.n / 8; ++w)
      qz.push_back(word([&](int i) { return l.z[(8 * w + kAwqOrder[i]) * (l.k / l.g) + gi]; }));
  for (int64_t gi = 0; gi < l.k / l.g; ++gi)
    for (int64_t r = 0; r < l.n; ++r) sc.push_back(l.s[r * (l.k / l.g) + gi]);
  src.add(prefix + ".qweight", DType::kI32, {l.k, l.n / 8}, qw);
  src.add(prefix + ".qzeros", DType::kI32, {l.k / l.g, l.n / 8}, qz);
  src.add(prefix + ".scales", DType::kF16, {l.k / l.g, l.n}, sc);
}

void add_gptq(MemorySource& src, const std::string& prefix, const Linear& l, bool v1) {
  std::vector<int32_t> qw, qz, gidx;
  std::vector<uint16_t> sc;
  for (int64_t w = 0; w < l.k / 8; ++w)
    for (int64_t r = 0; r < l.n; ++r)
      qw.push_back(word([&](int i) { return l.q[r * l.k + 8 * w + i]; }));
  for (int64_t gi = 0; gi < l.k / l.g; ++gi)
    for (int64_t w = 0; w < l.n / 8; ++w)
      qz.push_back(word([&](int i) { return l.z[(8 * w + i) * (l.k / l.g) + gi] - (v1 ? 1 : 0); }));
  for (int64_t gi = 0; gi < l.k / l.g; ++gi)
    for (int64_t r = 0; r < l.n; ++r) sc.push_back(l.s[r * (l.k / l.g) + gi]);
  for (int64_t c = 0; c < l.k; ++c) gidx.push_back(static_cast<int32_t>(c / l.g));
  src.add(prefix + ".qweight", DType::kI32, {l.k / 8, l.n}, qw);
  src.add(prefix + ".qzeros", DType::kI32, {l.k / l.g, l.n / 8}, qz);
  src.add(prefix + ".scales", DType::kF16, {l.k / l.g, l.n}, sc);
  src.add(prefix + ".g_idx", DType::kI32, {l.k}, gidx);
}

void add_ct(MemorySource& src, const std::string& prefix, const Linear& l, bool symmetric) {
  std::vector<int32_t> wp, zp;
  std::vector<uint16_t> sc;
  for (int64_t r = 0; r < l.n; ++r)
    for (int64_t w = 0; w < l.k / 8; ++w)
      wp.push_back(word([&](int i) { return l.q[r * l.k + 8 * w + i]; }));
  for (int64_t r = 0; r < l.n; ++r)
    for (int64_t gi = 0; gi < l.k / l.g; ++gi)
      sc.push_back(f32_to_bf16(f16_to_f32(l.s[r * (l.k / l.g) + gi])));
  src.add(prefix + ".weight_packed", DType::kI32, {l.n, l.k / 8}, wp);
  src.add(prefix + ".weight_scale", DType::kBF16, {l.n, l.k / l.g}, sc);
  src.add(prefix + ".weight_shape", DType::kI64, {2}, std::vector<int64_t>{l.n, l.k});
  if (!symmetric) {
    for (int64_t w = 0; w < l.n / 8; ++w)
      for (int64_t gi = 0; gi < l.k / l.g; ++gi)
        zp.push_back(word([&](int i) { return l.z[(8 * w + i) * (l.k / l.g) + gi]; }));
    src.add(prefix + ".weight_zero_point", DType::kI32, {l.n / 8, l.k / l.g}, zp);
  }
}

QuantConfig config(QuantMethod m, int64_t group, bool zero_point = true, bool v1 = true) {
  QuantConfig q;
  q.method = m;
  q.group_size = group;
  q.zero_point = zero_point;
  q.gptq_zeros_minus_one = v1;
  return q;
}

void expect_unpacks_to(const WeightSource& w, const std::string& name, const Linear& l,
                       DType want) {
  const TensorInfo* t = w.find(name);
  ASSERT_NE(t, nullptr) << name;
  EXPECT_EQ(t->dtype, want);
  ASSERT_EQ(t->shape, (std::vector<int64_t>{l.n, l.k}));
  std::vector<float> y(l.n * l.k);
  to_f32(t->dtype, t->data, y.data(), l.n * l.k);
  for (int64_t r = 0; r < l.n; ++r)
    for (int64_t c = 0; c < l.k; ++c)
      ASSERT_EQ(y[r * l.k + c], l.value(r, c)) << name << " [" << r << ", " << c << "]";
}

std::string unpack_error(std::unique_ptr<MemorySource> src, const QuantConfig& q) {
  auto r = unpack_int4_weights(std::move(src), q);
  return r.ok() ? "ok" : r.status().to_string();
}

TEST(PackedInt4, AwqUnpacksExactly) {
  const Linear a(16, 256, 128, 1), b(8, 64, 64, 2), c(24, 96, 32, 3);
  auto src = std::make_unique<MemorySource>();
  add_awq(*src, "m.a", a);
  src->add("m.a.bias", DType::kF32, {16}, std::vector<float>(16, 0.5f));
  auto w = unpack_int4_weights(std::move(src), config(QuantMethod::kAwq, 128));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  expect_unpacks_to(**w, "m.a.weight", a, DType::kI4G128);
  EXPECT_NE((*w)->find("m.a.bias"), nullptr);
  EXPECT_EQ((*w)->find("m.a.qweight"), nullptr);
  for (auto [l, g] : {std::pair{b, 64}, {c, 32}}) {
    auto s = std::make_unique<MemorySource>();
    add_awq(*s, "x", l);
    auto u = unpack_int4_weights(std::move(s), config(QuantMethod::kAwq, g));
    ASSERT_TRUE(u.ok()) << u.status().to_string();
    expect_unpacks_to(**u, "x.weight", l, group_int4_dtype(g));
  }
}

TEST(PackedInt4, GptqV1AndV2AndWholeRowGroups) {
  for (bool v1 : {true, false}) {
    auto src = std::make_unique<MemorySource>();
    const Linear l(16, 128, 64, 4);  // zero points 0..15: v1 stores 0 as 15
    add_gptq(*src, "p", l, v1);
    auto w = unpack_int4_weights(std::move(src), config(QuantMethod::kGptq, 64, true, v1));
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    expect_unpacks_to(**w, "p.weight", l, DType::kI4G64);
  }
  // group -1: one scale per row, repeated in every 128-value block.
  auto src = std::make_unique<MemorySource>();
  const Linear l(8, 384, 384, 5, /*symmetric=*/true);
  add_gptq(*src, "p", l, true);
  auto w = unpack_int4_weights(std::move(src), config(QuantMethod::kGptq, -1, false));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  expect_unpacks_to(**w, "p.weight", l, DType::kI4G128);
}

// GPTQ act-order: a g_idx that interleaves the two groups (even inputs in one, odd in the other)
// gives an f32 weight, each input dequantized with its own group's scale and zero point.
TEST(PackedInt4, GptqActOrderGivesExactF32Weights) {
  const Linear l(16, 128, 64, 8);
  auto src = std::make_unique<MemorySource>();
  add_gptq(*src, "a", l, true);
  std::vector<int32_t> g(128);
  for (int i = 0; i < 128; ++i) g[i] = i % 2;
  src->remove("a.g_idx");
  src->add("a.g_idx", DType::kI32, {128}, g);
  auto w = unpack_int4_weights(std::move(src), config(QuantMethod::kGptq, 64));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const TensorInfo* t = (*w)->find("a.weight");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->dtype, DType::kF32);
  ASSERT_EQ(t->shape, (std::vector<int64_t>{16, 128}));
  const float* v = static_cast<const float*>(t->data);
  int64_t bad = 0;
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t c = 0; c < 128; ++c) {
      const int64_t gi = r * 2 + g[c];
      bad += v[r * 128 + c] != f16_to_f32(l.s[gi]) * static_cast<float>(l.q[r * 128 + c] - l.z[gi]);
    }
  EXPECT_EQ(bad, 0);
}

TEST(PackedInt4, CompressedTensorsSymmetricAndAsymmetric) {
  for (bool sym : {true, false}) {
    auto src = std::make_unique<MemorySource>();
    const Linear l(16, 128, 32, 6, sym);
    add_ct(*src, "c", l, sym);
    auto w = unpack_int4_weights(std::move(src), config(QuantMethod::kCompressedTensors, 32, !sym));
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    expect_unpacks_to(**w, "c.weight", l, DType::kI4G32);
  }
}

TEST(PackedInt4, InconsistentCheckpointsAreErrorsNamingTheTensor) {
  const Linear l(16, 128, 64, 7);
  const QuantConfig awq = config(QuantMethod::kAwq, 64), gptq = config(QuantMethod::kGptq, 64);
  auto make = [&](auto&& edit, bool is_gptq = false) {
    auto s = std::make_unique<MemorySource>();
    if (is_gptq)
      add_gptq(*s, "m.q", l, true);
    else
      add_awq(*s, "m.q", l);
    edit(*s);
    return s;
  };
  EXPECT_THAT(unpack_error(make([](MemorySource& s) { s.remove("m.q.scales"); }), awq),
              HasSubstr("'m.q.scales' is missing"));
  EXPECT_THAT(unpack_error(make([](MemorySource& s) {
                             s.remove("m.q.qzeros");
                             s.add("m.q.qzeros", DType::kI32, {1, 2}, std::vector<int32_t>{0, 0});
                           }),
                           awq),
              HasSubstr("'m.q.qzeros' has shape [1, 2], expected [2, 2]"));
  EXPECT_THAT(unpack_error(make([](MemorySource& s) {
                             s.remove("m.q.scales");
                             s.add("m.q.scales", DType::kI32, {2, 16}, std::vector<int32_t>(32));
                           }),
                           awq),
              HasSubstr("'m.q.scales' is i32, expected a float type"));
  // The group must divide the inputs: 128 inputs, groups of 96.
  EXPECT_THAT(unpack_error(make([](MemorySource&) {}), config(QuantMethod::kAwq, 96)),
              HasSubstr("multiple of 32 and of the group size 96"));
  EXPECT_THAT(
      unpack_error(make([](MemorySource& s) {
                     s.add("m.q.weight", DType::kF16, {16, 128}, std::vector<uint16_t>(16 * 128));
                   }),
                   awq),
      HasSubstr("'m.q.weight' exists beside its packed form"));
  EXPECT_THAT(unpack_error(make([](MemorySource& s) {
                             s.add("m.k.scales", DType::kF16, {2, 16}, std::vector<uint16_t>(32));
                           }),
                           awq),
              HasSubstr("'m.k.scales' belongs to no qweight tensor"));
  EXPECT_THAT(unpack_error(make(
                               [](MemorySource& s) {
                                 s.remove("m.q.g_idx");
                                 s.add("m.q.g_idx", DType::kI32, {128},
                                       std::vector<int32_t>(128, 7));
                               },
                               true),
                           gptq),
              HasSubstr("the group 7 of 2"));
  // A bf16 scale f16 cannot hold (below its subnormal range) is refused, not rounded.
  auto ct = std::make_unique<MemorySource>();
  add_ct(*ct, "c", l, true);
  ct->remove("c.weight_scale");
  ct->add("c.weight_scale", DType::kBF16, {16, 2}, std::vector<uint16_t>(32, f32_to_bf16(1e-30f)));
  EXPECT_THAT(unpack_error(std::move(ct), config(QuantMethod::kCompressedTensors, 64, false)),
              HasSubstr("which f16 cannot hold exactly"));
}

// pack_awq writes what unpack_int4_weights reads: from_f32's blocks, byte for byte.
TEST(PackedInt4, AwqPackingReadsBackAsTheRoundedWeights) {
  for (int g : {32, 64, 128}) {
    const int64_t n = 24, k = 256;
    std::mt19937 rng(g);
    std::normal_distribution<float> dist(0.1f, 1.0f);
    std::vector<float> w(n * k);
    for (float& v : w) v = dist(rng);
    const AwqTensors a = pack_awq(w.data(), n, k, g);
    auto src = std::make_unique<MemorySource>();
    src->add("p.qweight", DType::kI32, {k, n / 8}, a.qweight);
    src->add("p.qzeros", DType::kI32, {k / g, n / 8}, a.qzeros);
    src->add("p.scales", DType::kF16, {k / g, n}, a.scales);
    auto r = unpack_int4_weights(std::move(src), config(QuantMethod::kAwq, g));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const TensorInfo* t = (*r)->find("p.weight");
    ASSERT_NE(t, nullptr);
    const DType dt = group_int4_dtype(g);
    ASSERT_EQ(t->dtype, dt);
    std::vector<uint8_t> want(dtype_bytes(dt, n * k));
    from_f32(dt, w.data(), want.data(), n * k);
    ASSERT_EQ(t->nbytes, static_cast<int64_t>(want.size()));
    EXPECT_EQ(std::memcmp(t->data, want.data(), want.size()), 0) << "group " << g;
  }
}

Status parse(const json& j) {
  return parse_quant_config(j.dump(), "config.json").status();
}

TEST(QuantConfig, ReadsEachWriterAndRefusesWhatItCannotLoad) {
  auto awq = parse_quant_config(R"({"quant_method": "awq", "bits": 4, "group_size": 64,
      "zero_point": true, "version": "GEMM", "modules_to_not_convert": ["visual"]})",
                                "c");
  ASSERT_TRUE(awq.ok()) << awq.status().to_string();
  EXPECT_EQ(awq->method, QuantMethod::kAwq);
  EXPECT_EQ(awq->group_size, 64);
  EXPECT_EQ(awq->unquantized_modules, std::vector<std::string>{"visual"});
  auto gptq = parse_quant_config(R"({"quant_method": "gptq", "bits": 4, "group_size": -1,
      "sym": false, "desc_act": true, "checkpoint_format": "gptq_v2"})",
                                 "c");
  ASSERT_TRUE(gptq.ok()) << gptq.status().to_string();
  EXPECT_TRUE(gptq->zero_point && gptq->desc_act && !gptq->gptq_zeros_minus_one);
  EXPECT_EQ(gptq->group_size, -1);
  const json ct = {
      {"quant_method", "compressed-tensors"},
      {"format", "pack-quantized"},
      {"ignore", {"lm_head"}},
      {"config_groups",
       {{"group_0",
         {{"targets", {"Linear"}},
          {"input_activations", nullptr},
          {"weights",
           {{"num_bits", 4}, {"type", "int"}, {"symmetric", false}, {"strategy", "channel"}}}}}}}};
  auto c = parse_quant_config(ct.dump(), "c");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->group_size, -1);
  EXPECT_TRUE(c->zero_point);
  EXPECT_EQ(c->unquantized_modules, std::vector<std::string>{"lm_head"});

  EXPECT_THAT(parse({{"quant_method", "awq"}, {"bits", 8}}).to_string(), HasSubstr("bits' is 8"));
  EXPECT_THAT(parse({{"quant_method", "awq"}, {"version", "gemv"}}).to_string(),
              HasSubstr("GEMM packing"));
  EXPECT_THAT(parse({{"quant_method", "gptq"}, {"group_size", 48}}).to_string(),
              HasSubstr("group_size' is 48"));
  EXPECT_THAT(parse({{"quant_method", "bitsandbytes"}}).to_string(),
              HasSubstr("quant_method' is 'bitsandbytes'"));
  EXPECT_THAT(parse({{"bits", 4}}).to_string(), HasSubstr("quant_method' is missing"));
  json two = ct;
  two["config_groups"]["group_1"] = two["config_groups"]["group_0"];
  EXPECT_THAT(parse(two).to_string(), HasSubstr("has 2 schemes"));
  json w8a8 = ct;
  w8a8["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
  EXPECT_THAT(parse(w8a8).to_string(), HasSubstr("weight-only"));
  json fmt = ct;
  fmt["format"] = "int-quantized";
  EXPECT_THAT(parse(fmt).to_string(), HasSubstr("format' is 'int-quantized'"));
  // float-quantized is FP8's (fp8_weights_test): a 4-bit int scheme under it is refused.
  json fp8 = ct;
  fp8["format"] = "float-quantized";
  EXPECT_THAT(parse(fp8).to_string(), HasSubstr("must be 8-bit float"));
}

}  // namespace
}  // namespace pagellm
