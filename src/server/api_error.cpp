#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace pagellm::server {
namespace {

std::string default_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

}  // namespace

ApiError bad_request(std::string message, std::string param) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError error_from_status(const Status& s, std::string param) {
  ApiError e;
  e.message = s.message();
  e.param = std::move(param);
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnimplemented: e.status = 400; break;
    case StatusCode::kNotFound: e.status = 404; break;
    case StatusCode::kResourceExhausted:
      e.status = 429;
      e.code = "rate_limit_exceeded";
      break;
    case StatusCode::kAborted: e.status = 503; break;
    default: e.status = 500; break;
  }
  return e;
}

std::string error_body(const ApiError& e) {
  nlohmann::ordered_json j;
  auto& err = j["error"];
  err["message"] = e.message;
  err["type"] = e.type.empty() ? default_type(e.status) : e.type;
  err["param"] = e.param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e.param);
  err["code"] = e.code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e.code);
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace pagellm::server
