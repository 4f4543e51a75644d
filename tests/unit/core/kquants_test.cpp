// GGUF's 5-bit and k-quant blocks decode to what llama.cpp's own Python reader (the gguf package)
// gives for the same bytes: random blocks and their values, made by make_kquant_reference.py.
#include "core/kquants.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "source_dir.h"

namespace pagellm {
namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << path;
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

TEST(KQuants, DecodeAsLlamaCppsReader) {
  for (DType t : {DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                  DType::kQ5_K, DType::kQ6_K, DType::kQ8_K}) {
    const std::string base =
        test_source_dir() + "/tests/data/kquants/" + std::string(dtype_name(t));
    const std::vector<char> blocks = read_file(base + ".blocks"),
                            want_bytes = read_file(base + ".f32");
    ASSERT_EQ(blocks.size() % block_bytes(t), 0u) << dtype_name(t);
    const int64_t n = static_cast<int64_t>(blocks.size() / block_bytes(t)) * block_elems(t);
    ASSERT_EQ(static_cast<int64_t>(want_bytes.size()), n * 4) << dtype_name(t);
    std::vector<float> got(n), want(n);
    std::memcpy(want.data(), want_bytes.data(), n * 4);
    to_f32(t, blocks.data(), got.data(), n);
    int64_t exact = 0;
    for (int64_t i = 0; i < n; ++i) {
      // The same f32 operations in the same order; numpy may round an intermediate product
      // differently (one ulp at most).
      ASSERT_NEAR(got[i], want[i], std::fabs(want[i]) * 2.4e-7f + 1e-12f)
          << dtype_name(t) << " value " << i << " (block " << i / block_elems(t) << ")";
      exact += got[i] == want[i];
    }
    EXPECT_GT(exact, n * 9 / 10) << dtype_name(t);
  }
}

}  // namespace
}  // namespace pagellm
