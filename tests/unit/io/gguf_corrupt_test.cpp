// Every malformed GGUF file gets its own one-line error naming the file and the key or tensor at
// fault, never a crash or an out-of-bounds read (these tests also run under ASan/UBSan, where each
// image is held in a buffer of exactly its size).
#include <gtest/gtest.h>

#include <random>

#include "gguf_test_util.h"
#include "io/gguf.h"

namespace pagellm {
namespace {

using testing::Bytes;
using testing::GgufBuilder;

constexpr const char* kName = "bad.gguf";

Status parse_status(const Bytes& img) {
  // A heap copy of exactly the image's size, so any read past the end is caught by ASan.
  std::unique_ptr<uint8_t[]> exact(new uint8_t[img.size() + 1]);
  if (!img.empty()) std::memcpy(exact.get(), img.data(), img.size());
  auto f = GgufFile::parse(img.empty() ? nullptr : exact.get(), static_cast<int64_t>(img.size()), kName);
  return f.status();
}

void expect_error(const Bytes& img, StatusCode code, const std::vector<std::string>& parts) {
  const Status st = parse_status(img);
  ASSERT_FALSE(st.ok()) << "accepted a corrupt file; expected " << parts.back();
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  EXPECT_EQ(st.message().rfind(kName, 0), 0u) << st.message();
  for (const auto& p : parts) EXPECT_NE(st.message().find(p), std::string::npos) << st.message() << " | want: " << p;
}

GgufBuilder valid() {
  GgufBuilder g;
  g.kv_str("general.architecture", "llama").kv<uint32_t>("llama.block_count", GgufType::kU32, 1);
  g.tensor("a.weight", 0, {8}, Bytes(32, 1));
  g.tensor("b.weight", 8, {32, 2}, Bytes(68, 2));  // q8_0
  return g;
}

Bytes kv_image(const std::string& key, uint32_t type, const Bytes& value) {
  GgufBuilder g;
  g.kv_raw(key, type, value);
  return g.build();
}

TEST(GgufCorrupt, ValidBaselineParses) { EXPECT_TRUE(parse_status(valid().build()).ok()); }

TEST(GgufCorrupt, Header) {
  expect_error({}, StatusCode::kInvalidArgument, {"not a GGUF file"});
  expect_error({'G', 'G'}, StatusCode::kInvalidArgument, {"not a GGUF file"});
  GgufBuilder g = valid();
  g.magic = 0x46554746;
  expect_error(g.build(), StatusCode::kInvalidArgument, {"bad magic"});
  for (uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    g = valid();
    g.version = v;
    expect_error(g.build(), StatusCode::kUnimplemented, {"version"});
  }
  g = valid();
  g.version = 0x03000000;  // version 3 written big-endian
  expect_error(g.build(), StatusCode::kUnimplemented, {"big-endian"});
  Bytes cut = valid().build();
  cut.resize(12);
  expect_error(cut, StatusCode::kDataLoss, {"truncated GGUF header"});
}

TEST(GgufCorrupt, HugeCounts) {
  GgufBuilder g = valid();
  g.n_kv_override = uint64_t{1} << 60;
  expect_error(g.build(), StatusCode::kDataLoss, {"metadata count"});
  g = valid();
  g.n_tensors_override = ~uint64_t{0};
  expect_error(g.build(), StatusCode::kDataLoss, {"tensor count"});
  // A plausible count one larger than the entries present: the missing one runs off the end.
  g = valid();
  g.n_kv_override = 3;
  expect_error(g.build(), StatusCode::kDataLoss, {});
}

TEST(GgufCorrupt, KeysAndValues) {
  // A key whose length runs past the file.
  Bytes b;
  testing::put<uint32_t>(b, kGgufMagic);
  testing::put<uint32_t>(b, 3);
  testing::put<uint64_t>(b, 0);
  testing::put<uint64_t>(b, 1);
  testing::put<uint64_t>(b, uint64_t{1} << 62);  // key length
  b.resize(b.size() + 16, 'k');
  expect_error(b, StatusCode::kDataLoss, {"metadata key #0"});

  expect_error(kv_image("", 4, Bytes(4, 0)), StatusCode::kDataLoss, {"is empty"});
  expect_error(kv_image("k.type", 13, Bytes(8, 0)), StatusCode::kDataLoss, {"'k.type'", "unknown value type 13"});
  expect_error(kv_image("k.u64", static_cast<uint32_t>(GgufType::kU64), Bytes(4, 0)), StatusCode::kDataLoss,
               {"'k.u64'", "runs past"});
  expect_error(kv_image("k.bool", static_cast<uint32_t>(GgufType::kBool), Bytes{2}), StatusCode::kDataLoss,
               {"'k.bool'", "bool"});

  Bytes s;
  testing::put<uint64_t>(s, ~uint64_t{0});  // string length
  expect_error(kv_image("k.str", static_cast<uint32_t>(GgufType::kString), s), StatusCode::kDataLoss,
               {"'k.str'", "string runs past"});

  Bytes arr;
  testing::put<uint32_t>(arr, static_cast<uint32_t>(GgufType::kU32));
  testing::put<uint64_t>(arr, uint64_t{1} << 62);
  expect_error(kv_image("k.arr", static_cast<uint32_t>(GgufType::kArray), arr), StatusCode::kDataLoss,
               {"'k.arr'", "array of 4611686018427387904 u32 runs past"});

  Bytes sarr;
  testing::put<uint32_t>(sarr, static_cast<uint32_t>(GgufType::kString));
  testing::put<uint64_t>(sarr, ~uint64_t{0});
  testing::put_str(sarr, "one");
  expect_error(kv_image("k.sarr", static_cast<uint32_t>(GgufType::kArray), sarr), StatusCode::kDataLoss,
               {"'k.sarr'", "array element 1"});

  Bytes earr;
  testing::put<uint32_t>(earr, 99);
  testing::put<uint64_t>(earr, 1);
  expect_error(kv_image("k.earr", static_cast<uint32_t>(GgufType::kArray), earr), StatusCode::kDataLoss,
               {"'k.earr'", "unknown element type 99"});

  Bytes barr = GgufBuilder::array_value<uint8_t>(GgufType::kBool, {1, 0, 7});
  expect_error(kv_image("k.barr", static_cast<uint32_t>(GgufType::kArray), barr), StatusCode::kDataLoss,
               {"'k.barr'", "element 2"});

  // Arrays nested past the depth limit: each level claims one element, the innermost is empty.
  Bytes deep;
  for (int i = 0; i < 100; ++i) {
    testing::put<uint32_t>(deep, static_cast<uint32_t>(GgufType::kArray));
    testing::put<uint64_t>(deep, 1);
  }
  expect_error(kv_image("k.deep", static_cast<uint32_t>(GgufType::kArray), deep), StatusCode::kDataLoss,
               {"'k.deep'", "nested deeper"});

  // Many empty nested arrays: accepted, bounded by the file size.
  Bytes wide;
  testing::put<uint32_t>(wide, static_cast<uint32_t>(GgufType::kArray));
  testing::put<uint64_t>(wide, 1000);
  for (int i = 0; i < 1000; ++i) {
    testing::put<uint32_t>(wide, static_cast<uint32_t>(GgufType::kI8));
    testing::put<uint64_t>(wide, 0);
  }
  EXPECT_TRUE(parse_status(kv_image("k.wide", static_cast<uint32_t>(GgufType::kArray), wide)).ok());

  GgufBuilder dup;
  dup.kv<uint32_t>("k", GgufType::kU32, 1).kv<uint32_t>("k", GgufType::kU32, 2);
  expect_error(dup.build(), StatusCode::kDataLoss, {"duplicate metadata key 'k'"});
}

TEST(GgufCorrupt, Alignment) {
  GgufBuilder g;
  g.kv<uint64_t>("general.alignment", GgufType::kU64, 32);
  expect_error(g.build(), StatusCode::kDataLoss, {"general.alignment", "expected u32"});
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufBuilder h;
    h.kv<uint32_t>("general.alignment", GgufType::kU32, a);
    expect_error(h.build(), StatusCode::kDataLoss, {"general.alignment", "power of two"});
  }
}

TEST(GgufCorrupt, TensorInfos) {
  GgufBuilder g = valid();
  g.tensors[1].n_dims = 5;
  expect_error(g.build(), StatusCode::kDataLoss, {"'b.weight'", "n_dims = 5"});
  g = valid();
  g.tensors[1].n_dims = 0;
  expect_error(g.build(), StatusCode::kDataLoss, {"'b.weight'", "n_dims = 0"});
  g = valid();
  g.tensors[1].dims = {32, uint64_t{1} << 62, 4};
  expect_error(g.build(), StatusCode::kDataLoss, {"'b.weight'", "overflows"});
  g = valid();
  g.tensors[1].dims = {32, ~uint64_t{0}};
  expect_error(g.build(), StatusCode::kDataLoss, {"'b.weight'", "overflows"});
  g = valid();
  g.tensors[1].type = 4;  // a removed ggml type
  expect_error(g.build(), StatusCode::kDataLoss, {"'b.weight'", "unknown ggml type 4"});
  g = valid();
  g.tensors[1].dims = {33, 2};
  expect_error(g.build(), StatusCode::kDataLoss, {"'b.weight'", "not a multiple of q8_0's block of 32"});
  g = valid();
  g.tensors[1].name = "a.weight";
  expect_error(g.build(), StatusCode::kDataLoss, {"duplicate tensor name 'a.weight'"});
  g = valid();
  g.tensors[0].name = "";
  expect_error(g.build(), StatusCode::kDataLoss, {"tensor info #0", "empty name"});
  g = valid();
  g.tensors[1].name = std::string("bad\nname");
  g.tensors[1].type = 5;
  expect_error(g.build(), StatusCode::kDataLoss, {"'bad?name'"});  // control characters masked
  // Tensor infos cut short.
  Bytes cut = valid().build();
  const GgufFile ok = std::move(GgufFile::parse(cut.data(), static_cast<int64_t>(cut.size()), "x").value());
  cut.resize(static_cast<size_t>(ok.data_offset()) - 20);
  expect_error(cut, StatusCode::kDataLoss, {"'b.weight'"});
}

TEST(GgufCorrupt, TensorExtents) {
  GgufBuilder g = valid();
  g.tensors[1].offset = 33;
  expect_error(g.build(), StatusCode::kDataLoss, {"'b.weight'", "offset 33 is not a multiple of the alignment 32"});
  g = valid();
  g.tensors[1].offset = uint64_t{1} << 63;
  expect_error(g.build(), StatusCode::kDataLoss, {"'b.weight'", "beyond the file"});
  g = valid();
  g.tensors[1].offset = 0;  // overlaps a.weight's bytes [0, 32)
  expect_error(g.build(), StatusCode::kDataLoss, {"'a.weight'", "'b.weight'", "overlap"});
  g = valid();
  Bytes short_img = g.build();
  short_img.resize(short_img.size() - 1);
  expect_error(short_img, StatusCode::kDataLoss, {"'b.weight'", "run past the end of the data section"});
  // An aligned offset beyond the file, built without materializing it.
  GgufBuilder far;
  far.tensor("far.weight", 0, {8}, Bytes(32, 0));
  far.tensors[0].offset = 0;
  Bytes far_img = far.build();
  // Patch the offset field: header (24) + name (8 + 10) + n_dims (4) + one dim (8) + type (4).
  const size_t off_pos = 24 + 8 + 10 + 4 + 8 + 4;
  const uint64_t huge = uint64_t{1} << 62;
  std::memcpy(&far_img[off_pos], &huge, 8);
  expect_error(far_img, StatusCode::kDataLoss, {"'far.weight'", "run past the end"});
}

// Every prefix of a valid file and thousands of random byte edits: errors, never crashes.
TEST(GgufCorrupt, TruncationsAndMutationsNeverCrash) {
  GgufBuilder g = valid();
  g.kv_str_arr("tokenizer.ggml.tokens", {"a", "bb", "ccc"});
  g.kv_arr<float>("f", GgufType::kF32, {1.0f, 2.0f});
  const Bytes img = g.build();
  ASSERT_TRUE(parse_status(img).ok());
  int n_errors = 0;
  for (size_t n = 0; n < img.size(); ++n) {
    Bytes cut(img.begin(), img.begin() + static_cast<std::ptrdiff_t>(n));
    const Status st = parse_status(cut);
    if (!st.ok()) ++n_errors;
  }
  // Only the cuts inside the trailing tensor data can still parse... and those fail on extents.
  EXPECT_EQ(n_errors, static_cast<int>(img.size()));

  std::mt19937 rng(20240601);
  printf("mutation seed 20240601\n");
  for (int iter = 0; iter < 5000; ++iter) {
    Bytes m = img;
    const int n_edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < n_edits; ++e) {
      const size_t at = rng() % m.size();
      m[at] = static_cast<uint8_t>(rng() % 3 == 0 ? 0xff : rng());
    }
    const Status st = parse_status(m);
    if (!st.ok()) {
      ASSERT_EQ(st.message().find('\n'), std::string::npos);
      ASSERT_EQ(st.message().rfind(kName, 0), 0u);
    } else {
      // Whatever parses must be readable through every getter without trouble.
      auto f = GgufFile::parse(m.data(), static_cast<int64_t>(m.size()), kName);
      ASSERT_TRUE(f.ok());
      for (const GgufKv& kv : f->metadata()) {
        (void)f->value_to_string(kv);
        (void)f->get_string_array(kv.key);
        (void)f->get_i32_array(kv.key);
        (void)f->get_f32_array(kv.key);
        (void)f->get_string(kv.key);
        (void)f->get_i64(kv.key);
      }
      (void)gguf_model_config(*f);
    }
  }
}

}  // namespace
}  // namespace pagellm
