// The tuning settings (core/tuning.h): each value is taken only when the table accepts it, any
// other leaves the default; and docs/TUNING.md lists exactly the table's settings with its
// defaults, so the page that says why each default is what it is cannot fall behind the code.
#include "core/tuning.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "scoped_env.h"
#include "source_dir.h"

namespace pagellm {
namespace {

TEST(Tuning, UnsetGivesTheDefault) {
  unsetenv("PAGELLM_STREAM_STAGES");
  unsetenv("PAGELLM_GEMV_FUSIONS");
  unsetenv("PAGELLM_ABLATE_OPS");
  EXPECT_EQ(tuning::integer("PAGELLM_STREAM_STAGES"), 3);
  EXPECT_TRUE(tuning::on("PAGELLM_STREAM_CHAIN"));
  EXPECT_FALSE(tuning::on("PAGELLM_CHAIN_TIMES"));
  EXPECT_EQ(tuning::words("PAGELLM_GEMV_FUSIONS"), "swiglu");
  EXPECT_EQ(tuning::words("PAGELLM_ABLATE_OPS"), "");
}

TEST(Tuning, AcceptedValuesAreTaken) {
  {
    ScopedEnv e("PAGELLM_MOE_GEMV_SPLIT", "4");
    EXPECT_EQ(tuning::integer("PAGELLM_MOE_GEMV_SPLIT"), 4);
  }
  {
    ScopedEnv e("PAGELLM_DECODE_MIN_CHUNK", "96");
    EXPECT_EQ(tuning::integer("PAGELLM_DECODE_MIN_CHUNK"), 96);
  }
  {
    ScopedEnv e("PAGELLM_STREAM_CHAIN", "0");
    EXPECT_FALSE(tuning::on("PAGELLM_STREAM_CHAIN"));
  }
  {
    ScopedEnv e("PAGELLM_GEMV_FUSIONS", "fold,swiglu");
    EXPECT_EQ(tuning::words("PAGELLM_GEMV_FUSIONS"), "fold,swiglu");
  }
  {
    ScopedEnv e("PAGELLM_CPU_ISA", "avx2");
    EXPECT_EQ(tuning::words("PAGELLM_CPU_ISA"), "avx2");
  }
  {
    ScopedEnv e("PAGELLM_ABLATE_OPS", "");  // an empty list: no op left out
    EXPECT_EQ(tuning::words("PAGELLM_ABLATE_OPS"), "");
  }
}

TEST(Tuning, RejectedValuesGiveTheDefault) {
  for (const char* bad : {"3", "-2", "abc", "", "4x", " 4", "99999999999999999999"}) {
    ScopedEnv e("PAGELLM_MOE_GEMV_SPLIT", bad);
    EXPECT_EQ(tuning::integer("PAGELLM_MOE_GEMV_SPLIT"), 0) << "value '" << bad << "'";
  }
  for (const char* bad : {"2", "-1", "yes", ""}) {
    ScopedEnv e("PAGELLM_STREAM_CHAIN", bad);
    EXPECT_TRUE(tuning::on("PAGELLM_STREAM_CHAIN")) << "value '" << bad << "'";
  }
  // A list with one unknown word is refused whole, never half applied.
  for (const char* bad : {"swiglu,norm", "fold,", "Swiglu", "norm"}) {
    ScopedEnv e("PAGELLM_GEMV_FUSIONS", bad);
    EXPECT_EQ(tuning::words("PAGELLM_GEMV_FUSIONS"), "swiglu") << "value '" << bad << "'";
  }
  {
    ScopedEnv e("PAGELLM_CPU_ISA", "avx2,none");  // one word, not a list
    EXPECT_EQ(tuning::words("PAGELLM_CPU_ISA"), "avx512");
  }
}

TEST(Tuning, HasWordMatchesWholeWords) {
  EXPECT_TRUE(tuning::has_word("fold,swiglu", "swiglu"));
  EXPECT_TRUE(tuning::has_word("matmul", "matmul"));
  EXPECT_FALSE(tuning::has_word("matmul_add", "matmul"));
  EXPECT_FALSE(tuning::has_word("", "matmul"));
}

TEST(Tuning, EveryDefaultIsAValueItTakes) {
  int n = 0;
  for (const tuning::Setting& s : tuning::settings()) {
    ++n;
    EXPECT_TRUE(s.name.rfind("PAGELLM_", 0) == 0) << s.name;
    EXPECT_FALSE(s.what.empty()) << s.name;
    switch (s.kind) {
      case tuning::Kind::kSwitch:
        EXPECT_TRUE(s.fallback == 0 || s.fallback == 1) << s.name;
        break;
      case tuning::Kind::kInt:
        ASSERT_NE(s.valid, nullptr) << s.name;
        EXPECT_TRUE(s.valid(s.fallback)) << s.name;
        break;
      case tuning::Kind::kWords: {
        std::string_view rest = s.fallback_words;
        while (!rest.empty()) {
          const size_t comma = rest.find(',');
          const std::string_view w = rest.substr(0, comma);
          EXPECT_NE(std::find(s.words.begin(), s.words.end(), w), s.words.end()) << s.name;
          rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        }
        break;
      }
    }
  }
  EXPECT_GT(n, 0);
}

// The default as docs/TUNING.md writes it in its second column.
std::string default_text(const tuning::Setting& s) {
  if (s.kind == tuning::Kind::kWords)
    return s.fallback_words.empty() ? "(empty)" : std::string(s.fallback_words);
  return std::to_string(s.fallback);
}

TEST(Tuning, TheDocsTableListsEverySettingWithItsDefault) {
  std::ifstream f(test_source_dir() + "/docs/TUNING.md");
  ASSERT_TRUE(f) << "docs/TUNING.md is missing";
  // Rows of the settings table: | `PAGELLM_NAME` | `default` | ...
  const std::regex row(R"(^\|\s*`(PAGELLM_[A-Z0-9_]+)`\s*\|\s*`([^`]*)`\s*\|)");
  std::map<std::string, std::string> documented;
  std::string line;
  while (std::getline(f, line)) {
    std::smatch m;
    if (std::regex_search(line, m, row)) {
      EXPECT_TRUE(documented.emplace(m[1].str(), m[2].str()).second)
          << m[1].str() << " has two rows in docs/TUNING.md";
    }
  }
  std::set<std::string> in_table;
  for (const tuning::Setting& s : tuning::settings()) {
    const std::string name(s.name);
    in_table.insert(name);
    const auto it = documented.find(name);
    if (it == documented.end()) {
      ADD_FAILURE() << name << " is read by the code but has no row in docs/TUNING.md";
      continue;
    }
    EXPECT_EQ(it->second, default_text(s))
        << name << ": docs/TUNING.md's default is not the code's";
  }
  for (const auto& [name, value] : documented)
    EXPECT_TRUE(in_table.count(name))
        << name << " has a row in docs/TUNING.md but no code reads it";
  EXPECT_EQ(documented.size(), tuning::settings().size());
}

}  // namespace
}  // namespace pagellm
