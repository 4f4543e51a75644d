#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <unistd.h>

namespace pagellm {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("PAGELLM_LOG_LEVEL");
  if (!v) return LogLevel::kInfo;
  if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(v, "error")) return LogLevel::kError;
  return LogLevel::kInfo;
}

LogFormat format_from_env() {
  const char* v = std::getenv("PAGELLM_LOG_FORMAT");
  return v && !std::strcmp(v, "json") ? LogFormat::kJson : LogFormat::kText;
}

std::atomic<int> g_level{static_cast<int>(level_from_env())};
std::atomic<int> g_format{static_cast<int>(format_from_env())};

// JSON string body of `s` (quotes not included); control characters escaped.
void append_json_escaped(std::string& out, const char* s) {
  for (; *s; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
}
std::mutex g_mu;

}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }
void set_log_format(LogFormat format) { g_format = static_cast<int>(format); }
LogFormat log_format() { return static_cast<LogFormat>(g_format.load()); }

void log_write_line(const char* line, size_t size) {
  std::string buf(line, size);
  buf += '\n';
  std::lock_guard<std::mutex> lock(g_mu);
  size_t off = 0;
  while (off < buf.size()) {
    const ssize_t n = ::write(2, buf.data() + off, buf.size() - off);
    if (n <= 0) break;  // stderr closed: nothing better to do with a log line
    off += static_cast<size_t>(n);
  }
}

void log_message(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) < g_level.load()) return;
  static const char* kNames[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  if (log_format() == LogFormat::kJson) {
    static const char* kJsonNames[] = {"debug", "info", "warn", "error"};
    char head[96];
    std::snprintf(head, sizeof head, "{\"ts\":\"%s.%03dZ\",\"level\":\"%s\",\"msg\":\"", ts, ms,
                  kJsonNames[static_cast<int>(level)]);
    std::string line = head;
    append_json_escaped(line, msg);
    line += "\"}";
    log_write_line(line.data(), line.size());
    return;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "%s.%03dZ %s %s\n", ts, ms, kNames[static_cast<int>(level)], msg);
}

}  // namespace pagellm
