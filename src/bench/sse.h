// Incremental Server-Sent Events parser (the text/event-stream framing of the WHATWG HTML spec):
// bytes arrive split anywhere, events come out whole. Only `data:` matters to OpenAI streams;
// comments (`:` lines) and other fields are skipped, CR, LF and CRLF all end a line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm::bench {

class SseParser {
 public:
  // Feeds bytes; appends the data payload of each completed event (data lines joined by '\n') to
  // `events`. An event with no data line is not reported.
  void feed(std::string_view bytes, std::vector<std::string>& events);
  // Bytes held for an unfinished line or event (a stream that ends with this > 0 was cut short).
  size_t pending_bytes() const { return line_.size() + data_.size() + (has_data_ ? 1 : 0); }
  // Guards against a server that never ends a line: more than this many bytes in one line or
  // event marks the stream malformed.
  static constexpr size_t kMaxEventBytes = 16u << 20;
  bool overflowed() const { return overflowed_; }

 private:
  void end_line(std::vector<std::string>& events);

  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;
  bool overflowed_ = false;
};

}  // namespace pagellm::bench
