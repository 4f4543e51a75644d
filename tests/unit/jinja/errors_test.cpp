// Failure paths and limits of the template engine, and the chat-template loader. Every bad input
// must come back as a Status naming the problem (with line:col where there is one), never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tokenizer/jinja/chat_template.h"
#include "tokenizer/jinja/template.h"

namespace pagellm::jinja {
namespace {

using Json = nlohmann::ordered_json;

Result<std::string> render(const std::string& src, const Json& ctx = Json::object(), const RenderLimits& lim = {}) {
  auto t = Template::parse(src);
  if (!t.ok()) return t.status();
  return t->render(ctx, lim);
}

void expect_error(const std::string& src, StatusCode code, const std::string& needle, const Json& ctx = Json::object(),
                  const RenderLimits& lim = {}) {
  auto r = render(src, ctx, lim);
  ASSERT_FALSE(r.ok()) << src.substr(0, 200) << " rendered: " << r->substr(0, 200);
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << "'" << needle << "' not in: " << r.status().message();
}

TEST(Errors, SyntaxErrorsCarryLineAndColumn) {
  expect_error("line one\n{{ 1 +* 2 }}", StatusCode::kInvalidArgument, "line 2, column 7: unexpected '*'");
  expect_error("{% for x in y %}", StatusCode::kInvalidArgument, "expected 'endfor' or 'else'");
  expect_error("{% if x %}{% endfor %}", StatusCode::kInvalidArgument, "unknown tag 'endfor'");
  expect_error("{{ 'abc }}", StatusCode::kInvalidArgument, "line 1, column 4");
  expect_error("{# open comment", StatusCode::kInvalidArgument, "Missing end of comment tag");
  expect_error("{{ x", StatusCode::kInvalidArgument, "unexpected end of template");
  expect_error("{{ (1, 2 }}", StatusCode::kInvalidArgument, "unexpected '}'");
  expect_error("{% break %}", StatusCode::kInvalidArgument, "outside of a loop");
}

TEST(Errors, UnknownNamesAndUnsupportedConstructs) {
  expect_error("{{ x|nosuch }}", StatusCode::kInvalidArgument, "No filter named 'nosuch'");
  expect_error("{% if x is nosuch %}{% endif %}", StatusCode::kInvalidArgument, "No test named 'nosuch'");
  expect_error("{% include 'a.jinja' %}", StatusCode::kInvalidArgument, "'include' tag is not supported");
  expect_error("{% extends 'a' %}", StatusCode::kInvalidArgument, "not supported");
  expect_error("{% for x in y recursive %}{% endfor %}", StatusCode::kInvalidArgument, "recursive");
  expect_error("{{ f(*args) }}", StatusCode::kInvalidArgument, "not supported");
}

TEST(Errors, RuntimeErrors) {
  expect_error("{{ raise_exception('Roles must alternate') }}", StatusCode::kInvalidArgument,
               "raised an exception: Roles must alternate");
  expect_error("{{ x.y }}", StatusCode::kInvalidArgument, "'x' is undefined");
  expect_error("{{ x + 1 }}", StatusCode::kInvalidArgument, "'x' is undefined");
  expect_error("{{ 1 + 'a' }}", StatusCode::kInvalidArgument, "unsupported operand");
  expect_error("{{ 1 / 0 }}", StatusCode::kInvalidArgument, "division by zero");
  expect_error("{{ [1].append(2) }}", StatusCode::kInvalidArgument, "unsafe");
  expect_error("{% set a, b = [1] %}", StatusCode::kInvalidArgument, "not enough values to unpack");
  expect_error("{% set x = 1 %}{% set x.y = 2 %}", StatusCode::kInvalidArgument, "non-namespace");
  expect_error("{{ x|tojson }}", StatusCode::kInvalidArgument, "not JSON serializable");
  expect_error("{{ 'a' < 1 }}", StatusCode::kInvalidArgument, "'<' not supported");
  expect_error("{% for c in 5 %}{% endfor %}", StatusCode::kInvalidArgument, "not iterable");
  expect_error("{{ 2 ** 64 }}", StatusCode::kInvalidArgument, "integer overflow");
  expect_error("{{ none() }}", StatusCode::kInvalidArgument, "not callable");
  // Undefined is falsy and prints empty: no error.
  auto r = render("[{{ x }}{% if x %}t{% endif %}{{ x|length }}{{ x|default('d') }}]");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "[0d]");
}

TEST(Limits, HostileTemplatesAreStopped) {
  RenderLimits lim;
  lim.max_steps = 200000;
  lim.max_output_bytes = 1 << 16;
  expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
               StatusCode::kResourceExhausted, "step", Json::object(), lim);
  expect_error("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}", StatusCode::kResourceExhausted, "output exceeds",
               Json::object(), lim);
  expect_error("{{ 'x' * 1000000000000 }}", StatusCode::kResourceExhausted, "output exceeds", Json::object(), lim);
  expect_error("{{ range(1000000) }}", StatusCode::kInvalidArgument, "Range too big");
  expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", StatusCode::kResourceExhausted,
               "nested deeper");
  expect_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", StatusCode::kInvalidArgument,
               "nested too deeply");
  expect_error("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}", StatusCode::kInvalidArgument,
               "nested too deeply");
  // A namespace that holds itself, and a list nested through it, neither leaks nor recurses.
  expect_error("{% set ns = namespace() %}{% set ns.me = ns %}{% for i in range(300) %}{% set ns.l = [ns.l] %}{% endfor %}",
               StatusCode::kInvalidArgument, "nesting deeper");
  auto r = render("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns.self.self.a }}");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "1");
}

TEST(Context, KeyOrderSurvivesTojsonAndIteration) {
  const Json ctx = Json::parse(R"({"tool": {"zeta": 1, "alpha": {"y": 2, "b": [1.5, null, true]}}})");
  auto r = render("{{ tool|tojson }}|{% for k in tool %}{{ k }},{% endfor %}|{{ tool|tojson(sort_keys=true) }}", ctx);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r,
            R"({"zeta": 1, "alpha": {"y": 2, "b": [1.5, null, true]}}|zeta,alpha,|{"alpha": {"b": [1.5, null, true], "y": 2}, "zeta": 1})");
}

TEST(Context, RejectsNonObject) {
  auto t = Template::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->render(Json::array()).ok());
  EXPECT_FALSE(Template::parse(std::string("{{ '\xff' }}")).ok());  // not UTF-8
}

}  // namespace
}  // namespace pagellm::jinja

namespace pagellm {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("pagellm_jinja_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

TEST(ChatTemplateLoader, TokenizerConfigStringTemplate) {
  const fs::path dir = temp_dir("string");
  write(dir / "tokenizer_config.json",
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}"})");
  auto src = load_chat_template(dir.string());
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->bos_token, "<s>");
  auto ct = ChatTemplate::create(*src);
  ASSERT_TRUE(ct.ok()) << ct.status().to_string();
  ChatRequest req;
  req.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  req.add_generation_prompt = true;
  auto out = ct->apply(req);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, "<s>[user:hi]></s>");
  fs::remove_all(dir);
}

TEST(ChatTemplateLoader, NamedTemplatesAndJinjaFile) {
  const fs::path dir = temp_dir("named");
  write(dir / "tokenizer_config.json",
        R"({"eos_token": "E", "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D{{ eos_token }}"}]})");
  auto src = load_chat_template(dir.string());
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ(src->source, "D{{ eos_token }}");
  // chat_template.jinja wins over the config's field, as in transformers.
  write(dir / "chat_template.jinja", "J{{ eos_token }}\n");
  src = load_chat_template(dir.string());
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  auto ct = ChatTemplate::create(*src);
  ASSERT_TRUE(ct.ok());
  auto out = ct->apply(ChatRequest{});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, "JE");  // the file's trailing newline is dropped (keep_trailing_newline=False)
  fs::remove_all(dir);
}

TEST(ChatTemplateLoader, ErrorsNameTheFileAndField) {
  const fs::path dir = temp_dir("errors");
  auto missing = load_chat_template(dir.string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  write(dir / "tokenizer_config.json", R"({"chat_template": 5})");
  auto bad = load_chat_template(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokenizer_config.json: field 'chat_template'"), std::string::npos);
  write(dir / "tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  auto src = load_chat_template(dir.string());
  ASSERT_TRUE(src.ok());
  auto ct = ChatTemplate::create(*src);
  ASSERT_FALSE(ct.ok());
  EXPECT_NE(ct.status().message().find("tokenizer_config.json: chat template syntax error at line 1"), std::string::npos)
      << ct.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pagellm
