// Minimal leveled logging to stderr. Level from PAGELLM_LOG_LEVEL (debug|info|warn|error), default
// info. Structured JSON lines with PAGELLM_LOG_FORMAT=json (the server sets request ids).
#pragma once

#include <cstdarg>

namespace pagellm {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace pagellm

#define PAGELLM_LOG_DEBUG(...) ::pagellm::log_message(::pagellm::LogLevel::kDebug, __VA_ARGS__)
#define PAGELLM_LOG_INFO(...) ::pagellm::log_message(::pagellm::LogLevel::kInfo, __VA_ARGS__)
#define PAGELLM_LOG_WARN(...) ::pagellm::log_message(::pagellm::LogLevel::kWarn, __VA_ARGS__)
#define PAGELLM_LOG_ERROR(...) ::pagellm::log_message(::pagellm::LogLevel::kError, __VA_ARGS__)
