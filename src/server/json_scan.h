// Finding where a JSON object or array ends without parsing it: brackets matched outside strings
// (escapes honoured), with a depth bound, so that text nested deeper than a recursive parser
// should take is refused before the parser sees it. Whether the value is valid JSON is the
// parser's to say.
#pragma once

#include <cstddef>
#include <string_view>

namespace pagellm::server {

inline constexpr size_t kJsonIncomplete = std::string_view::npos;  // its end has not come
inline constexpr size_t kJsonTooDeep = kJsonIncomplete - 1;        // nested past max_depth

// One past the end of the object or array that starts at s[from] (a '{' or '['), or
// kJsonIncomplete, or kJsonTooDeep.
inline size_t json_value_end(std::string_view s, size_t from, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = from; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return kJsonTooDeep;
    } else if (c == '}' || c == ']') {
      if (--depth <= 0) return i + 1;
    }
  }
  return kJsonIncomplete;
}

}  // namespace pagellm::server
