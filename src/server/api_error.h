// Errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}, with the HTTP
// status they go out with. Shared by the transport (limits, timeouts) and the API handlers.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace pagellm::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type;   // "" -> derived from status (invalid_request_error, server_error, ...)
  std::string param;  // the request field at fault, "" -> null
  std::string code;   // "" -> null
};

ApiError bad_request(std::string message, std::string param = "");
// The HTTP status of an engine/tokenizer Status: invalid argument / out of range -> 400,
// not found -> 404, resource exhausted -> 429, unimplemented -> 400, aborted -> 503, else 500.
ApiError error_from_status(const Status& s, std::string param = "");

// {"error": {...}} as compact JSON.
std::string error_body(const ApiError& e);

}  // namespace pagellm::server
