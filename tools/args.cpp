#include "tools/args.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace pagellm::cli {

Args::Args(std::string command, std::vector<std::string> spec) : command_(std::move(command)) {
  for (std::string& s : spec) {
    const bool is_flag = !s.empty() && s.back() == '!';
    if (is_flag) s.pop_back();
    spec_[s] = is_flag;
  }
}

std::string Args::env_name(const std::string& option) {
  std::string e = "PAGELLM_";
  for (char c : option) e += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return e;
}

Status Args::parse(int argc, char** argv) {
  // Environment first, so the command line overrides it.
  for (const auto& [name, is_flag] : spec_) {
    if (const char* v = std::getenv(env_name(name).c_str())) values_[name] = v;
  }
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.size() < 3 || a.rfind("--", 0) != 0) {
      positionals_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const auto eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto it = spec_.find(name);
    if (it == spec_.end()) return invalid_argument(command_ + ": unknown option --" + name);
    if (it->second) {  // boolean switch
      values_[name] = inline_value ? value : "1";
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc) return invalid_argument(command_ + ": option --" + name + " needs a value");
      value = argv[++i];
    }
    values_[name] = value;
  }
  return {};
}

bool Args::has(const std::string& name) const { return values_.count(name) > 0; }

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& name, const std::string& fallback) const {
  auto v = get(name);
  return v ? *v : fallback;
}

bool Args::flag(const std::string& name) const {
  auto v = get(name);
  return v && *v != "0" && *v != "false" && *v != "no";
}

Result<int64_t> Args::get_int(const std::string& name, int64_t fallback) const {
  auto v = get(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end || errno)
    return invalid_argument(command_ + ": --" + name + " expects an integer, got '" + *v + "'");
  return static_cast<int64_t>(x);
}

Result<double> Args::get_double(const std::string& name, double fallback) const {
  auto v = get(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end || errno)
    return invalid_argument(command_ + ": --" + name + " expects a number, got '" + *v + "'");
  return x;
}

Result<std::vector<int32_t>> Args::get_int_list(const std::string& name) const {
  std::vector<int32_t> out;
  auto v = get(name);
  if (!v) return out;
  size_t pos = 0;
  while (pos <= v->size()) {
    const size_t comma = v->find(',', pos);
    const std::string item = v->substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    errno = 0;
    char* end = nullptr;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end || errno || x < INT32_MIN || x > INT32_MAX)
      return invalid_argument(command_ + ": --" + name + " expects comma-separated integers, got '" +
                              *v + "'");
    out.push_back(static_cast<int32_t>(x));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::string Args::usage() const {
  std::string s = "usage: pagellm " + command_;
  for (const auto& [name, is_flag] : spec_) s += " [--" + name + (is_flag ? "]" : " V]");
  return s;
}

}  // namespace pagellm::cli
