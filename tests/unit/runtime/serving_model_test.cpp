// load_serving_model's --quantization: random 4-bit projections for benchmarks, refused (before
// anything is loaded) where it would mean something else or measure bf16.
#include "runtime/serving_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "source_dir.h"

namespace pagellm {
namespace {

using ::testing::HasSubstr;

TEST(ServingModel, DummyQuantizationAndItsRefusals) {
  ServingModelOptions o;
  o.model_path = test_source_dir() + "/tests/data/golden/awq_llama/config.json";
  o.load_tokenizer = false;
  o.load_format = "dummy";
  for (const char* q : {"awq", "gptq", "q4_k", "fp8", "fp8-block"}) {
    o.quantization = q;
    auto sm = load_serving_model(o);
    EXPECT_TRUE(sm.ok()) << q << ": " << sm.status().to_string();
  }
  o.quantization = "int3";
  EXPECT_THAT(load_serving_model(o).status().to_string(), HasSubstr("must be awq, gptq, q4_k, fp8 or fp8-block"));
  // The GPU keeps awq/gptq 4-bit and fp8 FP8 (checked on the device); dummy k-quants would be
  // bf16 there.
  o.quantization = "q4_k";
  o.device = "cuda";
  auto gpu = load_serving_model(o);
  EXPECT_EQ(gpu.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(gpu.status().to_string(), HasSubstr("k-quants are dequantized to bf16"));
  o.quantization = "awq";
  o.device = "cpu";
  o.load_format = "auto";
  o.model_path = test_source_dir() + "/tests/data/golden/awq_llama";
  EXPECT_THAT(load_serving_model(o).status().to_string(), HasSubstr("is for --load-format dummy"));
}

}  // namespace
}  // namespace pagellm
