#include "server/tool_parser.h"

#include <algorithm>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "server/json_scan.h"

namespace pagellm::server {
namespace {

using Json = nlohmann::ordered_json;  // ordered: arguments keep the model's key order

constexpr std::string_view kHermesStart = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kMistralStart = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";

// Deepest JSON nesting accepted in a call (as in request bodies, openai_protocol.h); deeper text
// is not a call.
constexpr int kMaxDepth = 64;
// Longest function name accepted (OpenAI allows 64 characters; namespaced names run longer).
constexpr size_t kMaxNameBytes = 256;

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

// The length of the longest suffix of `text` that is a proper prefix of `marker`: text that may
// be the start of a marker whose rest has not come yet.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// Whether `text` (not empty) may still grow into `marker`.
bool may_become(std::string_view text, std::string_view marker) {
  return text.size() < marker.size() && marker.substr(0, text.size()) == text;
}

constexpr size_t kIncomplete = kJsonIncomplete;
constexpr size_t kTooDeep = kJsonTooDeep;

// One past the end of the JSON object or array that starts at s[from] (server/json_scan.h).
size_t json_value_end(std::string_view s, size_t from) {
  return server::json_value_end(s, from, kMaxDepth);
}

// `s` as one JSON value (nothing after it but whitespace), or nullopt.
std::optional<Json> parse_json(std::string_view s) {
  s = trim(s);
  if (s.empty()) return std::nullopt;
  if ((s.front() == '{' || s.front() == '[') && json_value_end(s, 0) == kTooDeep)
    return std::nullopt;
  try {
    Json j = Json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return std::nullopt;
    return j;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  return std::none_of(name.begin(), name.end(),
                      [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; });
}

// Characters of a function name written bare (mistral's [TOOL_CALLS]name[ARGS]).
bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.' || c == ':';
}

// Arguments as the API returns them: a JSON object as text. Absent or null is no arguments; a
// string holding a JSON object (some models quote them) is that object.
std::optional<std::string> arguments_text(const Json* args) {
  if (!args || args->is_null()) return "{}";
  if (args->is_object()) return dump(*args);
  if (args->is_string()) {
    auto inner = parse_json(args->get<std::string>());
    if (inner && inner->is_object()) return dump(*inner);
  }
  return std::nullopt;
}

// {"name": ..., "arguments" (or "parameters"): {...}} as a call.
std::optional<ToolCall> call_from_object(const Json& obj) {
  if (!obj.is_object()) return std::nullopt;
  auto name = obj.find("name");
  if (name == obj.end() || !name->is_string() || !valid_name(name->get<std::string>()))
    return std::nullopt;
  const Json* args = nullptr;
  if (auto a = obj.find("arguments"); a != obj.end()) {
    args = &*a;
  } else if (auto p = obj.find("parameters"); p != obj.end()) {
    args = &*p;
  }
  auto text = arguments_text(args);
  if (!text) return std::nullopt;
  return ToolCall{"", name->get<std::string>(), std::move(*text)};
}

std::optional<ToolCall> call_from_json_text(std::string_view s) {
  auto j = parse_json(s);
  if (!j) return std::nullopt;
  return call_from_object(*j);
}

// The body of <｜tool▁call▁begin｜>...<｜tool▁call▁end｜>: V3.1's name<｜tool▁sep｜>{...}, or V3's
// and R1's function<｜tool▁sep｜>name\n```json\n{...}\n```.
std::optional<ToolCall> deepseek_call(std::string_view body) {
  const size_t sep = body.find(kDsSep);
  if (sep == std::string_view::npos) return std::nullopt;
  const std::string_view before = trim(body.substr(0, sep));
  const std::string_view after = body.substr(sep + kDsSep.size());
  if (auto args = parse_json(after); args && args->is_object() && valid_name(before))
    return ToolCall{"", std::string(before), dump(*args)};
  const size_t nl = after.find('\n');
  if (nl == std::string_view::npos) return std::nullopt;
  const std::string_view name = trim(after.substr(0, nl));
  std::string_view rest = trim(after.substr(nl + 1));
  if (rest.substr(0, 3) == "```") {
    rest.remove_prefix(3);
    if (rest.substr(0, 4) == "json") rest.remove_prefix(4);
    rest = trim(rest);
    if (rest.size() >= 3 && rest.substr(rest.size() - 3) == "```") rest.remove_suffix(3);
  }
  auto args = parse_json(rest);
  if (!args || !args->is_object() || !valid_name(name)) return std::nullopt;
  return ToolCall{"", std::string(name), dump(*args)};
}

std::string random_alnum(size_t n) {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kChars) - 2);
  std::string s(n, ' ');
  for (char& c : s) c = kChars[pick(rng)];
  return s;
}

}  // namespace

Result<ToolCallFormat> parse_tool_call_format(std::string_view name) {
  if (name == "none") return ToolCallFormat::kNone;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "mistral") return ToolCallFormat::kMistral;
  if (name == "deepseek_v3") return ToolCallFormat::kDeepSeekV3;
  return invalid_argument(
      "--tool-call-parser must be auto, llama3_json, hermes, mistral, deepseek_v3 or none, got '" +
      std::string(name) + "'");
}

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

ToolCallFormat detect_tool_call_format(std::string_view t) {
  auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has(kDsCallsBegin)) return ToolCallFormat::kDeepSeekV3;
  if (has(kMistralStart)) return ToolCallFormat::kMistral;
  // Qwen3-Coder writes XML inside <tool_call> (<function=name><parameter=...>), not JSON.
  if (has(kHermesStart)) return has("<function=") ? ToolCallFormat::kNone : ToolCallFormat::kHermes;
  if (has(kPythonTag) || (has("<|start_header_id|>") && has("\"parameters\": ")))
    return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kNone;
}

std::vector<std::string_view> tool_call_markers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      return {kPythonTag};
    case ToolCallFormat::kHermes:
      return {kHermesStart, kHermesEnd};
    case ToolCallFormat::kMistral:
      return {kMistralStart, kMistralArgs};
    case ToolCallFormat::kDeepSeekV3:
      return {kDsCallsBegin, kDsCallsEnd, kDsCallBegin, kDsCallEnd, kDsSep};
    case ToolCallFormat::kNone:
      break;
  }
  return {};
}

std::string new_tool_call_id(ToolCallFormat format) {
  if (format == ToolCallFormat::kMistral) return random_alnum(9);
  return "call_" + random_alnum(24);
}

ToolCallParser::ToolCallParser(ToolCallFormat format) : format_(format) {}

ToolCallParser ToolCallParser::forced(std::optional<std::string> function_name) {
  ToolCallParser p(ToolCallFormat::kNone);
  p.forced_ = true;
  p.forced_name_ = std::move(function_name);
  return p;
}

void ToolCallParser::emit(Piece& out, std::string_view text) {
  for (char c : text) {
    if (c == '\n') {
      line_blank_ = true;
    } else if (!is_ws(c)) {
      line_blank_ = false;
    }
  }
  if (after_call_) {
    const size_t b = skip_ws(text, 0);
    if (b == text.size()) return;  // whitespace after a call: dropped
    text.remove_prefix(b);
    after_call_ = false;
    ws_ = std::move(gap_ws_);  // text after calls: the whitespace before them separates it
    gap_ws_.clear();
  }
  size_t e = text.size();
  while (e > 0 && is_ws(text[e - 1])) --e;
  if (e == 0) {
    ws_.append(text);
    return;
  }
  out.content += ws_;
  ws_.clear();
  out.content.append(text.substr(0, e));
  ws_.append(text.substr(e));
}

void ToolCallParser::add_calls(Piece& out, std::vector<ToolCall>& calls) {
  for (ToolCall& c : calls) {
    c.id = new_tool_call_id(format_);
    out.calls.push_back(std::move(c));
    ++n_calls_;
  }
  if (!after_call_) gap_ws_ = std::move(call_ws_);  // the first call of a run
  call_ws_.clear();
  after_call_ = true;
  line_blank_ = true;
}

size_t ToolCallParser::find_start(bool final, size_t& hold) const {
  hold = 0;
  std::string_view p = pending_;
  std::string_view marker;
  switch (format_) {
    case ToolCallFormat::kHermes:
      marker = kHermesStart;
      break;
    case ToolCallFormat::kMistral:
      marker = kMistralStart;
      break;
    case ToolCallFormat::kDeepSeekV3:
      marker = kDsCallsBegin;
      break;
    case ToolCallFormat::kLlama3Json:
      marker = kPythonTag;
      break;
    case ToolCallFormat::kNone:
      return std::string_view::npos;
  }
  size_t start = p.find(marker);
  if (format_ == ToolCallFormat::kLlama3Json) {
    // A '{' opening a JSON object ('{' then a key) where only whitespace precedes it on its line.
    bool blank = line_blank_;
    for (size_t i = 0; i < p.size() && i < start; ++i) {
      const char c = p[i];
      if (c == '\n') {
        blank = true;
      } else if (c == '{' && blank) {
        const size_t j = skip_ws(p, i + 1);
        if (j == p.size()) {  // undecided until the next non-space character
          if (!final) hold = p.size() - i;
          return std::string_view::npos;
        }
        if (p[j] == '"') return i;
        blank = false;
      } else if (!is_ws(c)) {
        blank = false;
      }
    }
  }
  if (start == std::string_view::npos && !final) hold = partial_marker(p, marker);
  return start;
}

ToolCallParser::Match ToolCallParser::match_call(bool final) const {
  const std::string_view p = pending_;
  Match m;
  auto need_more = [&](size_t if_final) {
    // Undecided: wait, unless the text has ended, when what came so far is content.
    if (final) {
      m.kind = Match::kNotCall;
      m.consumed = if_final;
    }
    return m;
  };
  auto result = [&](std::optional<ToolCall> call, size_t consumed) {
    m.consumed = consumed;
    if (call) {
      m.kind = Match::kCalls;
      m.calls.push_back(std::move(*call));
    } else {
      m.kind = Match::kNotCall;
    }
    return m;
  };
  switch (format_) {
    case ToolCallFormat::kHermes: {
      const size_t end = p.find(kHermesEnd, kHermesStart.size());
      if (end == std::string_view::npos) {
        if (!final) return m;
        return result(call_from_json_text(p.substr(kHermesStart.size())), p.size());
      }
      return result(call_from_json_text(p.substr(kHermesStart.size(), end - kHermesStart.size())),
                    end + kHermesEnd.size());
    }
    case ToolCallFormat::kLlama3Json: {
      size_t i = 0;
      if (p.substr(0, kPythonTag.size()) == kPythonTag) {
        i = skip_ws(p, kPythonTag.size());
        if (i == p.size()) return need_more(p.size());
        if (p[i] != '{') return result(std::nullopt, kPythonTag.size());
      }
      const size_t end = json_value_end(p, i);
      if (end == kIncomplete) return need_more(p.size());
      if (end == kTooDeep) return result(std::nullopt, i + 1);
      return result(call_from_json_text(p.substr(i, end - i)), end);
    }
    case ToolCallFormat::kMistral: {
      size_t i = skip_ws(p, kMistralStart.size());
      if (i == p.size()) return need_more(p.size());
      if (p[i] == '[' || p[i] == '{') {  // before v11: one JSON array (or object) of calls
        const size_t end = json_value_end(p, i);
        if (end == kIncomplete) return need_more(p.size());
        if (end == kTooDeep) return result(std::nullopt, kMistralStart.size());
        m.consumed = end;
        m.kind = Match::kNotCall;
        auto j = parse_json(p.substr(i, end - i));
        if (!j) return m;
        if (j->is_object()) return result(call_from_object(*j), end);
        if (!j->is_array() || j->empty()) return m;
        std::vector<ToolCall> calls;
        for (const Json& item : *j) {
          auto c = call_from_object(item);
          if (!c) return m;  // one bad call spoils the array: all of it stays content
          calls.push_back(std::move(*c));
        }
        m.kind = Match::kCalls;
        m.calls = std::move(calls);
        return m;
      }
      // v11: name[ARGS]{...} ([ARGS] is absent where the tokenizer skipped it as special).
      size_t j = i;
      while (j < p.size() && name_char(p[j])) ++j;
      const std::string_view name = p.substr(i, j - i);
      size_t k = skip_ws(p, j);
      if (k == p.size()) return need_more(p.size());
      if (p.substr(k, kMistralArgs.size()) == kMistralArgs) {
        k = skip_ws(p, k + kMistralArgs.size());
      } else if (may_become(p.substr(k), kMistralArgs)) {
        return need_more(p.size());
      }
      if (k == p.size()) return need_more(p.size());
      if (name.empty() || p[k] != '{') return result(std::nullopt, kMistralStart.size());
      const size_t end = json_value_end(p, k);
      if (end == kIncomplete) return need_more(p.size());
      if (end == kTooDeep) return result(std::nullopt, kMistralStart.size());
      auto args = parse_json(p.substr(k, end - k));
      if (!args || !args->is_object()) return result(std::nullopt, end);
      return result(ToolCall{"", std::string(name), dump(*args)}, end);
    }
    case ToolCallFormat::kDeepSeekV3:  // handled by scan_block
    case ToolCallFormat::kNone:
      break;
  }
  return result(std::nullopt, p.size());
}

bool ToolCallParser::scan_text(Piece& out, bool final) {
  if (after_call_ && format_ == ToolCallFormat::kLlama3Json) {
    // Between llama3_json calls: separators (';' and whitespace), dropped.
    size_t k = 0;
    while (k < pending_.size() && (is_ws(pending_[k]) || pending_[k] == ';')) ++k;
    pending_.erase(0, k);
    if (pending_.empty()) return false;
  }
  size_t hold = 0;
  const size_t start = find_start(final, hold);
  if (start == std::string::npos) {
    const size_t n = pending_.size() - hold;
    emit(out, std::string_view(pending_).substr(0, n));
    pending_.erase(0, n);
    return false;
  }
  emit(out, std::string_view(pending_).substr(0, start));
  pending_.erase(0, start);
  call_ws_ = std::move(ws_);  // content if this is not a call after all
  ws_.clear();
  if (format_ == ToolCallFormat::kDeepSeekV3) {
    block_raw_ = kDsCallsBegin;
    pending_.erase(0, kDsCallsBegin.size());
    block_has_call_ = false;
    state_ = State::kBlock;
  } else {
    state_ = State::kCall;
  }
  return true;
}

bool ToolCallParser::scan_block(Piece& out, bool final) {
  const size_t i = skip_ws(pending_, 0);
  if (i == pending_.size() && !final) return false;
  const std::string_view rest = std::string_view(pending_).substr(i);
  if (rest.substr(0, kDsCallBegin.size()) == kDsCallBegin) {
    const size_t body = i + kDsCallBegin.size();
    const size_t end = pending_.find(kDsCallEnd, body);
    if (end == std::string::npos && !final) return false;
    const size_t body_end = end == std::string::npos ? pending_.size() : end;
    const size_t consumed = end == std::string::npos ? pending_.size() : end + kDsCallEnd.size();
    auto call = deepseek_call(std::string_view(pending_).substr(body, body_end - body));
    if (call) {
      std::vector<ToolCall> calls{std::move(*call)};
      add_calls(out, calls);
      block_raw_.clear();
      block_has_call_ = true;
    } else {
      const std::string raw = call_ws_ + block_raw_ + pending_.substr(0, consumed);
      call_ws_.clear();
      block_raw_.clear();
      emit(out, raw);
    }
    pending_.erase(0, consumed);
    return true;
  }
  if (rest.substr(0, kDsCallsEnd.size()) == kDsCallsEnd) {
    const size_t consumed = i + kDsCallsEnd.size();
    if (!block_has_call_) emit(out, call_ws_ + block_raw_ + pending_.substr(0, consumed));
    call_ws_.clear();
    block_raw_.clear();
    pending_.erase(0, consumed);
    state_ = State::kText;
    return true;
  }
  if (!final && !rest.empty() && (may_become(rest, kDsCallBegin) || may_become(rest, kDsCallsEnd)))
    return false;
  // Anything else ends the block; its start marker is content unless a call came of it.
  if (!block_has_call_) emit(out, call_ws_ + block_raw_);
  call_ws_.clear();
  block_raw_.clear();
  state_ = State::kText;
  return true;
}

void ToolCallParser::scan(Piece& out, bool final) {
  for (;;) {
    bool progressed = false;
    switch (state_) {
      case State::kText:
        progressed = scan_text(out, final);
        break;
      case State::kBlock:
        progressed = scan_block(out, final);
        break;
      case State::kCall: {
        Match m = match_call(final);
        if (m.kind == Match::kNeedMore) break;
        if (m.kind == Match::kCalls) {
          add_calls(out, m.calls);
        } else {
          const std::string raw = call_ws_ + pending_.substr(0, m.consumed);
          call_ws_.clear();
          emit(out, raw);
        }
        pending_.erase(0, m.consumed);
        state_ = State::kText;
        progressed = true;
        break;
      }
    }
    if (!progressed) return;
  }
}

ToolCallParser::Piece ToolCallParser::feed(std::string_view text) {
  Piece out;
  if (forced_) {
    pending_.append(text);
    return out;
  }
  if (format_ == ToolCallFormat::kNone) {
    out.content = text;
    return out;
  }
  pending_.append(text);
  scan(out, /*final=*/false);
  return out;
}

ToolCallParser::Piece ToolCallParser::finish() {
  Piece out;
  if (forced_) {
    // What the grammar let through; cut short (max_tokens), it may not parse: then it is content.
    const Json j = Json::parse(pending_, nullptr, false);
    if (forced_name_ && j.is_object()) {
      out.calls.push_back({new_tool_call_id(format_), *forced_name_, dump(j)});
    } else if (!forced_name_ && j.is_array()) {
      for (const Json& c : j) {
        if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) continue;
        const Json args = c.contains("parameters") ? c["parameters"] : Json::object();
        out.calls.push_back({new_tool_call_id(format_), c["name"].get<std::string>(), dump(args)});
      }
    }
    if (out.calls.empty()) out.content = std::move(pending_);
    n_calls_ += static_cast<int>(out.calls.size());
    pending_.clear();
    return out;
  }
  if (format_ == ToolCallFormat::kNone) return out;
  scan(out, /*final=*/true);
  out.content += ws_;  // whitespace that no call followed
  ws_.clear();
  gap_ws_.clear();  // the answer ended with calls
  return out;
}

ToolCallParser::Piece parse_tool_calls(ToolCallFormat format, std::string_view text) {
  ToolCallParser p(format);
  ToolCallParser::Piece out = p.feed(text);
  ToolCallParser::Piece rest = p.finish();
  out.content += rest.content;
  for (ToolCall& c : rest.calls) out.calls.push_back(std::move(c));
  return out;
}

}  // namespace pagellm::server
