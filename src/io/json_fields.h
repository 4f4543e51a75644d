// Typed, checked access to the members of a JSON config object (config.json and the objects
// inside it, such as quantization_config), shared by the io/ parsers (internal to io/).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace pagellm::io_detail {

using json = nlohmann::json;

// What a JSON value is, for "must be X, got Y" messages (never dumps the value: it may be huge).
inline const char* kind_of(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an invalid value";
  }
}

inline std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Typed access to the members of one JSON object, with messages that name the file and the field
// by its dotted path ("rope_scaling.factor"). A member that is absent or null counts as unset, as
// transformers treats it: the out-parameter keeps its default.
class Fields {
 public:
  Fields(const json& obj, std::string path, std::string prefix = "")
      : obj_(obj), path_(std::move(path)), prefix_(std::move(prefix)) {}

  const json& object() const { return obj_; }
  const std::string& path() const { return path_; }
  std::string name(const std::string& key) const { return prefix_ + key; }

  // Present and not null.
  bool has(const std::string& key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }
  const json* get(const std::string& key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  Status error(StatusCode code, const std::string& key, const std::string& what) const {
    return Status(code, path_ + ": field '" + name(key) + "' " + what);
  }
  Status missing(const std::string& key) const {
    return error(StatusCode::kInvalidArgument, key, "is missing");
  }
  Status wrong_type(const std::string& key, const char* want, const json& got) const {
    return error(StatusCode::kInvalidArgument, key,
                 std::string("must be ") + want + ", got " + kind_of(got));
  }

  // Integer field (an integral float such as 4096.0 is accepted; writers sometimes emit those).
  Status read_int(const std::string& key, int64_t& out, bool required = false) const {
    const json* v = get(key);
    if (!v) return required ? missing(key) : Status::ok_status();
    std::optional<int64_t> i = to_int(*v);
    if (!i) return wrong_type(key, "an integer", *v);
    out = *i;
    return Status::ok_status();
  }
  Status read_opt_int(const std::string& key, std::optional<int64_t>& out) const {
    if (!has(key)) return Status::ok_status();
    int64_t v = 0;
    PAGELLM_RETURN_IF_ERROR(read_int(key, v));
    out = v;
    return Status::ok_status();
  }
  Status read_double(const std::string& key, double& out, bool required = false) const {
    const json* v = get(key);
    if (!v) return required ? missing(key) : Status::ok_status();
    if (!v->is_number()) return wrong_type(key, "a number", *v);
    const double d = v->get<double>();
    if (!std::isfinite(d)) return error(StatusCode::kInvalidArgument, key, "must be finite");
    out = d;
    return Status::ok_status();
  }
  Status read_opt_double(const std::string& key, std::optional<double>& out) const {
    if (!has(key)) return Status::ok_status();
    double v = 0;
    PAGELLM_RETURN_IF_ERROR(read_double(key, v));
    out = v;
    return Status::ok_status();
  }
  Status read_bool(const std::string& key, bool& out) const {
    const json* v = get(key);
    if (!v) return Status::ok_status();
    if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
    out = v->get<bool>();
    return Status::ok_status();
  }
  Status read_string(const std::string& key, std::string& out, bool required = false) const {
    const json* v = get(key);
    if (!v) return required ? missing(key) : Status::ok_status();
    if (!v->is_string()) return wrong_type(key, "a string", *v);
    out = v->get<std::string>();
    return Status::ok_status();
  }

  Status read_strings(const std::string& key, std::vector<std::string>& out) const {
    const json* v = get(key);
    if (!v) return Status::ok_status();
    if (!v->is_array()) return wrong_type(key, "a list of strings", *v);
    for (const json& e : *v) {
      if (!e.is_string()) return wrong_type(key, "a list of strings", e);
      out.push_back(e.get<std::string>());
    }
    return Status::ok_status();
  }

  // Range checks on values already read.
  Status check_positive(const std::string& key, int64_t v, int64_t max) const {
    if (v <= 0 || v > max) {
      return error(StatusCode::kInvalidArgument, key,
                   "= " + std::to_string(v) + " is out of range (1.." + std::to_string(max) + ")");
    }
    return Status::ok_status();
  }
  Status check_positive(const std::string& key, double v) const {
    if (!(v > 0))
      return error(StatusCode::kInvalidArgument, key, "= " + fmt_double(v) + " must be positive");
    return Status::ok_status();
  }

  static std::optional<int64_t> to_int(const json& v) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      // 2^63 is the first double past int64's range.
      if (std::isfinite(d) && d == std::floor(d) && d >= -9.2233720368547758e18 &&
          d < 9.2233720368547758e18) {
        return static_cast<int64_t>(d);
      }
    }
    return std::nullopt;
  }

 private:
  const json& obj_;
  std::string path_;
  std::string prefix_;
};

}  // namespace pagellm::io_detail
