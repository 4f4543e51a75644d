#include "io/safetensors_writer.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "io/weights.h"

namespace pagellm {
namespace {

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kF8E4M3:
      return "F8_E4M3";
    default:
      return nullptr;
  }
}

}  // namespace

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const char* dt = safetensors_dtype(t.dtype);
    if (!dt)
      return invalid_argument(path + ": tensor '" + t.name + "' of type " +
                              std::string(dtype_name(t.dtype)) + " has no safetensors dtype");
    const int64_t bytes = dtype_bytes(t.dtype, shape_numel(t.shape));
    header[t.name] = {
        {"dtype", dt}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8,
              ' ');  // the data region 8-byte aligned, as the library does

  const std::string tmp = path + ".partial";
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "wb"), std::fclose);
  if (!f) return invalid_argument(path + ": cannot create " + tmp);
  auto fail = [&](const std::string& what) {
    f.reset();
    std::remove(tmp.c_str());
    return data_loss(path + ": " + what);
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>((text.size() >> (8 * i)) & 0xff);
  if (std::fwrite(len, 1, 8, f.get()) != 8 ||
      std::fwrite(text.data(), 1, text.size(), f.get()) != text.size())
    return fail("write failed (disk full?)");
  std::vector<char> buf;
  for (const TensorToWrite& t : tensors) {
    buf.assign(dtype_bytes(t.dtype, shape_numel(t.shape)), 0);
    if (Status st = t.fill(buf.data()); !st.ok()) {
      f.reset();
      std::remove(tmp.c_str());
      return st;
    }
    if (std::fwrite(buf.data(), 1, buf.size(), f.get()) != buf.size())
      return fail("write failed (disk full?)");
  }
  if (std::fclose(f.release()) != 0) return fail("write failed (disk full?)");
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return data_loss(path + ": cannot rename " + tmp + ": " + ec.message());
  return Status::ok_status();
}

}  // namespace pagellm
