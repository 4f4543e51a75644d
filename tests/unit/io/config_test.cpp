// config.json parsing: published configs of each supported family, both RoPE spellings, and every
// refusal (each must name the field at fault in a one-line message).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "io/model_config.h"
#include "source_dir.h"

namespace pagellm {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string config_path(const std::string& name) {
  return test_source_dir() + "/tests/data/configs/" + name;
}

ModelConfig parse_file(const std::string& name) {
  Result<ModelConfig> r = parse_hf_config(read_file(config_path(name)), name);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : ModelConfig{};
}

json load_json(const std::string& name) {
  return json::parse(read_file(config_path(name)));
}

// Parses `j` and expects an error of `code` whose one-line message names `field`.
void expect_refused(const json& j, StatusCode code, const std::string& field) {
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_FALSE(r.ok()) << "accepted a config that should name '" << field << "'";
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_THAT(r.status().message(), HasSubstr("config.json"));
  EXPECT_THAT(r.status().message(), HasSubstr("'" + field + "'"));
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status().message();
}

TEST(Config, Llama3_8B) {
  ModelConfig c = parse_file("llama-3-8b.json");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rotary_dim(), 128);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{128001});
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_FALSE(c.pad_token_id.has_value());
}

void expect_llama31_rope(const ModelConfig& c) {
  EXPECT_EQ(c.rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
}

TEST(Config, Llama31Llama3Rope) {
  expect_llama31_rope(parse_file("llama-3.1-8b.json"));
}

TEST(Config, Transformers5RopeParametersMatchClassicKeys) {
  // The same model written by transformers 5: rope_theta moves inside rope_parameters.
  ModelConfig c = parse_file("llama-3.1-8b-transformers5.json");
  expect_llama31_rope(c);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.pad_token_id.has_value());  // "pad_token_id": null
}

TEST(Config, Qwen2_7B) {
  ModelConfig c = parse_file("qwen2-7b.json");
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c.hidden_size, 3584);
  EXPECT_EQ(c.num_attention_heads, 28);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.attention_bias);  // q/k/v biases
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.sliding_window.has_value());  // use_sliding_window: false
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{151643});
}

TEST(Config, Qwen25Yarn) {
  ModelConfig c = parse_file("qwen2.5-7b-instruct-yarn.json");
  EXPECT_EQ(c.rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
  EXPECT_FALSE(c.rope.attention_factor.has_value());
  EXPECT_FALSE(c.rope.mscale.has_value());
  EXPECT_TRUE(c.rope.truncate);
  // sliding_window is 131072 in the file but use_sliding_window is false: no window.
  EXPECT_FALSE(c.sliding_window.has_value());
}

TEST(Config, Qwen3ExplicitHeadDim) {
  ModelConfig c = parse_file("qwen3-0.6b.json");
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.head_dim, 128);  // not 1024 / 16 = 64
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.rope.type, RopeType::kDefault);  // "rope_scaling": null
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{151645});
}

TEST(Config, Qwen3HeadDimDefaultsTo128AndAttentionBiasCoversOProj) {
  json j = load_json("qwen3-0.6b.json");
  j.erase("head_dim");
  j["attention_bias"] = true;
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->head_dim, 128);  // transformers' Qwen3Config default, not hidden / heads
  EXPECT_TRUE(r->attention_bias);
  EXPECT_TRUE(r->o_proj_bias);
}

TEST(Config, Mistral7BSlidingWindow) {
  ModelConfig c = parse_file("mistral-7b-v0.1.json");
  EXPECT_EQ(c.architecture, "MistralForCausalLM");
  ASSERT_TRUE(c.sliding_window.has_value());
  EXPECT_EQ(*c.sliding_window, 4096);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_FALSE(c.attention_bias);

  json j = load_json("mistral-7b-v0.1.json");
  j["sliding_window"] = nullptr;  // v0.2 and later
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->sliding_window.has_value());

  j.erase("sliding_window");  // absent: transformers' MistralConfig default
  r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->sliding_window, 4096);

  j["sliding_window"] = 0;
  expect_refused(j, StatusCode::kInvalidArgument, "sliding_window");
}

TEST(Config, DeepSeekCoderLinearRope) {
  ModelConfig c = parse_file("deepseek-coder-6.7b.json");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.rope.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_DOUBLE_EQ(c.rope.theta, 100000.0);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.vocab_size, 32256);
  EXPECT_EQ(c.bos_token_id, 32013);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{32014});
}

TEST(Config, OtherArchitecturesParseIntoNames) {
  ModelConfig v2 = parse_file("deepseek-v2-lite.json");
  EXPECT_EQ(v2.architecture, "DeepseekV2ForCausalLM");
  EXPECT_EQ(v2.model_type, "deepseek_v2");
  EXPECT_EQ(v2.rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(v2.rope.factor, 40.0);
  ASSERT_TRUE(v2.rope.mscale.has_value());
  EXPECT_DOUBLE_EQ(*v2.rope.mscale, 0.707);
  ASSERT_TRUE(v2.rope.mscale_all_dim.has_value());
  EXPECT_DOUBLE_EQ(*v2.rope.mscale_all_dim, 0.707);
  EXPECT_EQ(v2.rope.original_max_position_embeddings, 4096);

  ModelConfig mx = parse_file("mixtral-8x7b.json");
  EXPECT_EQ(mx.architecture, "MixtralForCausalLM");
  EXPECT_EQ(mx.num_key_value_heads, 8);

  // An unknown architecture is not refused here, even with fields we would refuse for ours.
  json j = {{"architectures", {"Phi3ForCausalLM"}},
            {"model_type", "phi3"},
            {"hidden_act", "gelu"},
            {"rope_scaling", {{"type", "longrope"}}},
            {"eos_token_id", 7}};
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->architecture, "Phi3ForCausalLM");
  EXPECT_EQ(r->model_type, "phi3");
  EXPECT_EQ(r->eos_token_ids, std::vector<int32_t>{7});
  EXPECT_THAT(describe(*r), HasSubstr("Phi3ForCausalLM"));
}

TEST(Config, DeepSeekV2LiteMlaAndMoe) {
  ModelConfig c = parse_file("deepseek-v2-lite.json");
  EXPECT_FALSE(c.q_lora_rank.has_value());  // null: a plain q_proj
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.head_dim, 64);  // RoPE tables are built for the rope part, as in transformers
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_TRUE(c.rope.interleaved);
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.topk_method, MoeTopk::kGreedy);
  EXPECT_EQ(c.scoring_func, MoeScoring::kSoftmax);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_THAT(describe(c), HasSubstr("kv_lora_rank 512"));
  EXPECT_THAT(describe(c), HasSubstr("64 routed experts (top 6, greedy, softmax"));

  // An absent q_lora_rank is the config class default, not "none".
  json j = load_json("deepseek-v2-lite.json");
  j.erase("q_lora_rank");
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->q_lora_rank, 1536);
  j["q_lora_rank"] = 1536;
  j["topk_method"] = "group_limited_greedy";
  j["n_group"] = 8;
  j["topk_group"] = 3;
  r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->topk_method, MoeTopk::kGroupLimitedGreedy);
  EXPECT_EQ(r->n_group, 8);
  EXPECT_EQ(r->topk_group, 3);
}

TEST(Config, DeepSeekV3Defaults) {
  json j = load_json("deepseek-v2-lite.json");
  j["architectures"] = {"DeepseekV3ForCausalLM"};
  j["model_type"] = "deepseek_v3";
  for (const char* k : {"topk_method", "scoring_func", "norm_topk_prob", "n_group", "topk_group",
                        "routed_scaling_factor", "n_routed_experts", "num_experts_per_tok"})
    j.erase(k);
  j["num_nextn_predict_layers"] = 1;
  j["rope_interleave"] = false;
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->topk_method, MoeTopk::kNoauxTc);
  EXPECT_EQ(r->scoring_func, MoeScoring::kSigmoid);
  EXPECT_TRUE(r->norm_topk_prob);
  EXPECT_EQ(r->n_routed_experts, 256);
  EXPECT_EQ(r->num_experts_per_tok, 8);
  EXPECT_EQ(r->n_group, 8);
  EXPECT_EQ(r->topk_group, 4);
  EXPECT_DOUBLE_EQ(r->routed_scaling_factor, 2.5);
  EXPECT_EQ(r->num_nextn_predict_layers, 1);
  EXPECT_FALSE(r->rope.interleaved);
}

TEST(Config, Mixtral8x7B) {
  ModelConfig c = parse_file("mixtral-8x7b.json");
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, c.intermediate_size);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.scoring_func, MoeScoring::kSoftmax);
  EXPECT_EQ(c.topk_method, MoeTopk::kGreedy);
  json j = load_json("mixtral-8x7b.json");
  j.erase("sliding_window");
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->sliding_window.has_value());  // Mixtral's default is full attention
  j["num_experts_per_tok"] = 9;
  expect_refused(j, StatusCode::kInvalidArgument, "num_experts_per_tok");
  j["num_experts_per_tok"] = 2;
  j["num_local_experts"] = 0;
  expect_refused(j, StatusCode::kInvalidArgument, "num_local_experts");
}

TEST(Config, RefusesUnsupportedMoeAndMla) {
  const json base = load_json("deepseek-v2-lite.json");
  auto with = [&](const char* key, const json& v) {
    json j = base;
    j[key] = v;
    return j;
  };
  expect_refused(with("topk_method", "noaux_tc"), StatusCode::kUnimplemented, "topk_method");
  expect_refused(with("scoring_func", "sigmoid"), StatusCode::kUnimplemented, "scoring_func");
  expect_refused(with("norm_topk_prob", true), StatusCode::kUnimplemented, "norm_topk_prob");
  expect_refused(with("moe_layer_freq", 2), StatusCode::kUnimplemented, "moe_layer_freq");
  expect_refused(with("mlp_bias", true), StatusCode::kUnimplemented, "mlp_bias");
  expect_refused(with("kv_lora_rank", 0), StatusCode::kInvalidArgument, "kv_lora_rank");
  expect_refused(with("q_lora_rank", -1), StatusCode::kInvalidArgument, "q_lora_rank");
  expect_refused(with("qk_rope_head_dim", 7), StatusCode::kInvalidArgument, "qk_rope_head_dim");
  expect_refused(with("v_head_dim", "128"), StatusCode::kInvalidArgument, "v_head_dim");
  expect_refused(with("num_experts_per_tok", 65), StatusCode::kInvalidArgument,
                 "num_experts_per_tok");
  expect_refused(with("routed_scaling_factor", 0), StatusCode::kInvalidArgument,
                 "routed_scaling_factor");
  json j = with("topk_method", "group_limited_greedy");
  j["n_group"] = 5;  // does not divide 64 experts
  expect_refused(j, StatusCode::kInvalidArgument, "n_group");
  j["n_group"] = 8;
  j["topk_group"] = 9;
  expect_refused(j, StatusCode::kInvalidArgument, "topk_group");
  j["topk_group"] = 1;  // one group of 8 experts covers the 6 wanted
  EXPECT_TRUE(parse_hf_config(j.dump(), "config.json").ok());
  j["num_experts_per_tok"] = 9;
  expect_refused(j, StatusCode::kInvalidArgument, "num_experts_per_tok");

  json v3 = base;
  v3["architectures"] = {"DeepseekV3ForCausalLM"};
  v3["model_type"] = "deepseek_v3";
  v3["topk_method"] = "greedy";
  v3["scoring_func"] = "sigmoid";
  v3["n_group"] = 8;
  v3["topk_group"] = 4;
  expect_refused(v3, StatusCode::kUnimplemented, "topk_method");
  v3["topk_method"] = "noaux_tc";
  v3["scoring_func"] = "softmax";
  expect_refused(v3, StatusCode::kUnimplemented, "scoring_func");
  v3["scoring_func"] = "sigmoid";
  v3["n_group"] = 64;  // one expert per group: noaux_tc ranks groups by their top 2
  v3["topk_group"] = 6;
  expect_refused(v3, StatusCode::kInvalidArgument, "n_group");
}

TEST(Config, LlamaBiases) {
  json j = load_json("llama-3-8b.json");
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->attention_bias);
  EXPECT_TRUE(r->o_proj_bias);  // Llama's attention_bias includes o_proj
  EXPECT_TRUE(r->mlp_bias);

  // Qwen2 ignores attention_bias: q/k/v always, o_proj never.
  json q = load_json("qwen2-7b.json");
  q["attention_bias"] = false;
  r = parse_hf_config(q.dump(), "config.json");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->attention_bias);
  EXPECT_FALSE(r->o_proj_bias);
}

TEST(Config, Defaults) {
  json j = load_json("llama-3-8b.json");
  j.erase("num_key_value_heads");
  j.erase("rms_norm_eps");
  j.erase("max_position_embeddings");
  j.erase("rope_theta");
  j.erase("hidden_act");
  j.erase("eos_token_id");
  j.erase("bos_token_id");
  j["head_dim"] = nullptr;  // null means "derive it"
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->num_key_value_heads, 32);
  EXPECT_EQ(r->head_dim, 128);
  EXPECT_DOUBLE_EQ(r->rms_norm_eps, 1e-6);
  EXPECT_EQ(r->max_position_embeddings, 2048);  // LlamaConfig's default
  EXPECT_DOUBLE_EQ(r->rope.theta, 10000.0);
  EXPECT_EQ(r->hidden_act, "silu");
  EXPECT_TRUE(r->eos_token_ids.empty());
  EXPECT_FALSE(r->bos_token_id.has_value());
}

TEST(Config, ArchitectureFromModelType) {
  json j = load_json("qwen2-7b.json");
  j.erase("architectures");
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->architecture, "Qwen2ForCausalLM");
  EXPECT_TRUE(r->attention_bias);

  j.erase("model_type");
  expect_refused(j, StatusCode::kInvalidArgument, "architectures");
  j["architectures"] = json::array();
  expect_refused(j, StatusCode::kInvalidArgument, "architectures");
  j["architectures"] = "Qwen2ForCausalLM";
  expect_refused(j, StatusCode::kInvalidArgument, "architectures");
}

TEST(Config, RopeParametersForms) {
  json base = load_json("llama-3-8b.json");
  base.erase("rope_theta");

  // Flat transformers-5 form with partial_rotary_factor inside.
  json j = base;
  j["rope_parameters"] = {{"rope_type", "linear"},
                          {"factor", 2.0},
                          {"rope_theta", 1234.0},
                          {"partial_rotary_factor", 0.5}};
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->rope.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(r->rope.factor, 2.0);
  EXPECT_DOUBLE_EQ(r->rope.theta, 1234.0);
  EXPECT_DOUBLE_EQ(r->rope.partial_rotary_factor, 0.5);
  EXPECT_EQ(r->rotary_dim(), 64);

  // Nested per layer type, only full_attention.
  j = base;
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 777.0}}}};
  r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(r->rope.theta, 777.0);

  // A second layer type is refused by name.
  j["rope_parameters"]["sliding_attention"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  expect_refused(j, StatusCode::kUnimplemented, "rope_parameters.sliding_attention");

  // Top-level partial_rotary_factor, theta inside rope_scaling wins over the top level.
  j = base;
  j["rope_theta"] = 1.0e6;
  j["partial_rotary_factor"] = 0.25;
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 5e5}};
  r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->rope.type, RopeType::kDynamic);
  EXPECT_DOUBLE_EQ(r->rope.theta, 5e5);
  EXPECT_DOUBLE_EQ(r->rope.partial_rotary_factor, 0.25);
  EXPECT_EQ(r->rotary_dim(), 32);

  // "default" type explicitly.
  j = base;
  j["rope_scaling"] = {{"rope_type", "default"}};
  r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->rope.type, RopeType::kDefault);
}

TEST(Config, YarnDetails) {
  json j = load_json("llama-3-8b.json");
  j["max_position_embeddings"] = 163840;
  // No factor: the extension ratio stands in (DeepSeek-V3 style). Explicit attention_factor and
  // truncate, and beta values of 0 meaning the defaults.
  j["rope_scaling"] = {{"rope_type", "yarn"},     {"original_max_position_embeddings", 4096},
                       {"attention_factor", 1.5}, {"truncate", false},
                       {"beta_fast", 0},          {"beta_slow", 2}};
  Result<ModelConfig> r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_DOUBLE_EQ(r->rope.factor, 40.0);
  EXPECT_DOUBLE_EQ(r->rope.attention_factor.value_or(0), 1.5);
  EXPECT_FALSE(r->rope.truncate);
  EXPECT_DOUBLE_EQ(r->rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(r->rope.beta_slow, 2.0);

  // Missing original_max_position_embeddings falls back to max_position_embeddings.
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
  r = parse_hf_config(j.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->rope.original_max_position_embeddings, 163840);

  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 0.0}};
  expect_refused(j, StatusCode::kInvalidArgument, "rope_scaling.factor");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}, {"truncate", 1}};
  expect_refused(j, StatusCode::kInvalidArgument, "rope_scaling.truncate");
}

TEST(Config, RefusesUnsupportedRope) {
  json j = load_json("llama-3-8b.json");
  j["rope_scaling"] = {{"type", "longrope"}, {"factor", 4.0}};
  expect_refused(j, StatusCode::kUnimplemented, "rope_scaling.type");
  j["rope_scaling"] = {{"rope_type", "su"}};
  expect_refused(j, StatusCode::kUnimplemented, "rope_scaling.rope_type");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "proportional"}, {"rope_theta", 1e4}};
  expect_refused(j, StatusCode::kUnimplemented, "rope_parameters.rope_type");
  j["rope_parameters"] = {{"rope_type", "default"}, {"mrope_section", {16, 24, 24}}};
  expect_refused(j, StatusCode::kUnimplemented, "rope_parameters.mrope_section");
  j["rope_parameters"] = {{"rope_type", "linear"}};
  expect_refused(j, StatusCode::kInvalidArgument, "rope_parameters.factor");
  j["rope_parameters"] = {{"rope_type", "llama3"},
                          {"factor", 8.0},
                          {"low_freq_factor", 4.0},
                          {"high_freq_factor", 4.0}};
  expect_refused(j, StatusCode::kInvalidArgument, "rope_parameters.high_freq_factor");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"high_freq_factor", 4.0}};
  expect_refused(j, StatusCode::kInvalidArgument, "rope_parameters.low_freq_factor");
  j["rope_parameters"] = "yarn";
  expect_refused(j, StatusCode::kInvalidArgument, "rope_parameters");
  j.erase("rope_parameters");
  j["rope_theta"] = -1.0;
  expect_refused(j, StatusCode::kInvalidArgument, "rope_theta");
  j["rope_theta"] = 10000.0;
  j["partial_rotary_factor"] = 1.5;
  expect_refused(j, StatusCode::kInvalidArgument, "partial_rotary_factor");
  j["partial_rotary_factor"] = 0.001;  // 128 * 0.001 rounds to 0 rotary dims
  expect_refused(j, StatusCode::kInvalidArgument, "partial_rotary_factor");
}

TEST(Config, RefusesMathWeDoNotImplement) {
  json j = load_json("llama-3-8b.json");
  j["hidden_act"] = "gelu_pytorch_tanh";
  expect_refused(j, StatusCode::kUnimplemented, "hidden_act");

  j = load_json("llama-3-8b.json");
  j["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
  expect_refused(j, StatusCode::kUnimplemented, "quantization_config.quant_method");

  j = load_json("llama-3-8b.json");
  j["attn_logit_softcapping"] = nullptr;  // null is fine
  j["final_logit_softcapping"] = nullptr;
  EXPECT_TRUE(parse_hf_config(j.dump(), "config.json").ok());
  j["attn_logit_softcapping"] = 50.0;
  expect_refused(j, StatusCode::kUnimplemented, "attn_logit_softcapping");
  j["attn_logit_softcapping"] = nullptr;
  j["final_logit_softcapping"] = 30.0;
  expect_refused(j, StatusCode::kUnimplemented, "final_logit_softcapping");

  j = load_json("qwen2-7b.json");
  j["use_sliding_window"] = true;
  expect_refused(j, StatusCode::kUnimplemented, "use_sliding_window");
  j["use_sliding_window"] = false;
  j["layer_types"] = {"full_attention", "sliding_attention"};
  expect_refused(j, StatusCode::kUnimplemented, "layer_types");
  j["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_TRUE(parse_hf_config(j.dump(), "config.json").ok());

  j = load_json("qwen3-0.6b.json");
  j["use_sliding_window"] = true;
  expect_refused(j, StatusCode::kUnimplemented, "use_sliding_window");
}

TEST(Config, ValidatesRanges) {
  const json base = load_json("llama-3-8b.json");
  json j = base;
  j["vocab_size"] = 0;
  expect_refused(j, StatusCode::kInvalidArgument, "vocab_size");
  j = base;
  j["hidden_size"] = -4096;
  expect_refused(j, StatusCode::kInvalidArgument, "hidden_size");
  j = base;
  j["num_hidden_layers"] = 0;
  expect_refused(j, StatusCode::kInvalidArgument, "num_hidden_layers");
  j = base;
  j["intermediate_size"] = int64_t{1} << 40;
  expect_refused(j, StatusCode::kInvalidArgument, "intermediate_size");
  j = base;
  j["num_key_value_heads"] = 5;  // 32 % 5 != 0
  expect_refused(j, StatusCode::kInvalidArgument, "num_key_value_heads");
  j = base;
  j["num_key_value_heads"] = 0;
  expect_refused(j, StatusCode::kInvalidArgument, "num_key_value_heads");
  j = base;
  j["num_attention_heads"] = 24;  // 4096 % 24 != 0 and no head_dim
  j["num_key_value_heads"] = 8;
  expect_refused(j, StatusCode::kInvalidArgument, "hidden_size");
  j["head_dim"] = 128;  // explicit head_dim makes it fine
  EXPECT_TRUE(parse_hf_config(j.dump(), "config.json").ok());
  j["head_dim"] = 0;
  expect_refused(j, StatusCode::kInvalidArgument, "head_dim");
  j = base;
  j["rms_norm_eps"] = 0.0;
  expect_refused(j, StatusCode::kInvalidArgument, "rms_norm_eps");
  j = base;
  j["max_position_embeddings"] = -1;
  expect_refused(j, StatusCode::kInvalidArgument, "max_position_embeddings");
}

TEST(Config, ValidatesTypesAndPresence) {
  const json base = load_json("llama-3-8b.json");
  json j = base;
  j.erase("hidden_size");
  expect_refused(j, StatusCode::kInvalidArgument, "hidden_size");
  j = base;
  j["hidden_size"] = "4096";
  expect_refused(j, StatusCode::kInvalidArgument, "hidden_size");
  j = base;
  j["hidden_size"] = 4096.5;
  expect_refused(j, StatusCode::kInvalidArgument, "hidden_size");
  j = base;
  j["hidden_size"] = 4096.0;  // integral floats are accepted
  EXPECT_TRUE(parse_hf_config(j.dump(), "config.json").ok());
  j = base;
  j["vocab_size"] = nullptr;
  expect_refused(j, StatusCode::kInvalidArgument, "vocab_size");
  j = base;
  j["tie_word_embeddings"] = "false";
  expect_refused(j, StatusCode::kInvalidArgument, "tie_word_embeddings");
  j = base;
  j["eos_token_id"] = {1, "2"};
  expect_refused(j, StatusCode::kInvalidArgument, "eos_token_id");
  j = base;
  j["eos_token_id"] = -3;
  expect_refused(j, StatusCode::kInvalidArgument, "eos_token_id");
  j = base;
  j["bos_token_id"] = 1.5;
  expect_refused(j, StatusCode::kInvalidArgument, "bos_token_id");
  j = base;
  j["num_attention_heads"] = 18446744073709551615ull;
  expect_refused(j, StatusCode::kInvalidArgument, "num_attention_heads");

  Result<ModelConfig> r = parse_hf_config("{\"architectures\": [", "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("config.json"));
  r = parse_hf_config("[1, 2]", "config.json");
  ASSERT_FALSE(r.ok());
  r = parse_hf_config("", "config.json");
  ASSERT_FALSE(r.ok());
}

TEST(Config, GenerationConfig) {
  ModelConfig c = parse_file("llama-3-8b.json");
  ASSERT_TRUE(
      apply_generation_config(
          R"({"bos_token_id": 128000, "eos_token_id": [128001, 128009], "pad_token_id": 128004,
                      "do_sample": true, "temperature": 0.6, "top_p": 0.9})",
          "generation_config.json", c)
          .ok());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128009}));
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.pad_token_id, 128004);

  // Fields that are absent or null keep config.json's values.
  ASSERT_TRUE(
      apply_generation_config(R"({"eos_token_id": 7, "bos_token_id": null})", "g.json", c).ok());
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{7});
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.pad_token_id, 128004);

  // A bad field is an error naming it and leaves the config untouched.
  Status st = apply_generation_config(R"({"eos_token_id": 9, "pad_token_id": "x"})", "g.json", c);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("g.json"));
  EXPECT_THAT(st.message(), HasSubstr("'pad_token_id'"));
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{7});
  EXPECT_FALSE(apply_generation_config("{", "g.json", c).ok());
  EXPECT_FALSE(apply_generation_config("3", "g.json", c).ok());
}

class ConfigDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pagellm_config_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(ConfigDir, LoadUsesGenerationConfigWhenPresent) {
  write("config.json", read_file(config_path("llama-3-8b.json")));
  Result<ModelConfig> r = load_hf_config(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->eos_token_ids, std::vector<int32_t>{128001});  // config.json's own

  write("generation_config.json", R"({"eos_token_id": [128001, 128009]})");
  r = load_hf_config(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->eos_token_ids, (std::vector<int32_t>{128001, 128009}));
  EXPECT_EQ(r->bos_token_id, 128000);

  write("generation_config.json", "{oops");
  r = load_hf_config(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("generation_config.json"));
}

TEST_F(ConfigDir, MissingConfigIsNotFound) {
  Result<ModelConfig> r = load_hf_config(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("config.json"));
}

TEST(Config, DescribeIsReadable) {
  ModelConfig c = parse_file("llama-3.1-8b.json");
  const std::string d = describe(c);
  EXPECT_THAT(d, HasSubstr("LlamaForCausalLM (llama)"));
  EXPECT_THAT(d, HasSubstr("32 heads, 8 kv heads, head_dim 128"));
  EXPECT_THAT(d, HasSubstr("llama3, theta 500000, factor 8"));
  EXPECT_THAT(d, HasSubstr("original_max_position_embeddings 8192"));
  EXPECT_THAT(d, HasSubstr("128001, 128008, 128009"));
  EXPECT_GT(std::count(d.begin(), d.end(), '\n'), 10);
}

}  // namespace
}  // namespace pagellm
