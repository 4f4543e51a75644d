// MappedFile: a read-only memory map of a whole file (RAII). Checkpoints are mapped, never read
// into memory, so loading is O(header) and pages come in on first use.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace pagellm {

class MappedFile {
 public:
  static Result<MappedFile> open(const std::string& path);
  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  std::string path_;
};

}  // namespace pagellm
