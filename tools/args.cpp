#include "tools/args.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace pagellm::cli {
namespace {

const Option kConfigOption{"config", "FILE",
                           "read options from a YAML or JSON file: a map of option names (as "
                           "here, without the dashes) to values, e.g. `kv-cache-memory: 8GiB`; "
                           "the command line and the environment win over it"};
const Option kHelpOption{"help", "", "print this help and exit"};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Switch values: what a person or a YAML file writes for on and off.
std::optional<bool> parse_switch(const std::string& v) {
  const std::string l = lower(v);
  if (l == "1" || l == "true" || l == "yes" || l == "on") return true;
  if (l == "0" || l == "false" || l == "no" || l == "off") return false;
  return std::nullopt;
}

// Appends `text` to `out`, wrapped at `width` columns, every line after the first indented by
// `indent` spaces; `col` is the column `out`'s last line ends at.
void wrap(std::string& out, const std::string& text, size_t col, size_t indent,
          size_t width = 100) {
  std::istringstream words(text);
  std::string w;
  bool first = true;
  while (words >> w) {
    if (!first && col + 1 + w.size() > width) {
      out += "\n" + std::string(indent, ' ');
      col = indent;
    } else if (!first) {
      out += ' ';
      ++col;
    }
    out += w;
    col += w.size();
    first = false;
  }
}

}  // namespace

Result<int64_t> parse_bytes(const std::string& what, const std::string& text) {
  const auto bad = [&] {
    return invalid_argument(
        what + " expects a byte count such as 8GiB, 512MB or 1073741824, got '" + text + "'");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return bad();
  errno = 0;
  char* end = nullptr;
  const std::string number = text.substr(0, i);
  const double x = std::strtod(number.c_str(), &end);
  if (*end || errno || !std::isfinite(x)) return bad();
  std::string unit = lower(text.substr(i));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  if (!unit.empty() && unit.back() == 'b') unit.pop_back();
  double scale = 1;
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},           {"k", 1e3},           {"m", 1e6},
      {"g", 1e9},        {"t", 1e12},          {"ki", 1024.0},
      {"mi", 1048576.0}, {"gi", 1073741824.0}, {"ti", 1099511627776.0}};
  bool known = false;
  for (const auto& [name, s] : kUnits) {
    if (unit == name) {
      scale = s;
      known = true;
    }
  }
  if (!known) return bad();
  const double bytes = x * scale;
  if (bytes > 9.2e18) return bad();
  // A fraction of a byte ("0.5B") makes no sense; a fraction of a unit ("1.5GiB") does.
  if (scale == 1 && number.find('.') != std::string::npos) return bad();
  return static_cast<int64_t>(std::llround(bytes));
}

Args::Args(std::string command, std::string about, std::vector<OptionGroup> groups)
    : command_(std::move(command)), about_(std::move(about)), groups_(std::move(groups)) {
  groups_.push_back({"General", {kConfigOption, kHelpOption}});
}

std::string Args::env_name(const std::string& option) {
  std::string e = "PAGELLM_";
  for (char c : option) e += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return e;
}

const Option* Args::find(const std::string& name) const {
  for (const OptionGroup& g : groups_)
    for (const Option& o : g.options)
      if (o.name == name) return &o;
  return nullptr;
}

std::string Args::closest(const std::string& name) const {
  std::string best;
  size_t best_d = std::max<size_t>(2, name.size() / 3) + 1;
  for (const OptionGroup& g : groups_) {
    for (const Option& o : g.options) {
      const size_t d = edit_distance(name, o.name);
      // A prefix ("--kv-cache" for "--kv-cache-memory") is as good a hint as a typo.
      const bool prefix = o.name.rfind(name, 0) == 0 && name.size() >= 3;
      if (d < best_d || (prefix && best.empty())) {
        best = o.name;
        best_d = prefix ? 0 : d;
      }
    }
  }
  return best;
}

Status Args::check_value(const Option& o, const std::string& value) const {
  if (o.metavar.empty() && !parse_switch(value))
    return invalid_argument(command_ + ": --" + o.name +
                            " is a switch: expects true or false, got '" + value + "'");
  return {};
}

Status Args::set_value(const Option& o, const std::string& value, const std::string& source) {
  if (Status s = check_value(o, value); !s.ok())
    return invalid_argument(s.message() + (source.empty() ? "" : " (" + source + ")"));
  values_[o.name] = value;
  return {};
}

Status Args::load_config_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return not_found(command_ + ": --config " + path + ": cannot open the file");
  YAML::Node root;
  try {
    root = YAML::Load(f);
  } catch (const YAML::Exception& e) {
    return invalid_argument(command_ + ": --config " + path + ": not YAML or JSON: " + e.what());
  }
  if (root.IsNull()) return {};  // an empty file sets nothing
  if (!root.IsMap())
    return invalid_argument(command_ + ": --config " + path +
                            ": expected a map of option names to values at the top level");
  const std::string where = "in " + path;
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    // YAML files often spell keys with underscores; both name the same option.
    std::replace(key.begin(), key.end(), '_', '-');
    const Option* o = find(key);
    if (!o || o->name == "config" || o->name == "help") {
      const std::string hint = o ? "" : closest(key);
      return invalid_argument(command_ + ": " + path + ": unknown key '" +
                              kv.first.as<std::string>() + "'" +
                              (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
    }
    const YAML::Node& v = kv.second;
    std::string value;
    if (v.IsScalar()) {
      value = v.as<std::string>();
    } else if (v.IsSequence()) {  // lists of numbers: sweep-rate: [2, 8, 20]
      for (const auto& item : v) {
        if (!item.IsScalar())
          return invalid_argument(command_ + ": " + path + ": '" + key +
                                  "' must be a list of values");
        value += (value.empty() ? "" : ",") + item.as<std::string>();
      }
    } else {
      return invalid_argument(command_ + ": " + path + ": '" + key + "' needs a value" +
                              (v.IsMap() ? ", not a map" : ""));
    }
    if (Status s = set_value(*o, value, where); !s.ok()) return s;
  }
  return {};
}

Status Args::parse(int argc, char** argv) {
  // The command line first, kept aside: it wins, but --config may name the file to read first.
  std::map<std::string, std::string> given;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h") a = "--help";
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
    const Option* o = find(name);
    if (!o) {
      const std::string hint = closest(name);
      return invalid_argument(command_ + ": unknown option --" + name +
                              (hint.empty() ? "" : " (did you mean --" + hint + "?)") +
                              "; see pagellm " + command_ + " --help");
    }
    if (o->metavar.empty()) {
      if (Status s = check_value(*o, inline_value ? value : "1"); !s.ok()) return s;
      given[name] = inline_value ? value : "1";
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc)
        return invalid_argument(command_ + ": option --" + name + " needs a value (" + o->metavar +
                                ")");
      value = argv[++i];
    }
    given[name] = value;
  }
  if (auto h = given.find("help"); h != given.end() && parse_switch(h->second).value_or(false)) {
    help_requested_ = true;
    return {};
  }

  // 3. The file, then 2. the environment over it, then 1. the command line over both.
  std::optional<std::string> config_path;
  if (auto c = given.find("config"); c != given.end())
    config_path = c->second;
  else if (const char* e = std::getenv(env_name("config").c_str()))
    config_path = e;
  if (config_path) {
    if (Status s = load_config_file(*config_path); !s.ok()) return s;
  }
  for (const OptionGroup& g : groups_) {
    for (const Option& o : g.options) {
      if (o.name == "help" || o.name == "config") continue;
      std::vector<std::string> names = {env_name(o.name)};
      names.insert(names.end(), o.env_aliases.begin(), o.env_aliases.end());
      for (const std::string& n : names) {
        if (const char* v = std::getenv(n.c_str())) {
          if (Status s = set_value(o, v, "environment variable " + n); !s.ok()) return s;
          break;
        }
      }
    }
  }
  for (const auto& [name, value] : given) values_[name] = value;
  values_.erase("help");
  values_.erase("config");
  return {};
}

bool Args::has(const std::string& name) const {
  return values_.count(name) > 0;
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  const Option* o = find(name);
  return o ? o->default_value : std::nullopt;
}

std::string Args::str(const std::string& name) const {
  return get(name).value_or("");
}

bool Args::flag(const std::string& name) const {
  auto v = get(name);
  return v && parse_switch(*v).value_or(false);
}

Result<int64_t> Args::parse_int(const std::string& name, const std::string& v) const {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || errno)
    return invalid_argument(command_ + ": --" + name + " expects an integer, got '" + v + "'");
  return static_cast<int64_t>(x);
}

Result<int64_t> Args::get_int(const std::string& name) const {
  auto v = get(name);
  if (!v) return invalid_argument(command_ + ": --" + name + " is required");
  return parse_int(name, *v);
}

Result<double> Args::get_double(const std::string& name) const {
  auto v = get(name);
  if (!v) return invalid_argument(command_ + ": --" + name + " is required");
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end || errno || !std::isfinite(x))
    return invalid_argument(command_ + ": --" + name + " expects a number, got '" + *v + "'");
  return x;
}

Result<int64_t> Args::get_bytes(const std::string& name) const {
  auto v = get(name);
  if (!v) return invalid_argument(command_ + ": --" + name + " is required");
  return parse_bytes(command_ + ": --" + name, *v);
}

Result<std::vector<int32_t>> Args::get_int_list(const std::string& name) const {
  std::vector<int32_t> out;
  auto v = get(name);
  if (!v) return out;
  size_t pos = 0;
  while (pos <= v->size()) {
    const size_t comma = v->find(',', pos);
    const std::string item =
        v->substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    auto x = parse_int(name, item);
    if (!x.ok() || *x < INT32_MIN || *x > INT32_MAX)
      return invalid_argument(command_ + ": --" + name +
                              " expects comma-separated integers, got '" + *v + "'");
    out.push_back(static_cast<int32_t>(*x));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

std::optional<int> parse_command_line(Args& a, int argc, char** argv) {
  if (Status s = a.parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "pagellm %s: %s\n", a.command().c_str(), s.message().c_str());
    return 1;
  }
  if (a.help_requested()) {
    std::fputs(a.help().c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

std::string Args::help() const {
  std::string s = "usage: pagellm " + command_ + " [options]" + "\n\n";
  // The about text keeps its own line breaks (examples, lists); each paragraph is as written.
  if (!about_.empty()) s += about_ + (about_.back() == '\n' ? "" : "\n");
  s += "\nEvery option can also be set by the environment variable shown, or in a --config file;\n"
       "the command line wins over the environment, the environment over the file.\n";
  constexpr size_t kHelpColumn = 30;
  for (const OptionGroup& g : groups_) {
    if (g.options.empty()) continue;
    s += "\n" + g.title + ":\n";
    for (const Option& o : g.options) {
      std::string head = "  --" + o.name + (o.metavar.empty() ? "" : " " + o.metavar);
      s += head;
      if (head.size() + 2 > kHelpColumn) {
        s += "\n" + std::string(kHelpColumn, ' ');
      } else {
        s += std::string(kHelpColumn - head.size(), ' ');
      }
      std::string text = o.help;
      if (o.default_value && !o.default_value->empty() && !o.metavar.empty())
        text += " [default: " + *o.default_value +
                (o.default_note.empty() ? "" : "; " + o.default_note) + "]";
      else if (!o.default_note.empty())
        text += " [default: " + o.default_note + "]";
      if (o.name != "help") {
        // '\x1f' joins "[env:" to the first name, so a line never ends with a bare "[env:".
        text += " [env:\x1f" + env_name(o.name);
        for (const std::string& e : o.env_aliases) text += ", " + e;
        text += "]";
      }
      const size_t at = s.size();
      wrap(s, text, kHelpColumn, kHelpColumn);
      std::replace(s.begin() + static_cast<std::ptrdiff_t>(at), s.end(), '\x1f', ' ');
      s += "\n";
    }
  }
  return s;
}

}  // namespace pagellm::cli
