// Minimal leveled logging to stderr. Level from PAGELLM_LOG_LEVEL (debug|info|warn|error), default
// info. Structured JSON lines with PAGELLM_LOG_FORMAT=json (the server sets request ids).
#pragma once

#include <cstdarg>
#include <cstddef>

namespace pagellm {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

enum class LogFormat { kText = 0, kJson = 1 };

void set_log_level(LogLevel level);
LogLevel log_level();
// kJson writes each line as one JSON object {"ts","level","msg"} (PAGELLM_LOG_FORMAT=json).
void set_log_format(LogFormat format);
LogFormat log_format();
// Writes one finished line (a trailing newline is added) to the log with a single write, so lines
// from several threads never interleave. For callers that format their own structured lines.
void log_write_line(const char* line, size_t size);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace pagellm

#define PAGELLM_LOG_DEBUG(...) ::pagellm::log_message(::pagellm::LogLevel::kDebug, __VA_ARGS__)
#define PAGELLM_LOG_INFO(...) ::pagellm::log_message(::pagellm::LogLevel::kInfo, __VA_ARGS__)
#define PAGELLM_LOG_WARN(...) ::pagellm::log_message(::pagellm::LogLevel::kWarn, __VA_ARGS__)
#define PAGELLM_LOG_ERROR(...) ::pagellm::log_message(::pagellm::LogLevel::kError, __VA_ARGS__)
