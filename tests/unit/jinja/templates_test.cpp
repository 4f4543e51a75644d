// Published chat templates rendered over a set of conversations, compared byte for byte with what
// Python's jinja2 renders through transformers (tests/jinja/make_expected.py writes the expected
// files). A case where jinja2 raised must fail here too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "source_dir.h"
#include "tokenizer/jinja/template.h"

namespace pagellm::jinja {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const fs::path kDataDir = fs::path(test_source_dir()) / "tests/data/templates";

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(PublishedTemplates, MatchJinja2ByteForByte) {
  const Json manifest = Json::parse(read_file(kDataDir / "manifest.json"));
  int n_compared = 0;
  int n_errors = 0;
  for (const auto& [name, tokens] : manifest["templates"].items()) {
    const std::string source = read_file(kDataDir / (name + ".jinja"));
    ASSERT_FALSE(source.empty()) << name;
    auto tmpl = Template::parse(source);
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.status().to_string();
    for (const Json& c : manifest["cases"]) {
      const std::string case_name = c["name"].get<std::string>();
      SCOPED_TRACE(name + " / " + case_name);
      // The variables transformers passes: messages, tools, documents, add_generation_prompt,
      // the special tokens, then any extra kwargs.
      Json ctx = Json::object();
      ctx["messages"] = c["messages"];
      ctx["tools"] = c.contains("tools") ? c["tools"] : Json(nullptr);
      ctx["documents"] = nullptr;
      ctx["add_generation_prompt"] = c["add_generation_prompt"];
      for (const auto& [k, v] : tokens.items()) ctx[k] = v;
      if (c.contains("kwargs")) {
        for (const auto& [k, v] : c["kwargs"].items()) ctx[k] = v;
      }
      const fs::path txt = kDataDir / "expected" / (name + "__" + case_name + ".txt");
      const fs::path err = kDataDir / "expected" / (name + "__" + case_name + ".error");
      auto out = tmpl->render(ctx);
      if (fs::exists(txt)) {
        ASSERT_TRUE(out.ok()) << out.status().to_string();
        EXPECT_EQ(*out, read_file(txt));
        ++n_compared;
      } else {
        ASSERT_TRUE(fs::exists(err)) << "no expected file for this case";
        const std::string want = read_file(err);
        ASSERT_FALSE(out.ok()) << "jinja2 failed (" << want << ") but we rendered:\n" << *out;
        // raise_exception() messages must come through verbatim.
        const std::string prefix = "TemplateError: ";
        if (want.rfind(prefix, 0) == 0) {
          EXPECT_NE(out.status().message().find(want.substr(prefix.size())), std::string::npos)
              << out.status().message();
        }
        ++n_errors;
      }
    }
  }
  EXPECT_GE(n_compared, 100) << "too few rendered cases compared";
  EXPECT_GT(n_errors, 0);
  std::printf("compared %d rendered cases and %d error cases\n", n_compared, n_errors);
}

TEST(Constructs, MatchJinja2) {
  const Json data = Json::parse(read_file(kDataDir / "expected" / "constructs.json"));
  int n = 0;
  for (const Json& s : data["snippets"]) {
    const std::string src = s["template"].get<std::string>();
    SCOPED_TRACE(src);
    auto tmpl = Template::parse(src);
    Result<std::string> out = tmpl.ok() ? tmpl->render(data["context"]) : Result<std::string>(tmpl.status());
    if (s.contains("output")) {
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_EQ(*out, s["output"].get<std::string>());
    } else {
      EXPECT_FALSE(out.ok()) << "jinja2: " << s["error"].get<std::string>() << "\nours: " << *out;
    }
    ++n;
  }
  EXPECT_GE(n, 50);
}

}  // namespace
}  // namespace pagellm::jinja
