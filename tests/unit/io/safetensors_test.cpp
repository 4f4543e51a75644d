// safetensors reader: files written by the reference library and by a small writer below (single
// and sharded), then every kind of corruption, each of which must give a one-line error that names
// the file and, where there is one, the tensor.
#include "io/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/weights.h"
#include "source_dir.h"

namespace pagellm {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// --- a tiny safetensors writer ---

struct TestTensor {
  std::string name;
  std::string dtype;  // safetensors spelling: "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}
std::string bf16_bytes(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float f : v) h.push_back(f32_to_bf16(f));
  return bytes_of(h);
}
std::string f16_bytes(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float f : v) h.push_back(f32_to_f16(f));
  return bytes_of(h);
}

// 8-byte length, header, data: no validation, so tests can write anything.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);  // little-endian
  return out + header + data;
}

// A well-formed header for `ts` laid out back to back; the header is space-padded to a multiple
// of 8 as the reference writer does, so data stays aligned.
json header_for(const std::vector<TestTensor>& ts, const json& metadata = nullptr) {
  json h = json::object();
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  int64_t off = 0;
  for (const TestTensor& t : ts) {
    h[t.name] = {{"dtype", t.dtype},
                 {"shape", t.shape},
                 {"data_offsets", {off, off + int64_t(t.bytes.size())}}};
    off += static_cast<int64_t>(t.bytes.size());
  }
  return h;
}
std::string data_for(const std::vector<TestTensor>& ts) {
  std::string d;
  for (const TestTensor& t : ts) d += t.bytes;
  return d;
}
std::string padded(std::string header) {
  while (header.size() % 8) header += ' ';
  return header;
}
std::string make_file(const std::vector<TestTensor>& ts, const json& metadata = nullptr) {
  return raw_file(padded(header_for(ts, metadata).dump()), data_for(ts));
}

std::vector<TestTensor> sample_tensors() {
  return {
      {"model.embed_tokens.weight", "F32", {2, 3}, bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6})},
      {"model.norm.weight", "BF16", {4}, bf16_bytes({0.5f, -1.0f, 2.0f, 3.25f})},
      {"lm_head.weight", "F16", {2, 2}, f16_bytes({1.0f, -0.5f, 0.25f, 8.0f})},
      {"ids", "I32", {3}, bytes_of(std::vector<int32_t>{7, -8, 9})},
      {"big", "I64", {1}, bytes_of(std::vector<int64_t>{int64_t{1} << 50})},
      {"scalar", "F32", {}, bytes_of(std::vector<float>{42.0f})},
  };
}

// One-line message naming each of `parts`.
void expect_error(const Status& st, StatusCode code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st.to_string();
  for (const std::string& p : parts) EXPECT_THAT(st.message(), HasSubstr(p));
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
}

Status parse_bytes(const std::string& file, const std::string& name = "x.safetensors") {
  return parse_safetensors(reinterpret_cast<const uint8_t*>(file.data()),
                           static_cast<int64_t>(file.size()), name)
      .status();
}

// --- in-memory parsing ---

TEST(SafetensorsParse, GoodHeader) {
  const std::string file = make_file(sample_tensors(), {{"format", "pt"}});
  Result<SafetensorsHeader> h = parse_safetensors(reinterpret_cast<const uint8_t*>(file.data()),
                                                  int64_t(file.size()), "m.safetensors");
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_EQ(h->tensors.size(), 6u);
  EXPECT_EQ(h->data_offset % 8, 0);
  EXPECT_EQ(h->tensors[0].name, "model.embed_tokens.weight");  // offset order
  EXPECT_EQ(h->tensors[0].data, file.data() + h->data_offset);
  EXPECT_EQ(h->tensors[1].dtype, DType::kBF16);
  EXPECT_EQ(h->tensors[1].nbytes, 8);
  EXPECT_EQ(h->tensors[5].shape.size(), 0u);
  EXPECT_EQ(h->tensors[5].nbytes, 4);
  EXPECT_EQ(h->tensors[0].file, "m.safetensors");
}

TEST(SafetensorsParse, EmptyTensorsAndGapsAreFine) {
  // An empty tensor may share its offset with a neighbour (the reference writer does this), and
  // unused bytes between tensors are tolerated.
  json h = {{"a", {{"dtype", "F32"}, {"shape", {0, 4}}, {"data_offsets", {0, 0}}}},
            {"b", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}},
            {"c", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {8, 12}}}}};
  EXPECT_TRUE(parse_bytes(raw_file(h.dump(), std::string(12, '\0'))).ok());
  // No tensors at all is a valid (if useless) file.
  EXPECT_TRUE(parse_bytes(raw_file("{}", "")).ok());
  EXPECT_TRUE(parse_bytes(raw_file(R"({"__metadata__": {}})", "")).ok());
}

TEST(SafetensorsParse, TooShortAndBadLength) {
  expect_error(parse_bytes("", "f.st"), StatusCode::kDataLoss, {"f.st", "too short"});
  expect_error(parse_bytes(std::string(7, '\0'), "f.st"), StatusCode::kDataLoss, {"f.st"});
  std::string file = make_file(sample_tensors());
  file[0] = static_cast<char>(0xff);  // header length now far past the end
  file[5] = 1;
  expect_error(parse_bytes(file, "f.st"), StatusCode::kDataLoss, {"f.st", "header length"});
  std::string huge(8, static_cast<char>(0xff));  // 2^64 - 1
  expect_error(parse_bytes(huge + "{}", "f.st"), StatusCode::kDataLoss, {"f.st", "header length"});
}

TEST(SafetensorsParse, BadJson) {
  expect_error(parse_bytes(raw_file("{\"a\": ", ""), "f.st"), StatusCode::kDataLoss,
               {"f.st", "JSON"});
  expect_error(parse_bytes(raw_file("[1, 2]", ""), "f.st"), StatusCode::kDataLoss,
               {"f.st", "object"});
  expect_error(parse_bytes(raw_file("", ""), "f.st"), StatusCode::kDataLoss, {"f.st"});
  expect_error(parse_bytes(raw_file(R"({"t": 3})", ""), "f.st"), StatusCode::kDataLoss,
               {"f.st", "'t'"});
}

TEST(SafetensorsParse, UnsupportedDtypeNamesTensorFileAndDtype) {
  std::vector<TestTensor> ts = sample_tensors();
  // F8_E4M3 is read (FP8 checkpoints); its sibling F8_E5M2 is not.
  ts[2] = {"model.layers.0.mlp.down_proj.weight", "F8_E5M2", {2, 2}, std::string(4, '\0')};
  expect_error(parse_bytes(make_file(ts), "model-00001.safetensors"), StatusCode::kUnimplemented,
               {"model-00001.safetensors", "'model.layers.0.mlp.down_proj.weight'", "F8_E5M2"});
  ts[2].dtype = "F64";
  ts[2].bytes = std::string(32, '\0');
  expect_error(parse_bytes(make_file(ts)), StatusCode::kUnimplemented, {"F64"});
  ts[2].dtype = "NOT_A_TYPE";
  expect_error(parse_bytes(make_file(ts)), StatusCode::kUnimplemented, {"NOT_A_TYPE"});
}

TEST(SafetensorsParse, ShapeMustMatchByteCount) {
  std::vector<TestTensor> ts = sample_tensors();
  json h = header_for(ts);
  h["model.norm.weight"]["shape"] = {5};  // 5 x BF16 = 10 bytes, span is 8
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts)), "f.st"), StatusCode::kDataLoss,
               {"f.st", "'model.norm.weight'", "10 bytes", "span 8"});
  h["model.norm.weight"]["shape"] = {-4};
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss,
               {"'model.norm.weight'"});
  h["model.norm.weight"]["shape"] = {4.0};
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss,
               {"'model.norm.weight'"});
  h["model.norm.weight"]["shape"] = "4";
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss,
               {"'model.norm.weight'"});
  // Products that overflow int64 are caught, not wrapped into a small size.
  h["model.norm.weight"]["shape"] = {int64_t{1} << 40, int64_t{1} << 40};
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss,
               {"'model.norm.weight'", "too many"});
  h["model.norm.weight"]["shape"] = {int64_t{1} << 62};  // elements fit, bytes do not
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss,
               {"'model.norm.weight'", "too many bytes"});
  // ... unless a zero dimension makes it empty.
  h["model.norm.weight"]["shape"] = {int64_t{1} << 40, int64_t{1} << 40, 0};
  h["model.norm.weight"]["data_offsets"] = {0, 0};
  EXPECT_TRUE(parse_bytes(raw_file(h.dump(), data_for(ts))).ok());
}

TEST(SafetensorsParse, OffsetsInsideDataRegion) {
  std::vector<TestTensor> ts = sample_tensors();
  std::string file = make_file(ts);
  // Truncated file: the last tensor's bytes are gone.
  expect_error(parse_bytes(file.substr(0, file.size() - 2), "cut.st"), StatusCode::kDataLoss,
               {"cut.st", "'scalar'", "past the data region"});
  json h = header_for(ts);
  h["ids"]["data_offsets"] = {20, 8};
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss,
               {"'ids'", "reversed"});
  h["ids"]["data_offsets"] = {-4, 8};
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss, {"'ids'"});
  h["ids"]["data_offsets"] = {0};
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss,
               {"'ids'", "data_offsets"});
  h["ids"].erase("data_offsets");
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss,
               {"'ids'", "data_offsets"});
  h = header_for(ts);
  h["ids"]["data_offsets"] = {18446744073709551604ull, 18446744073709551615ull};
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss, {"'ids'"});
  h["ids"]["data_offsets"] = {9223372036854775800ll, 9223372036854775807ll};
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss, {"'ids'"});
}

TEST(SafetensorsParse, OverlapsAreRefused) {
  std::vector<TestTensor> ts = sample_tensors();
  json h = header_for(ts);
  // "ids" (12 bytes) moved to start 4 bytes before its real place: it overlaps lm_head's bytes.
  const int64_t begin = h["ids"]["data_offsets"][0].get<int64_t>() - 4;
  h["ids"]["data_offsets"] = {begin, begin + 12};
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts)), "f.st"), StatusCode::kDataLoss,
               {"f.st", "overlaps", "'ids'", "'lm_head.weight'"});
  // Two tensors on exactly the same bytes.
  h = header_for(ts);
  h["scalar"]["data_offsets"] = h["model.embed_tokens.weight"]["data_offsets"];
  h["scalar"]["shape"] = {6};
  expect_error(parse_bytes(raw_file(h.dump(), data_for(ts))), StatusCode::kDataLoss, {"overlaps"});
}

TEST(SafetensorsParse, DuplicateNamesAndMetadata) {
  const std::string hdr = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                          R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  expect_error(parse_bytes(raw_file(hdr, std::string(8, '\0')), "f.st"), StatusCode::kDataLoss,
               {"f.st", "'w'", "twice"});
  // A nested duplicate key (inside one entry) is not a duplicate tensor.
  const std::string nested =
      R"({"w": {"dtype": "F32", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  EXPECT_TRUE(parse_bytes(raw_file(nested, std::string(4, '\0'))).ok());

  EXPECT_TRUE(parse_bytes(make_file(sample_tensors(), {{"format", "pt"}, {"note", "x"}})).ok());
  expect_error(parse_bytes(make_file(sample_tensors(), json::array({1})), "f.st"),
               StatusCode::kDataLoss, {"f.st", "__metadata__"});
  expect_error(parse_bytes(make_file(sample_tensors(), {{"format", 1}})), StatusCode::kDataLoss,
               {"__metadata__", "'format'"});
}

// --- files and folders ---

class SafetensorsDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pagellm_st_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string dir() const { return dir_.string(); }

  // Two shards: embed + norm in shard 1, the rest in shard 2, with a matching index.
  void write_sharded(std::vector<TestTensor> ts) {
    std::vector<TestTensor> s1(ts.begin(), ts.begin() + 2), s2(ts.begin() + 2, ts.end());
    write("model-00001-of-00002.safetensors", make_file(s1, {{"format", "pt"}}));
    write("model-00002-of-00002.safetensors", make_file(s2, {{"format", "pt"}}));
    json wm = json::object();
    for (const TestTensor& t : s1) wm[t.name] = "model-00001-of-00002.safetensors";
    for (const TestTensor& t : s2) wm[t.name] = "model-00002-of-00002.safetensors";
    index_ = {{"metadata", {{"total_size", 60}}}, {"weight_map", wm}};
    write("model.safetensors.index.json", index_.dump(2));
  }

  fs::path dir_;
  json index_;
};

void expect_sample_values(const WeightSource& w) {
  ASSERT_EQ(w.tensors().size(), 6u);
  Result<Tensor> emb = w.get("model.embed_tokens.weight", {2, 3});
  ASSERT_TRUE(emb.ok()) << emb.status().to_string();
  EXPECT_EQ(emb->dtype, DType::kF32);
  EXPECT_EQ(emb->ndim, 2);
  EXPECT_EQ(emb->size(0), 2);
  EXPECT_EQ(emb->size(1), 3);
  EXPECT_EQ(emb->stride[0], 3);
  EXPECT_FLOAT_EQ(emb->ptr<float>()[5], 6.0f);

  Result<Tensor> norm = w.get("model.norm.weight");
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(norm->dtype, DType::kBF16);
  EXPECT_FLOAT_EQ(bf16_to_f32(norm->ptr<uint16_t>()[3]), 3.25f);

  Result<Tensor> head = w.get("lm_head.weight", {2, 2});
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->dtype, DType::kF16);
  EXPECT_FLOAT_EQ(f16_to_f32(head->ptr<uint16_t>()[1]), -0.5f);

  Result<Tensor> ids = w.get("ids");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->dtype, DType::kI32);
  EXPECT_EQ(ids->ptr<int32_t>()[1], -8);
  Result<Tensor> big = w.get("big");
  ASSERT_TRUE(big.ok());
  int64_t v;
  std::memcpy(&v, big->data, 8);  // I64 data may sit at any 4-byte boundary in the file
  EXPECT_EQ(v, int64_t{1} << 50);
  Result<Tensor> scalar = w.get("scalar");
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->ndim, 1);
  EXPECT_EQ(scalar->numel(), 1);
  EXPECT_FLOAT_EQ(scalar->ptr<float>()[0], 42.0f);

  EXPECT_EQ(w.find("nope"), nullptr);
  ASSERT_NE(w.find("ids"), nullptr);
  EXPECT_EQ(w.find("ids")->shape, std::vector<int64_t>{3});

  Result<Tensor> missing = w.get("model.layers.0.self_attn.q_proj.weight");
  expect_error(missing.status(), StatusCode::kNotFound,
               {"'model.layers.0.self_attn.q_proj.weight'"});
  Result<Tensor> wrong = w.get("model.embed_tokens.weight", {3, 2});
  expect_error(wrong.status(), StatusCode::kInvalidArgument,
               {"'model.embed_tokens.weight'", "[2, 3]", "expected [3, 2]", ".safetensors"});
}

TEST_F(SafetensorsDir, SingleFile) {
  write("model.safetensors", make_file(sample_tensors(), {{"format", "pt"}}));
  Result<std::unique_ptr<WeightSource>> w = open_safetensors_weights(dir());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  expect_sample_values(**w);
  EXPECT_THAT((*w)->description(), HasSubstr("model.safetensors"));
  EXPECT_THAT(std::string((*w)->find("ids")->file), HasSubstr("model.safetensors"));
}

TEST_F(SafetensorsDir, ReferenceWriterFile) {
  // Written by the safetensors Python library (scripts/make_safetensors_test_data.py).
  Result<std::unique_ptr<WeightSource>> w =
      open_safetensors_file(test_source_dir() + "/tests/data/safetensors/reference.safetensors");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_EQ((*w)->tensors().size(), 5u);
  Result<Tensor> a = (*w)->get("a.f32", {2, 3});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(a->ptr<float>()[i], i * 0.5f - 1.0f);
  Result<Tensor> b = (*w)->get("b.f16", {2, 2});
  ASSERT_TRUE(b.ok());
  const float want_b[] = {1.0f, -2.0f, 0.5f, 65504.0f};
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(f16_to_f32(b->ptr<uint16_t>()[i]), want_b[i]);
  Result<Tensor> c = (*w)->get("c.i32", {3});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ptr<int32_t>()[1], -2);
  Result<Tensor> d = (*w)->get("d.i64", {2, 1});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ptr<int64_t>()[0], int64_t{1} << 40);
  EXPECT_EQ(d->ptr<int64_t>()[1], -7);
  Result<Tensor> e = (*w)->get("e.empty", {0, 4});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->numel(), 0);
}

TEST_F(SafetensorsDir, Sharded) {
  write_sharded(sample_tensors());
  Result<std::unique_ptr<WeightSource>> w = open_safetensors_weights(dir());
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  expect_sample_values(**w);
  EXPECT_THAT((*w)->description(), HasSubstr("model.safetensors.index.json (2 shards)"));
  EXPECT_THAT((*w)->find("model.norm.weight")->file, HasSubstr("model-00001-of-00002.safetensors"));
  EXPECT_THAT((*w)->find("scalar")->file, HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(SafetensorsDir, IndexWinsOverSingleFile) {
  write_sharded(sample_tensors());
  write("model.safetensors", "garbage");
  EXPECT_TRUE(open_safetensors_weights(dir()).ok());
}

TEST_F(SafetensorsDir, ShardedErrors) {
  write_sharded(sample_tensors());
  // A tensor listed in the index but absent from its shard.
  json idx = index_;
  idx["weight_map"]["model.layers.0.mlp.up_proj.weight"] = "model-00002-of-00002.safetensors";
  write("model.safetensors.index.json", idx.dump());
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kDataLoss,
               {"model.safetensors.index.json", "'model.layers.0.mlp.up_proj.weight'",
                "model-00002-of-00002.safetensors"});

  // A tensor the index places in the wrong shard.
  idx = index_;
  idx["weight_map"]["ids"] = "model-00001-of-00002.safetensors";
  write("model.safetensors.index.json", idx.dump());
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kDataLoss,
               {"'ids'", "model-00001-of-00002.safetensors"});

  // A shard file missing.
  idx = index_;
  idx["weight_map"]["extra"] = "model-00003-of-00003.safetensors";
  write("model.safetensors.index.json", idx.dump());
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kNotFound,
               {"model-00003-of-00003.safetensors", "'extra'", "missing"});

  // A shard name that leaves the folder.
  idx = index_;
  idx["weight_map"]["ids"] = "../model-00002-of-00002.safetensors";
  write("model.safetensors.index.json", idx.dump());
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kDataLoss,
               {"'ids'", "plain file name"});

  // Malformed index files.
  write("model.safetensors.index.json", "{\"weight_map\": ");
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kDataLoss,
               {"model.safetensors.index.json", "JSON"});
  write("model.safetensors.index.json", R"({"metadata": {}})");
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kDataLoss, {"weight_map"});
  write("model.safetensors.index.json", R"({"weight_map": {"ids": 2}})");
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kDataLoss, {"'ids'"});
  write("model.safetensors.index.json", R"({"weight_map": {}})");
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kDataLoss, {"weight_map"});
}

TEST_F(SafetensorsDir, DuplicateAcrossShards) {
  std::vector<TestTensor> ts = sample_tensors();
  write_sharded(ts);
  // Shard 2 also carries shard 1's norm weight.
  std::vector<TestTensor> s2(ts.begin() + 2, ts.end());
  s2.push_back(ts[1]);
  write("model-00002-of-00002.safetensors", make_file(s2));
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kDataLoss,
               {"'model.norm.weight'", "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"});
}

TEST_F(SafetensorsDir, CorruptShardNamesFile) {
  write_sharded(sample_tensors());
  std::vector<TestTensor> ts = sample_tensors();
  ts[3].dtype = "F8_E5M2";
  std::vector<TestTensor> s2(ts.begin() + 2, ts.end());
  write("model-00002-of-00002.safetensors", make_file(s2));
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kUnimplemented,
               {"model-00002-of-00002.safetensors", "'ids'", "F8_E5M2"});
}

TEST_F(SafetensorsDir, MissingFiles) {
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kNotFound,
               {"model.safetensors", "model.safetensors.index.json"});
  expect_error(open_safetensors_weights(path("nope")).status(), StatusCode::kNotFound, {"nope"});
  write("plain", "x");
  expect_error(open_safetensors_weights(path("plain")).status(), StatusCode::kInvalidArgument,
               {"plain"});
  write("model.safetensors", "");
  expect_error(open_safetensors_weights(dir()).status(), StatusCode::kDataLoss,
               {"model.safetensors"});
}

TEST_F(SafetensorsDir, CheckpointWithConfig) {
  write("model.safetensors", make_file(sample_tensors()));
  std::ifstream in(test_source_dir() + "/tests/data/configs/llama-3.1-8b.json");
  std::stringstream ss;
  ss << in.rdbuf();
  write("config.json", ss.str());
  write("generation_config.json", R"({"eos_token_id": 128009})");
  Result<LoadedCheckpoint> c = open_safetensors_checkpoint(dir());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->config.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->config.eos_token_ids, std::vector<int32_t>{128009});
  EXPECT_THAT(c->config.source, HasSubstr("model.safetensors"));
  EXPECT_EQ(c->weights->tensors().size(), 6u);
  EXPECT_TRUE(c->gguf_path.empty());

  fs::remove(dir_ / "config.json");
  expect_error(open_safetensors_checkpoint(dir()).status(), StatusCode::kNotFound, {"config.json"});
}

// --- open_checkpoint: format detection ---

using CheckpointDir = SafetensorsDir;

std::string llama_config_text() {
  std::ifstream in(test_source_dir() + "/tests/data/configs/llama-3-8b.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_F(CheckpointDir, FolderWithSafetensors) {
  write("config.json", llama_config_text());
  write("model.safetensors", make_file(sample_tensors()));
  write("model-q4.gguf", "not read: safetensors win");
  Result<LoadedCheckpoint> c = open_checkpoint(dir());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->config.hidden_size, 4096);
  EXPECT_EQ(c->weights->tensors().size(), 6u);
  EXPECT_TRUE(c->gguf_path.empty());
}

TEST_F(CheckpointDir, ShardedFolder) {
  write("config.json", llama_config_text());
  write_sharded(sample_tensors());
  Result<LoadedCheckpoint> c = open_checkpoint(dir() + "/");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->weights->tensors().size(), 6u);
}

TEST_F(CheckpointDir, GgufPathsGoToTheGgufReader) {
  write("model.gguf", "garbage, not a GGUF");
  // A .gguf path, and a folder holding exactly one .gguf, both reach the GGUF reader, whose
  // error names the file.
  expect_error(open_checkpoint(path("model.gguf")).status(), StatusCode::kInvalidArgument,
               {"model.gguf", "GGUF"});
  expect_error(open_checkpoint(dir()).status(), StatusCode::kInvalidArgument,
               {"model.gguf", "GGUF"});
  write("other.gguf", "x");
  expect_error(open_checkpoint(dir()).status(), StatusCode::kInvalidArgument, {"2 .gguf files"});
}

TEST_F(CheckpointDir, NothingToLoad) {
  expect_error(open_checkpoint(path("does-not-exist")).status(), StatusCode::kNotFound,
               {"does-not-exist"});
  expect_error(open_checkpoint(dir()).status(), StatusCode::kNotFound, {dir(), ".gguf"});
  write("weights.bin", "x");
  expect_error(open_checkpoint(path("weights.bin")).status(), StatusCode::kInvalidArgument,
               {"weights.bin"});
  write("model.safetensors", make_file(sample_tensors()));
  expect_error(open_checkpoint(path("model.safetensors")).status(), StatusCode::kInvalidArgument,
               {"model.safetensors", "folder"});
  // Safetensors present but no config.json.
  expect_error(open_checkpoint(dir()).status(), StatusCode::kNotFound, {"config.json"});
}

}  // namespace
}  // namespace pagellm
