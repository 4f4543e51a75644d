// Request-scoped log lines. Text: "TS LEVEL [request_id] message k=v ...". JSON (--log-format
// json): one object per line {"ts", "level", "msg", "request_id", ...fields}. The format is
// core/log.h's log_format(), so engine and server lines agree.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "core/log.h"

namespace pagellm::server {

// `fields`: a JSON object of extra key/values (may be null).
void log_request(LogLevel level, std::string_view request_id, std::string_view message,
                 const nlohmann::ordered_json& fields = nullptr);

}  // namespace pagellm::server
