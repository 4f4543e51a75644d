// Small file helpers shared by the io/ readers (internal to io/).
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "io/mapped_file.h"

namespace pagellm::io_detail {

// Whole file as text; kNotFound when absent. Files here are configs and indexes (kilobytes to a few
// megabytes); `max_bytes` guards against pointing a text reader at a weight file by mistake.
inline Result<std::string> read_text_file(const std::string& path, int64_t max_bytes = 256 << 20) {
  PAGELLM_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  if (f.size() > max_bytes) {
    return invalid_argument(path + ": " + std::to_string(f.size()) +
                            " bytes is too large for a text file (limit " +
                            std::to_string(max_bytes) + ")");
  }
  if (f.size() == 0) return std::string();
  return std::string(reinterpret_cast<const char*>(f.data()), static_cast<size_t>(f.size()));
}

// A name or value quoted for a message, control characters replaced and cut after max_chars: a
// fuzzed or corrupt file can hold anything.
inline std::string quote_name(std::string_view s, size_t max_chars = 200) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < max_chars; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    out += (c < 0x20 || c == 0x7f) ? '?' : static_cast<char>(c);
  }
  if (s.size() > max_chars) out += "...";
  return out + "'";
}

// "a/b" from "a" and "b" (no doubled slash).
inline std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

}  // namespace pagellm::io_detail
