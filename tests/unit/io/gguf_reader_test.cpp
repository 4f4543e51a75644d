// GGUF reader: metadata of every type, tensors of every supported type, the HF weight view, the
// q/k un-permutation, and ModelConfig from metadata. Files are built in memory by gguf_test_util.h.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numbers>
#include <random>

#include "gguf_test_util.h"
#include "io/gguf.h"

namespace pagellm {
namespace {

using testing::Bytes;
using testing::GgufBuilder;

std::string write_temp(const Bytes& b, const std::string& name) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return path;
}

// n random values encoded in `t` (quantized through pagellm's ggml-compatible quantizer).
Bytes random_tensor_bytes(DType t, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  Bytes b(static_cast<size_t>(dtype_bytes(t, n)));
  from_f32(t, x.data(), b.data(), n);
  return b;
}

TEST(GgufReader, MetadataOfEveryTypeReadsBack) {
  GgufBuilder g;
  g.kv<uint8_t>("u8", GgufType::kU8, 200)
      .kv<int8_t>("i8", GgufType::kI8, -5)
      .kv<uint16_t>("u16", GgufType::kU16, 60000)
      .kv<int16_t>("i16", GgufType::kI16, -300)
      .kv<uint32_t>("u32", GgufType::kU32, 4000000000u)
      .kv<int32_t>("i32", GgufType::kI32, -7)
      .kv<float>("f32", GgufType::kF32, 1.5f)
      .kv<uint8_t>("bool", GgufType::kBool, 1)
      .kv_str("string", "h\xc3\xa9llo")
      .kv<uint64_t>("u64", GgufType::kU64, uint64_t{1} << 40)
      .kv<uint64_t>("u64_huge", GgufType::kU64, ~uint64_t{0})
      .kv<int64_t>("i64", GgufType::kI64, -(int64_t{1} << 40))
      .kv<double>("f64", GgufType::kF64, 0.1)
      .kv_arr<uint8_t>("arr.u8", GgufType::kU8, {1, 2, 255})
      .kv_arr<int8_t>("arr.i8", GgufType::kI8, {-1, 2})
      .kv_arr<uint16_t>("arr.u16", GgufType::kU16, {65535})
      .kv_arr<int16_t>("arr.i16", GgufType::kI16, {-32768, 5})
      .kv_arr<uint32_t>("arr.u32", GgufType::kU32, {7, 8})
      .kv_arr<int32_t>("arr.i32", GgufType::kI32, {-1, 0, 1})
      .kv_arr<float>("arr.f32", GgufType::kF32, {0.5f, -2.0f})
      .kv_arr<uint8_t>("arr.bool", GgufType::kBool, {0, 1, 1})
      .kv_str_arr("arr.string", {"a", "", "long string"})
      .kv_arr<uint64_t>("arr.u64", GgufType::kU64, {uint64_t{1} << 33})
      .kv_arr<int64_t>("arr.i64", GgufType::kI64, {-3, 4})
      .kv_arr<double>("arr.f64", GgufType::kF64, {0.25, 1e300})
      .kv_arr<uint32_t>("arr.empty", GgufType::kU32, {});
  // An array of arrays: [[1, 2], ["x"]].
  Bytes nested;
  testing::put<uint32_t>(nested, static_cast<uint32_t>(GgufType::kArray));
  testing::put<uint64_t>(nested, 2);
  testing::put_bytes(nested, GgufBuilder::array_value<int32_t>(GgufType::kI32, {1, 2}));
  testing::put_bytes(nested, GgufBuilder::string_array_value({"x"}));
  g.kv_raw("arr.nested", static_cast<uint32_t>(GgufType::kArray), nested);
  g.kv<uint32_t>("after_nested", GgufType::kU32, 42);

  const Bytes img = g.build();
  auto f = GgufFile::parse(img.data(), static_cast<int64_t>(img.size()), "meta.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32);
  EXPECT_TRUE(f->tensors().empty());

  // Keys iterate in file order.
  std::vector<std::string> keys;
  for (const GgufKv& kv : f->metadata()) keys.push_back(kv.key);
  ASSERT_EQ(keys.size(), 28u);
  EXPECT_EQ(keys.front(), "u8");
  EXPECT_EQ(keys[8], "string");
  EXPECT_EQ(keys.back(), "after_nested");
  EXPECT_TRUE(f->has("arr.nested"));
  EXPECT_FALSE(f->has("nope"));

  // Integers: any integer type through get_i64 / get_u32, range-checked.
  EXPECT_EQ(*f->get_u32("u8"), 200u);
  EXPECT_EQ(*f->get_i64("i8"), -5);
  EXPECT_EQ(*f->get_u32("u16"), 60000u);
  EXPECT_EQ(*f->get_i64("i16"), -300);
  EXPECT_EQ(*f->get_u32("u32"), 4000000000u);
  EXPECT_EQ(*f->get_i64("i32"), -7);
  EXPECT_EQ(*f->get_i64("u64"), int64_t{1} << 40);
  EXPECT_EQ(*f->get_i64("i64"), -(int64_t{1} << 40));
  EXPECT_EQ(f->get_u32("i8").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f->get_u32("u64").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f->get_i64("u64_huge").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f->get_u32("u64_huge").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f->get_i64("f32").status().code(), StatusCode::kInvalidArgument);
  // Floats: f32 or f64.
  EXPECT_EQ(*f->get_f32("f32"), 1.5f);
  EXPECT_EQ(*f->get_f32("f64"), 0.1f);
  EXPECT_EQ(*f->get_f64("f64"), 0.1);
  EXPECT_EQ(f->get_f32("u32").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*f->get_bool("bool"), true);
  EXPECT_EQ(f->get_bool("u8").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*f->get_string("string"), "h\xc3\xa9llo");
  EXPECT_EQ(*f->get_u32("after_nested"), 42u);

  // Arrays.
  EXPECT_EQ(*f->get_i32_array("arr.u8"), (std::vector<int32_t>{1, 2, 255}));
  EXPECT_EQ(*f->get_i32_array("arr.i8"), (std::vector<int32_t>{-1, 2}));
  EXPECT_EQ(*f->get_i32_array("arr.u16"), (std::vector<int32_t>{65535}));
  EXPECT_EQ(*f->get_i32_array("arr.i16"), (std::vector<int32_t>{-32768, 5}));
  EXPECT_EQ(*f->get_i32_array("arr.u32"), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(*f->get_i32_array("arr.i32"), (std::vector<int32_t>{-1, 0, 1}));
  EXPECT_EQ(*f->get_i32_array("arr.i64"), (std::vector<int32_t>{-3, 4}));
  EXPECT_EQ(f->get_i32_array("arr.u64").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*f->get_f32_array("arr.f32"), (std::vector<float>{0.5f, -2.0f}));
  auto f64s = f->get_f32_array("arr.f64");
  ASSERT_TRUE(f64s.ok());
  EXPECT_EQ((*f64s)[0], 0.25f);
  EXPECT_TRUE(std::isinf((*f64s)[1]));
  EXPECT_EQ(*f->get_string_array("arr.string"), (std::vector<std::string>{"a", "", "long string"}));
  EXPECT_TRUE(f->get_i32_array("arr.empty")->empty());
  EXPECT_EQ(*f->get_array_size("arr.string"), 3u);
  EXPECT_EQ(*f->get_array_size("arr.nested"), 2u);
  EXPECT_EQ(f->get_string_array("arr.i32").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->get_i32_array("arr.nested").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->get_f32_array("arr.bool").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f->get_string("arr.string").status().code(), StatusCode::kInvalidArgument);

  // Messages name the file and the key, on one line.
  auto missing = f->get_string("tokenizer.ggml.model");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("meta.gguf"), std::string::npos);
  EXPECT_NE(missing.status().message().find("tokenizer.ggml.model"), std::string::npos);
  auto wrong = f->get_string("u32");
  EXPECT_NE(wrong.status().message().find("'u32' has type u32, expected string"), std::string::npos)
      << wrong.status().message();

  // Rendering for `inspect`.
  EXPECT_EQ(f->value_to_string(*f->find_kv("arr.nested")), "[[1, 2], ['x']]");
  EXPECT_EQ(f->value_to_string(*f->find_kv("arr.i32"), 2), "[-1, 0, ... (3 i32)]");
  EXPECT_EQ(f->value_to_string(*f->find_kv("bool")), "true");
}

struct TypeCase {
  DType dtype;
  const char* gguf_name;
  const char* hf_name;
};

class GgufTensorTypes : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufTensorTypes, EveryTensorTypeReadsBackZeroCopy) {
  const uint32_t version = GetParam();
  const TypeCase cases[] = {
      {DType::kF32, "blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"},
      {DType::kF16, "blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight"},
      {DType::kBF16, "blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight"},
      {DType::kQ8_0, "blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"},
      {DType::kQ4_0, "token_embd.weight", "model.embed_tokens.weight"},
      {DType::kQ4_1, "output.weight", "lm_head.weight"},
  };
  GgufBuilder g;
  g.version = version;
  g.set_alignment(64);
  g.kv_str("general.architecture", "llama");
  std::vector<Bytes> data;
  uint32_t seed = 1;
  for (const auto& c : cases) {
    // 1-D for the norm, [rows=3, cols=64] otherwise (GGUF dims: {64, 3}).
    const bool vec = c.dtype == DType::kF32;
    const int64_t n = vec ? 64 : 3 * 64;
    data.push_back(random_tensor_bytes(c.dtype, n, seed++));
    g.tensor(c.gguf_name, *ggml_from_dtype(c.dtype), vec ? std::vector<uint64_t>{64} : std::vector<uint64_t>{64, 3},
             data.back());
  }
  const Bytes img = g.build();
  const std::string path = write_temp(img, "types_v" + std::to_string(version) + ".gguf");
  auto opened = GgufFile::open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto file = std::make_shared<const GgufFile>(std::move(opened).value());
  EXPECT_EQ(file->version(), version);
  EXPECT_EQ(file->alignment(), 64);
  EXPECT_EQ(file->data_offset() % 64, 0);
  ASSERT_EQ(file->tensors().size(), 6u);

  auto ws = GgufWeightSource::create(file, {});
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  EXPECT_EQ((*ws)->tensors().size(), 6u);
  for (size_t i = 0; i < std::size(cases); ++i) {
    const auto& c = cases[i];
    SCOPED_TRACE(c.gguf_name);
    const GgufTensor* gt = file->find_tensor(c.gguf_name);
    ASSERT_NE(gt, nullptr);
    EXPECT_EQ(gt->offset % 64, 0);
    EXPECT_EQ(gt->nbytes, static_cast<int64_t>(data[i].size()));
    const TensorInfo* info = (*ws)->find(c.hf_name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, c.dtype);
    EXPECT_EQ(info->shape, (c.dtype == DType::kF32 ? std::vector<int64_t>{64} : std::vector<int64_t>{3, 64}));
    EXPECT_EQ(info->data, gt->data);  // a view of the mapping, not a copy
    EXPECT_EQ(info->nbytes, gt->nbytes);
    EXPECT_EQ(std::memcmp(info->data, data[i].data(), data[i].size()), 0);
    EXPECT_EQ(info->file, path);
    auto t = (*ws)->get(c.hf_name);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->nbytes(), gt->nbytes);
  }
  EXPECT_EQ((*ws)->find("model.embed_tokens"), nullptr);
  EXPECT_NE((*ws)->description().find("GGUF v" + std::to_string(version)), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Versions, GgufTensorTypes, ::testing::Values(2u, 3u));

TEST(GgufReader, UnsupportedTensorTypeIsNamed) {
  GgufBuilder g;
  // iq4_xs: 256 values in 136 bytes. The file itself is valid; pagellm cannot compute with it.
  g.tensor("blk.0.attn_q.weight", 23, {256, 2}, Bytes(2 * 136, 0));
  const Bytes img = g.build();
  auto f = GgufFile::parse(img.data(), static_cast<int64_t>(img.size()), "k.gguf");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(ggml_type_name(f->tensors()[0].ggml_type), "iq4_xs");
  auto ws = GgufWeightSource::create(std::make_shared<const GgufFile>(std::move(f).value()), {});
  ASSERT_FALSE(ws.ok());
  EXPECT_EQ(ws.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(ws.status().message().find("blk.0.attn_q.weight"), std::string::npos);
  EXPECT_NE(ws.status().message().find("iq4_xs"), std::string::npos);
}

TEST(GgufReader, TensorWithoutHfNameIsRefused) {
  GgufBuilder g;
  g.tensor("blk.0.ffn_gate_exps.weight", 0, {4}, Bytes(16, 0));
  const Bytes img = g.build();
  auto f = GgufFile::parse(img.data(), static_cast<int64_t>(img.size()), "moe.gguf");
  ASSERT_TRUE(f.ok());
  auto ws = GgufWeightSource::create(std::make_shared<const GgufFile>(std::move(f).value()), {});
  ASSERT_FALSE(ws.ok());
  EXPECT_NE(ws.status().message().find("blk.0.ffn_gate_exps.weight"), std::string::npos);
}

TEST(GgufNames, MapToHuggingFace) {
  const std::pair<const char*, const char*> cases[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"},
      {"blk.12.attn_q.weight", "model.layers.12.self_attn.q_proj.weight"},
      {"blk.12.attn_q.bias", "model.layers.12.self_attn.q_proj.bias"},
      {"blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight"},
      {"blk.1.attn_v.bias", "model.layers.1.self_attn.v_proj.bias"},
      {"blk.1.attn_output.weight", "model.layers.1.self_attn.o_proj.weight"},
      {"blk.1.attn_q_norm.weight", "model.layers.1.self_attn.q_norm.weight"},
      {"blk.1.attn_k_norm.weight", "model.layers.1.self_attn.k_norm.weight"},
      {"blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
      {"blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight"},
      {"blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"},
      {"blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"},
  };
  for (const auto& [g, hf] : cases) EXPECT_EQ(gguf_to_hf_name(g), std::optional<std::string>(hf)) << g;
  for (const char* bad : {"blk..attn_q.weight", "blk.x.attn_q.weight", "blk.01.attn_q.weight", "blk.0.attn_q",
                          "blk.0.attn_q.scale", "blk.0.ffn_gate_inp.weight", "rope_freqs.weight", "output"})
    EXPECT_EQ(gguf_to_hf_name(bad), std::nullopt) << bad;
}

// The converter's permutation written out by hand: per head of d rows, stored order is
// [x0, x_{d/2}, x1, x_{d/2+1}, ...]. Un-permuting must give back HF's [x0, x1, ...].
TEST(GgufPermutation, UndoesTheConverterOrderByHand) {
  // 2 heads of 6 rows, 3 bytes per row; HF row r holds bytes {r, r, r}.
  const int64_t stored_order[] = {0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11};
  Bytes stored;
  for (int64_t r : stored_order)
    for (int k = 0; k < 3; ++k) stored.push_back(static_cast<uint8_t>(r));
  Bytes hf(stored.size());
  unpermute_qk_rows(stored.data(), hf.data(), 12, 3, 2);
  for (int64_t r = 0; r < 12; ++r)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(hf[r * 3 + k], r) << "row " << r;
}

// Quantized rows move whole: un-permuting a q8_0 q_proj gives exactly the blocks of the HF rows.
TEST(GgufPermutation, WeightSourceUnpermutesQuantizedQAndK) {
  const int64_t n_head = 4, n_kv = 2, d = 8, cols = 64;
  const int64_t row_bytes = dtype_bytes(DType::kQ8_0, cols);
  auto make = [&](int64_t heads, uint32_t seed, Bytes& hf_rows) {
    hf_rows = random_tensor_bytes(DType::kQ8_0, heads * d * cols, seed);
    Bytes stored(hf_rows.size());
    // converter: stored row h*d + 2i + j = HF row h*d + j*d/2 + i
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < d / 2; ++i)
        for (int64_t j = 0; j < 2; ++j)
          std::memcpy(stored.data() + (h * d + 2 * i + j) * row_bytes,
                      hf_rows.data() + (h * d + j * d / 2 + i) * row_bytes, row_bytes);
    return stored;
  };
  Bytes hf_q, hf_k, hf_v;
  GgufBuilder g;
  g.tensor("blk.0.attn_q.weight", 8, {uint64_t(cols), uint64_t(n_head * d)}, make(n_head, 7, hf_q));
  g.tensor("blk.0.attn_k.weight", 8, {uint64_t(cols), uint64_t(n_kv * d)}, make(n_kv, 8, hf_k));
  g.tensor("blk.0.attn_v.weight", 8, {uint64_t(cols), uint64_t(n_kv * d)}, make(n_kv, 9, hf_v));
  const Bytes img = g.build();
  auto f = GgufFile::parse(img.data(), static_cast<int64_t>(img.size()), "perm.gguf");
  ASSERT_TRUE(f.ok());
  auto file = std::make_shared<const GgufFile>(std::move(f).value());
  auto ws = GgufWeightSource::create(file, {true, n_head, n_kv});
  ASSERT_TRUE(ws.ok()) << ws.status().to_string();
  const TensorInfo* q = (*ws)->find("model.layers.0.self_attn.q_proj.weight");
  const TensorInfo* k = (*ws)->find("model.layers.0.self_attn.k_proj.weight");
  const TensorInfo* v = (*ws)->find("model.layers.0.self_attn.v_proj.weight");
  ASSERT_TRUE(q && k && v);
  EXPECT_EQ(std::memcmp(q->data, hf_q.data(), hf_q.size()), 0);
  EXPECT_EQ(std::memcmp(k->data, hf_k.data(), hf_k.size()), 0);
  // q and k are owned copies; v stays a view of the file.
  EXPECT_NE(q->data, file->find_tensor("blk.0.attn_q.weight")->data);
  EXPECT_EQ(v->data, file->find_tensor("blk.0.attn_v.weight")->data);

  // Heads that do not split the rows are refused, naming the tensor.
  auto bad = GgufWeightSource::create(file, {true, 3, n_kv});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("blk.0.attn_q.weight"), std::string::npos);
}

// --- ModelConfig from metadata ---

GgufBuilder llama_metadata(const std::string& arch = "llama") {
  GgufBuilder g;
  g.kv_str("general.architecture", arch)
      .kv<uint32_t>(arch + ".context_length", GgufType::kU32, 4096)
      .kv<uint32_t>(arch + ".embedding_length", GgufType::kU32, 64)
      .kv<uint32_t>(arch + ".block_count", GgufType::kU32, 1)
      .kv<uint32_t>(arch + ".feed_forward_length", GgufType::kU32, 96)
      .kv<uint32_t>(arch + ".attention.head_count", GgufType::kU32, 4)
      .kv<uint32_t>(arch + ".attention.head_count_kv", GgufType::kU32, 2)
      .kv<float>(arch + ".attention.layer_norm_rms_epsilon", GgufType::kF32, 1e-5f)
      .kv<float>(arch + ".rope.freq_base", GgufType::kF32, 500000.0f)
      .kv<uint32_t>("tokenizer.ggml.bos_token_id", GgufType::kU32, 1)
      .kv<uint32_t>("tokenizer.ggml.eos_token_id", GgufType::kU32, 2)
      .kv<uint32_t>("tokenizer.ggml.eot_token_id", GgufType::kU32, 3)
      .kv_str_arr("tokenizer.ggml.tokens", {"a", "b", "c", "d", "e"});
  return g;
}

Result<ModelConfig> config_of(const GgufBuilder& g, Bytes& img) {
  img = g.build();
  PAGELLM_ASSIGN_OR_RETURN(GgufFile f, GgufFile::parse(img.data(), static_cast<int64_t>(img.size()), "cfg.gguf"));
  return gguf_model_config(f);
}

TEST(GgufConfig, LlamaFromMetadata) {
  GgufBuilder g = llama_metadata();
  g.tensor("token_embd.weight", 0, {64, 5}, Bytes(64 * 5 * 4, 0));
  Bytes img;
  auto cfg = config_of(g, img);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->architecture, "LlamaForCausalLM");
  EXPECT_EQ(cfg->model_type, "llama");
  EXPECT_EQ(cfg->hidden_size, 64);
  EXPECT_EQ(cfg->intermediate_size, 96);
  EXPECT_EQ(cfg->num_hidden_layers, 1);
  EXPECT_EQ(cfg->num_attention_heads, 4);
  EXPECT_EQ(cfg->num_key_value_heads, 2);
  EXPECT_EQ(cfg->head_dim, 16);
  EXPECT_EQ(cfg->max_position_embeddings, 4096);
  EXPECT_NEAR(cfg->rms_norm_eps, 1e-5, 1e-12);
  EXPECT_EQ(cfg->rope.theta, 500000.0);
  EXPECT_EQ(cfg->rope.type, RopeType::kDefault);
  EXPECT_EQ(cfg->rope.partial_rotary_factor, 1.0);
  EXPECT_EQ(cfg->vocab_size, 5);  // from the token list
  EXPECT_TRUE(cfg->tie_word_embeddings);  // no output.weight
  EXPECT_FALSE(cfg->attention_bias);
  EXPECT_FALSE(cfg->qk_norm);
  EXPECT_EQ(cfg->bos_token_id, std::optional<int32_t>(1));
  EXPECT_EQ(cfg->eos_token_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_FALSE(cfg->sliding_window.has_value());
}

TEST(GgufConfig, Qwen2AndQwen3) {
  Bytes img;
  GgufBuilder q2 = llama_metadata("qwen2");
  q2.tensor("output.weight", 0, {64, 5}, Bytes(64 * 5 * 4, 0));
  auto c2 = config_of(q2, img);
  ASSERT_TRUE(c2.ok()) << c2.status().to_string();
  EXPECT_EQ(c2->architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(c2->attention_bias);
  EXPECT_FALSE(c2->o_proj_bias);
  EXPECT_FALSE(c2->tie_word_embeddings);

  GgufBuilder q3 = llama_metadata("qwen3");
  q3.kv<uint32_t>("qwen3.attention.key_length", GgufType::kU32, 32);
  q3.kv<uint32_t>("qwen3.vocab_size", GgufType::kU32, 7);
  auto c3 = config_of(q3, img);
  ASSERT_TRUE(c3.ok()) << c3.status().to_string();
  EXPECT_EQ(c3->architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(c3->qk_norm);
  EXPECT_EQ(c3->head_dim, 32);
  EXPECT_EQ(c3->vocab_size, 7);  // the explicit key wins over the token list
}

TEST(GgufConfig, RopeScaling) {
  Bytes img;
  {
    GgufBuilder g = llama_metadata();
    g.kv_str("llama.rope.scaling.type", "linear").kv<float>("llama.rope.scaling.factor", GgufType::kF32, 4.0f);
    g.kv<uint32_t>("llama.rope.dimension_count", GgufType::kU32, 8);
    auto c = config_of(g, img);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->rope.type, RopeType::kLinear);
    EXPECT_EQ(c->rope.factor, 4.0);
    EXPECT_EQ(c->rotary_dim(), 8);
  }
  {
    GgufBuilder g = llama_metadata("qwen2");
    g.kv_str("qwen2.rope.scaling.type", "yarn")
        .kv<float>("qwen2.rope.scaling.factor", GgufType::kF32, 4.0f)
        .kv<uint32_t>("qwen2.rope.scaling.original_context_length", GgufType::kU32, 32768);
    auto c = config_of(g, img);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->rope.type, RopeType::kYarn);
    EXPECT_EQ(c->rope.factor, 4.0);
    EXPECT_EQ(c->rope.original_max_position_embeddings, 32768);
  }
  {
    GgufBuilder g = llama_metadata();
    g.kv_str("llama.rope.scaling.type", "longrope");
    auto c = config_of(g, img);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(c.status().message().find("llama.rope.scaling.type"), std::string::npos);
    EXPECT_NE(c.status().message().find("longrope"), std::string::npos);
  }
}

TEST(GgufConfig, RefusesWhatItCannotRun) {
  Bytes img;
  auto unsupported = config_of(llama_metadata("gemma2"), img);
  ASSERT_FALSE(unsupported.ok());
  EXPECT_EQ(unsupported.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(unsupported.status().message().find("gemma2"), std::string::npos);

  GgufBuilder moe = llama_metadata();
  moe.kv<uint32_t>("llama.expert_count", GgufType::kU32, 8);
  EXPECT_EQ(config_of(moe, img).status().code(), StatusCode::kUnimplemented);

  GgufBuilder no_heads;
  no_heads.kv_str("general.architecture", "llama").kv<uint32_t>("llama.embedding_length", GgufType::kU32, 64);
  auto missing = config_of(no_heads, img);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("llama.block_count"), std::string::npos);

  GgufBuilder bad_eos = llama_metadata();
  bad_eos.kv<uint32_t>("tokenizer.ggml.padding_token_id", GgufType::kU32, 99);
  auto eos = config_of(bad_eos, img);
  ASSERT_FALSE(eos.ok());
  EXPECT_NE(eos.status().message().find("tokenizer.ggml.padding_token_id"), std::string::npos);
}

// HF's llama3 divisor for one frequency, written from transformers' formula.
double hf_llama3_divisor(double theta, int64_t rot, int64_t i, double factor, double lf, double hf, double old_ctx) {
  const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
  const double wavelen = 2 * std::numbers::pi / inv_freq;
  if (wavelen < old_ctx / hf) return 1.0;
  if (wavelen > old_ctx / lf) return factor;
  const double smooth = (old_ctx / wavelen - lf) / (hf - lf);
  return 1.0 / ((1 - smooth) / factor + smooth);
}

// llama.cpp stores llama3 scaling as rope_freqs.weight; the config must reproduce every divisor.
void check_llama3_fold(double theta, int64_t head_dim, double factor, double lf, double hf, double old_ctx) {
  const int64_t n = head_dim / 2;
  Bytes freqs;
  std::vector<double> want;
  for (int64_t i = 0; i < n; ++i) {
    want.push_back(hf_llama3_divisor(theta, head_dim, i, factor, lf, hf, old_ctx));
    testing::put<float>(freqs, static_cast<float>(want.back()));
  }
  GgufBuilder g;
  g.kv_str("general.architecture", "llama")
      .kv<uint32_t>("llama.context_length", GgufType::kU32, 131072)
      .kv<uint32_t>("llama.embedding_length", GgufType::kU32, static_cast<uint32_t>(head_dim * 2))
      .kv<uint32_t>("llama.block_count", GgufType::kU32, 1)
      .kv<uint32_t>("llama.feed_forward_length", GgufType::kU32, 32)
      .kv<uint32_t>("llama.attention.head_count", GgufType::kU32, 2)
      .kv<uint32_t>("llama.vocab_size", GgufType::kU32, 10)
      .kv<float>("llama.rope.freq_base", GgufType::kF32, static_cast<float>(theta));
  g.tensor("rope_freqs.weight", 0, {uint64_t(n)}, freqs);
  Bytes img;
  auto c = config_of(g, img);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_NEAR(c->rope.factor, factor, 1e-6);
  for (int64_t i = 0; i < n; ++i) {
    const double got = hf_llama3_divisor(c->rope.theta, head_dim, i, c->rope.factor, c->rope.low_freq_factor,
                                         c->rope.high_freq_factor,
                                         static_cast<double>(c->rope.original_max_position_embeddings));
    EXPECT_NEAR(got, want[i], 1e-5 * want[i]) << "frequency " << i;
  }
}

TEST(GgufConfig, Llama3RopeFreqsFoldBackToHfParameters) {
  check_llama3_fold(500000.0, 128, 8.0, 1.0, 4.0, 8192);  // Llama 3.1 / 3.2
  check_llama3_fold(500000.0, 64, 32.0, 1.0, 4.0, 8192);  // Llama 3.2 1B
  check_llama3_fold(500000.0, 16, 8.0, 1.0, 4.0, 16);     // a ramp of one frequency
  check_llama3_fold(10000.0, 16, 4.0, 1.0, 4.0, 64);
}

TEST(GgufConfig, ArbitraryRopeFreqsAreRefused) {
  Bytes freqs;
  for (float v : {1.0f, 3.0f, 1.5f, 8.0f}) testing::put<float>(freqs, v);  // not monotone
  GgufBuilder g = llama_metadata();
  g.kv<uint32_t>("llama.rope.dimension_count", GgufType::kU32, 8);
  g.tensor("rope_freqs.weight", 0, {4}, freqs);
  Bytes img;
  auto c = config_of(g, img);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("rope_freqs.weight"), std::string::npos);
}

TEST(GgufCheckpoint, OpensLlamaFileWithUnpermutedQ) {
  GgufBuilder g = llama_metadata();
  const int64_t rows = 64, cols = 64;  // 4 heads of 16
  Bytes stored(rows * cols * 4);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = static_cast<float>(r);  // every element of stored row r is r
      std::memcpy(&stored[(r * cols + c) * 4], &v, 4);
    }
  g.tensor("blk.0.attn_q.weight", 0, {64, 64}, stored);
  const std::string path = write_temp(g.build(), "ckpt.gguf");
  auto ck = open_gguf_checkpoint(path);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ(ck->gguf_path, path);
  EXPECT_EQ(ck->config.source, path);
  auto q = ck->weights->get("model.layers.0.self_attn.q_proj.weight", {64, 64});
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  // HF row r of head h came from stored row h*16 + 2*(r%8) + (r/8) within the head.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r / 16, i = r % 16;
    const float want = static_cast<float>(h * 16 + 2 * (i % 8) + i / 8);
    EXPECT_EQ(static_cast<const float*>(q->row_ptr(r))[5], want) << "row " << r;
  }
}

}  // namespace
}  // namespace pagellm
