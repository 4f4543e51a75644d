// Tuning settings: the environment variables (PAGELLM_*) that choose between measured kernel
// paths, set a kernel's parameters, or turn on a diagnostic. They are not options of the program
// (those are flags: tools/, runtime/): they exist so that one binary can be measured both ways on
// a GPU (A/B runs), and so that tests can force a path the rule of the shapes would not pick at
// their sizes. A path whose other setting measured slower everywhere and that no test forces is
// deleted, not kept here.
//
// Every one is in the table of tuning.cpp and read through it: one place lists them all
// (docs/TUNING.md gives the measurement behind each default; tests/unit/core/tuning_test.cpp holds
// the two to the same names and defaults), a value is checked the same way everywhere, and a value
// that is set but not accepted is said in a warning and leaves the default, never half applied.
// Callers read a setting once and keep it in a function-local static.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// C++17: the CUDA sources include this too.
namespace pagellm::tuning {

enum class Kind {
  kSwitch,  // 0 or 1
  kInt,     // an integer that `valid` accepts
  kWords,   // words of `words`, one, or several joined by ',' where `list` is set
};

struct Setting {
  std::string_view name;
  Kind kind = Kind::kSwitch;
  int64_t fallback = 0;                 // kSwitch, kInt: the default
  bool (*valid)(int64_t) = nullptr;     // kInt: the values taken
  std::string_view fallback_words;      // kWords: the default
  std::vector<std::string_view> words;  // kWords: the words taken
  bool list = false;                    // kWords: a comma-separated list of them
  std::string_view what;                // what it changes, for the warning and the docs
};

// Every tuning setting, in the order of docs/TUNING.md.
const std::vector<Setting>& settings();
// The setting named `name`; a name not in the table is a programmer error (CHECK).
const Setting& setting(std::string_view name);

// The value of a kSwitch / kInt setting: the environment's when it is set and accepted, else the
// default (a value set but not accepted is logged as a warning naming the setting).
int64_t integer(std::string_view name);
// integer(name) for a setting whose default is a kernel's own constant: CHECKs that the table's
// default is `kernel_default`, so the two cannot drift apart.
int64_t integer(std::string_view name, int64_t kernel_default);
bool on(std::string_view name);
// The value of a kWords setting: as set when every word is accepted, else the default.
std::string words(std::string_view name);
// Whether the comma-separated `value` holds `word` as one of its words.
bool has_word(std::string_view value, std::string_view word);

}  // namespace pagellm::tuning
