// Status and Result<T>: errors that cross module boundaries. A Status carries a code and a one-line
// message that names the file, tensor or field at fault; CHECK (check.h) is for programmer errors.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace pagellm {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input from a user: request, flag, prompt
  kNotFound,         // a file, tensor or key that should exist does not
  kDataLoss,         // a corrupt or truncated file
  kUnimplemented,    // a config field or construct we refuse on purpose
  kOutOfRange,       // a token id, length or index beyond its bound
  kResourceExhausted,  // out of KV blocks, queue full, out of memory
  kInternal,
  kAborted,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: config.json: field 'rope_scaling.type' = 'foo' is not supported"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status data_loss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or an error. Minimal std::expected stand-in (C++23 is not available with g++ 12).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace pagellm

// Propagate an error Status from an expression returning Status.
#define PAGELLM_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::pagellm::Status _st = (expr);          \
    if (!_st.ok()) return _st;               \
  } while (0)

#define PAGELLM_CONCAT_INNER(a, b) a##b
#define PAGELLM_CONCAT(a, b) PAGELLM_CONCAT_INNER(a, b)
// `PAGELLM_ASSIGN_OR_RETURN(auto x, make_x());` binds the value or returns the error.
#define PAGELLM_ASSIGN_OR_RETURN(lhs, expr)                                  \
  auto PAGELLM_CONCAT(_res_, __LINE__) = (expr);                             \
  if (!PAGELLM_CONCAT(_res_, __LINE__).ok())                                 \
    return PAGELLM_CONCAT(_res_, __LINE__).status();                         \
  lhs = std::move(PAGELLM_CONCAT(_res_, __LINE__)).value()
