#include "server/server_log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

namespace pagellm::server {
namespace {

std::string timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char ts[40];
  const size_t n = std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(ts + n, sizeof ts - n, ".%03dZ", ms);
  return ts;
}

}  // namespace

void log_request(LogLevel level, std::string_view request_id, std::string_view message,
                 const nlohmann::ordered_json& fields) {
  if (static_cast<int>(level) < static_cast<int>(log_level())) return;
  static const char* kText[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  static const char* kJson[] = {"debug", "info", "warn", "error"};
  const int li = static_cast<int>(level);
  constexpr auto kReplace = nlohmann::ordered_json::error_handler_t::replace;
  std::string line;
  if (log_format() == LogFormat::kJson) {
    nlohmann::ordered_json j;
    j["ts"] = timestamp();
    j["level"] = kJson[li];
    j["msg"] = message;
    if (!request_id.empty()) j["request_id"] = request_id;
    if (fields.is_object())
      for (const auto& [k, v] : fields.items()) j[k] = v;
    line = j.dump(-1, ' ', false, kReplace);
  } else {
    line = timestamp();
    line += ' ';
    line += kText[li];
    if (!request_id.empty()) {
      line += " [";
      line += request_id;
      line += ']';
    }
    line += ' ';
    line += message;
    if (fields.is_object()) {
      for (const auto& [k, v] : fields.items()) {
        line += ' ';
        line += k;
        line += '=';
        line += v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, kReplace);
      }
    }
  }
  log_write_line(line.data(), line.size());
}

}  // namespace pagellm::server
