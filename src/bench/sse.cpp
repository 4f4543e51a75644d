#include "bench/sse.h"

namespace pagellm::bench {

void SseParser::end_line(std::vector<std::string>& events) {
  if (line_.empty()) {  // a blank line dispatches the event
    if (has_data_) events.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_[0] != ':') {  // ':' starts a comment (keep-alive pings)
    const size_t colon = line_.find(':');
    std::string_view field(line_), value;
    if (colon != std::string::npos) {
      field = std::string_view(line_).substr(0, colon);
      value = std::string_view(line_).substr(colon + 1);
      if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    }
    if (field == "data") {
      if (has_data_) data_ += '\n';
      data_ += value;
      has_data_ = true;
    }
  }
  line_.clear();
}

void SseParser::feed(std::string_view bytes, std::vector<std::string>& events) {
  for (char c : bytes) {
    if (c == '\n' && last_was_cr_) {  // the LF of a CRLF: the line already ended at CR
      last_was_cr_ = false;
      continue;
    }
    last_was_cr_ = c == '\r';
    if (c == '\r' || c == '\n') {
      end_line(events);
      continue;
    }
    if (line_.size() + data_.size() >= kMaxEventBytes) {
      overflowed_ = true;
      continue;
    }
    line_ += c;
  }
}

}  // namespace pagellm::bench
