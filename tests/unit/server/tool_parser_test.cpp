// Tool-call parsers on answers written the way each family's published chat template shows
// its model calling tools (the templates render earlier calls in that syntax, and the system
// prompts spell it out): Qwen2.5/Qwen3 and Hermes 2 Pro (hermes), Llama 3.1-3.3 (llama3_json),
// Mistral before and after tokenizer v11 (mistral), DeepSeek-V3/R1 and V3.1 (deepseek_v3).
// Every answer is also cut at every byte, fed a byte at a time and in random pieces: the streamed
// content and calls must add up to the whole answer's parse.
#include "server/tool_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace pagellm::server {
namespace {

using Fn = std::pair<std::string, std::string>;  // name, arguments (compact JSON)

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
};

Parsed run(ToolCallFormat f, const std::vector<std::string>& pieces) {
  ToolCallParser p(f);
  Parsed out;
  auto add = [&](ToolCallParser::Piece piece) {
    out.content += piece.content;
    for (ToolCall& c : piece.calls) out.calls.push_back(std::move(c));
  };
  for (const std::string& s : pieces) add(p.feed(s));
  add(p.finish());
  EXPECT_EQ(p.n_calls(), static_cast<int>(out.calls.size()));
  return out;
}

std::vector<Fn> fns(const Parsed& p) {
  std::vector<Fn> v;
  for (const ToolCall& c : p.calls) v.emplace_back(c.name, c.arguments);
  return v;
}

bool valid_id(ToolCallFormat f, const std::string& id) {
  const bool mistral = f == ToolCallFormat::kMistral;
  const std::string prefix = mistral ? "" : "call_";
  const size_t n = mistral ? 9 : 24;
  if (id.size() != prefix.size() + n || id.compare(0, prefix.size(), prefix) != 0) return false;
  for (size_t i = prefix.size(); i < id.size(); ++i)
    if (!std::isalnum(static_cast<unsigned char>(id[i]))) return false;
  return true;
}

void check(ToolCallFormat f, const Parsed& got, const std::string& content,
           const std::vector<Fn>& calls, const std::string& how) {
  EXPECT_EQ(got.content, content) << how;
  EXPECT_EQ(fns(got), calls) << how;
  std::set<std::string> ids;
  for (const ToolCall& c : got.calls) {
    EXPECT_TRUE(valid_id(f, c.id)) << c.id << " " << how;
    ids.insert(c.id);
  }
  EXPECT_EQ(ids.size(), got.calls.size()) << "ids repeat " << how;
}

// The answer parsed whole, cut in two at every byte, a byte a piece, and in random pieces (fixed
// seed), each time to the same content and calls.
void expect_parse(ToolCallFormat f, const std::string& text, const std::string& content,
                  const std::vector<Fn>& calls) {
  const ToolCallParser::Piece whole = parse_tool_calls(f, text);
  check(f, Parsed{whole.content, whole.calls}, content, calls, "whole: " + text);
  for (size_t cut = 0; cut <= text.size(); ++cut)
    check(f, run(f, {text.substr(0, cut), text.substr(cut)}), content, calls,
          "cut at " + std::to_string(cut) + " of: " + text);
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  check(f, run(f, bytes), content, calls, "a byte a piece: " + text);
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(1, 7)(rng);
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    check(f, run(f, pieces), content, calls,
          "random pieces (seed 1234, trial " + std::to_string(trial) + "): " + text);
  }
}

constexpr auto kHermes = ToolCallFormat::kHermes;
constexpr auto kLlama = ToolCallFormat::kLlama3Json;
constexpr auto kMistral = ToolCallFormat::kMistral;
constexpr auto kDeepSeek = ToolCallFormat::kDeepSeekV3;

const Fn kWeather{"get_weather", R"({"city":"Paris","unit":"celsius"})"};
const Fn kTime{"get_time", R"({"zone":"CET"})"};

TEST(ToolParser, Names) {
  EXPECT_EQ(*parse_tool_call_format("llama3_json"), kLlama);
  EXPECT_EQ(*parse_tool_call_format("hermes"), kHermes);
  EXPECT_EQ(*parse_tool_call_format("mistral"), kMistral);
  EXPECT_EQ(*parse_tool_call_format("deepseek_v3"), kDeepSeek);
  EXPECT_EQ(*parse_tool_call_format("none"), ToolCallFormat::kNone);
  for (auto f : {kLlama, kHermes, kMistral, kDeepSeek, ToolCallFormat::kNone})
    EXPECT_EQ(*parse_tool_call_format(tool_call_format_name(f)), f);
  const auto bad = parse_tool_call_format("qwen");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("llama3_json, hermes, mistral, deepseek_v3 or none"),
            std::string::npos);
}

// Excerpts of the published templates: what each renders for an assistant message with
// tool_calls, or says in its tools system prompt.
TEST(ToolParser, DetectsTheFormatFromTheChatTemplate) {
  // DeepSeek-V3 / R1 / V3.1.
  EXPECT_EQ(detect_tool_call_format(
                "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' "
                "+ tool['function']['name']}}"),
            kDeepSeek);
  // Mistral-7B-Instruct-v0.3, Mistral Small.
  EXPECT_EQ(detect_tool_call_format("{{- \"[AVAILABLE_TOOLS] [\" }} ... {{- \"[TOOL_CALLS] [\" }}"),
            kMistral);
  // Qwen2.5 / Qwen3 / Hermes 2 Pro.
  EXPECT_EQ(detect_tool_call_format("<|im_start|>... {{- '\\n<tool_call>\\n{\"name\": \"' }}"),
            kHermes);
  // Qwen3-Coder: XML parameters inside <tool_call>, not a format parsed here.
  EXPECT_EQ(detect_tool_call_format("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"),
            ToolCallFormat::kNone);
  // Llama 3.1 (built-in tools after <|python_tag|>) and Llama 3.2 (JSON only).
  EXPECT_EQ(detect_tool_call_format("{{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}"),
            kLlama);
  EXPECT_EQ(
      detect_tool_call_format(
          "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{{- '{\"name\": \"' + "
          "tool_call.name + '\", ' }}{{- '\"parameters\": ' }}"),
      kLlama);
  // A plain ChatML template (SmolLM2), Llama 3 without tools.
  EXPECT_EQ(detect_tool_call_format(
                "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}"),
            ToolCallFormat::kNone);
  EXPECT_EQ(detect_tool_call_format("{{ '<|start_header_id|>' + message['role'] }}"),
            ToolCallFormat::kNone);
}

TEST(ToolParser, MarkersAndIds) {
  EXPECT_EQ(tool_call_markers(kHermes),
            (std::vector<std::string_view>{"<tool_call>", "</tool_call>"}));
  EXPECT_EQ(tool_call_markers(kMistral).front(), "[TOOL_CALLS]");
  EXPECT_EQ(tool_call_markers(kLlama).front(), "<|python_tag|>");
  EXPECT_EQ(tool_call_markers(kDeepSeek).size(), 5u);
  EXPECT_TRUE(tool_call_markers(ToolCallFormat::kNone).empty());
  std::set<std::string> ids;
  for (int i = 0; i < 100; ++i) {
    const std::string id = new_tool_call_id(kHermes);
    EXPECT_TRUE(valid_id(kHermes, id)) << id;
    ids.insert(id);
    EXPECT_TRUE(valid_id(kMistral, new_tool_call_id(kMistral)));
  }
  EXPECT_EQ(ids.size(), 100u);
}

TEST(ToolParser, HermesSingleAndParallel) {
  const std::string call1 =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"celsius\"}}\n</tool_call>";
  const std::string call2 =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>";
  expect_parse(kHermes, call1, "", {kWeather});
  expect_parse(kHermes, call1 + "\n" + call2, "", {kWeather, kTime});
  // vLLM's Hermes template renders "arguments" before "name"; arguments as a JSON string.
  expect_parse(
      kHermes,
      "<tool_call>\n{ \"arguments\": {\"zone\": \"CET\"}, \"name\": \"get_time\"}\n</tool_call> ",
      "", {kTime});
  expect_parse(kHermes,
               "<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": "
               "\\\"CET\\\"}\"}</tool_call>",
               "", {kTime});
  // No arguments at all.
  expect_parse(kHermes, "<tool_call>{\"name\": \"now\"}</tool_call>", "", {{"now", "{}"}});
}

TEST(ToolParser, HermesTextAroundCalls) {
  const std::string call1 =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"celsius\"}}\n</tool_call>";
  const std::string call2 =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>";
  expect_parse(kHermes, "I'll check both.\n\n" + call1 + "\n" + call2 + "\n", "I'll check both.",
               {kWeather, kTime});
  // Text after the calls: the whitespace before them separates it from the text before.
  expect_parse(kHermes, "Checking.\n" + call1 + "\nMeanwhile, pack an umbrella.",
               "Checking.\nMeanwhile, pack an umbrella.", {kWeather});
  expect_parse(kHermes, call1 + "\n\nDone. ", "Done. ", {kWeather});
  // No calls: the text is untouched, whitespace and all.
  expect_parse(kHermes, "  Paris is sunny.\n\n", "  Paris is sunny.\n\n", {});
  expect_parse(kHermes, "a < b, <tool and <tool_cal are not markers",
               "a < b, <tool and <tool_cal are not markers", {});
  expect_parse(kHermes, "", "", {});
}

TEST(ToolParser, HermesMalformedCallsStayContent) {
  // A brace short: the whole block is content, markers included.
  const std::string bad =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}\n</tool_call>";
  expect_parse(kHermes, bad, bad, {});
  const std::string good =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>";
  expect_parse(kHermes, good + "\n" + bad, bad, {kTime});
  expect_parse(kHermes, bad + "\n" + good, bad, {kTime});
  // No name, a name that is not a string, arguments that are not an object, not JSON.
  for (const std::string& body :
       {std::string("{\"arguments\": {}}"), std::string("{\"name\": 7, \"arguments\": {}}"),
        std::string("{\"name\": \"f\", \"arguments\": [1]}"), std::string("get_time(zone=CET)"),
        std::string("{\"name\": \"f\"} trailing")}) {
    const std::string text = "Text <tool_call>" + body + "</tool_call> more";
    expect_parse(kHermes, text, text, {});
  }
  // Nested past 64 levels.
  const std::string deep =
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(70, '[') +
      std::string(70, ']') + "}}</tool_call>";
  expect_parse(kHermes, deep, deep, {});
}

TEST(ToolParser, HermesMissingEndMarker) {
  // The answer ended (EOS) before </tool_call>: still a call if its JSON is complete.
  expect_parse(kHermes,
               "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n", "",
               {kTime});
  // Cut off by max_tokens inside the JSON: content as written.
  const std::string cut = "Let me see.\n<tool_call>\n{\"name\": \"get_time\", \"argu";
  expect_parse(kHermes, cut, cut, {});
  expect_parse(kHermes, "Look: <tool_call>", "Look: <tool_call>", {});
}

TEST(ToolParser, Llama3Json) {
  const std::string w =
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}";
  const std::string t = "{\"name\": \"get_time\", \"parameters\": {\"zone\": \"CET\"}}";
  expect_parse(kLlama, w, "", {kWeather});
  expect_parse(kLlama, "<|python_tag|>" + w, "", {kWeather});
  expect_parse(kLlama,
               "\n\n{\n  \"name\": \"get_time\",\n  \"arguments\": {\"zone\": \"CET\"}\n}\n", "",
               {kTime});
  // Parallel calls, separated by "; " (as vLLM's llama3_json accepts) or by lines.
  expect_parse(kLlama, w + "; " + t, "", {kWeather, kTime});
  expect_parse(kLlama, w + "\n" + t, "", {kWeather, kTime});
  // Text before (the call on its own line) and after.
  expect_parse(kLlama, "Let me look that up.\n" + w, "Let me look that up.", {kWeather});
  expect_parse(kLlama, w + "\nI asked for Celsius.", "I asked for Celsius.", {kWeather});
  // JSON that is not a call, JSON inside a line, braces in code: all content, untouched.
  for (const std::string& text :
       {std::string("{\"answer\": 42}"), std::string("The object {\"name\": \"x\"} has a name."),
        std::string("```c\nint main() {\n  return 0;\n}\n```\n"), std::string("{\n}\n{ not json }"),
        std::string("{\"name\": \"f\", \"parameters\": 3}")})
    expect_parse(kLlama, text, text, {});
  // Malformed or cut off: content.
  const std::string open = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}";
  expect_parse(kLlama, open, open, {});
  expect_parse(kLlama, w + "; " + open, open, {kWeather});
  expect_parse(kLlama, "<|python_tag|>brave_search.call(query=\"x\")",
               "<|python_tag|>brave_search.call(query=\"x\")", {});
}

TEST(ToolParser, MistralBeforeV11) {
  // [TOOL_CALLS] then one JSON array of calls (the template adds a 9-character "id" to each).
  expect_parse(kMistral,
               "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
               "\"unit\": \"celsius\"}}]",
               "", {kWeather});
  expect_parse(kMistral,
               "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
               "\"unit\": \"celsius\"}, \"id\": \"a1b2c3d4e\"}, {\"name\": \"get_time\", "
               "\"arguments\": {\"zone\": \"CET\"}, \"id\": \"f5g6h7i8j\"}]",
               "", {kWeather, kTime});
  expect_parse(kMistral,
               "Sure.[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}]",
               "Sure.", {kTime});
  // One bad call spoils the array; an unclosed array is content.
  const std::string one_bad =
      "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}, {\"arguments\": "
      "{}}]";
  expect_parse(kMistral, one_bad, one_bad, {});
  const std::string open = "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {]";
  expect_parse(kMistral, open, open, {});
  expect_parse(kMistral, "[TOOL_CALLS]", "[TOOL_CALLS]", {});
}

TEST(ToolParser, MistralV11) {
  // [TOOL_CALLS]name[ARGS]{...} per call.
  expect_parse(kMistral,
               "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"celsius\"}"
               "[TOOL_CALLS]get_time[ARGS]{\"zone\": \"CET\"}",
               "", {kWeather, kTime});
  // [ARGS] skipped as a special token by the tokenizer.
  expect_parse(kMistral, "[TOOL_CALLS]get_time{\"zone\": \"CET\"}", "", {kTime});
  expect_parse(kMistral, "Checking the time.\n[TOOL_CALLS]get_time[ARGS]{\"zone\": \"CET\"}",
               "Checking the time.", {kTime});
  // Not a name, arguments that do not parse, cut off.
  expect_parse(kMistral, "[TOOL_CALLS] get time", "[TOOL_CALLS] get time", {});
  expect_parse(kMistral, "[TOOL_CALLS]get_time[ARGS]{\"zone\": CET}",
               "[TOOL_CALLS]get_time[ARGS]{\"zone\": CET}", {});
  expect_parse(kMistral, "[TOOL_CALLS]get_time[AR", "[TOOL_CALLS]get_time[AR", {});
}

TEST(ToolParser, DeepSeekV3AndR1) {
  const std::string w =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", "
      "\"unit\": \"celsius\"}\n```<｜tool▁call▁end｜>";
  const std::string t =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\": \"CET\"}\n```"
      "<｜tool▁call▁end｜>";
  expect_parse(kDeepSeek, "<｜tool▁calls▁begin｜>" + w + "<｜tool▁calls▁end｜>", "", {kWeather});
  expect_parse(kDeepSeek, "<｜tool▁calls▁begin｜>" + w + "\n" + t + "<｜tool▁calls▁end｜>", "",
               {kWeather, kTime});
  expect_parse(kDeepSeek,
               "I'll check both.\n\n<｜tool▁calls▁begin｜>" + w + "\n" + t + "<｜tool▁calls▁end｜>",
               "I'll check both.", {kWeather, kTime});
  // Missing end markers (the answer ended after the closing fence).
  expect_parse(kDeepSeek, "<｜tool▁calls▁begin｜>" + w, "", {kWeather});
  expect_parse(
      kDeepSeek,
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n"
      "{\"zone\": \"CET\"}\n```",
      "", {kTime});
}

TEST(ToolParser, DeepSeekV31) {
  expect_parse(kDeepSeek,
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": "
               "\"Paris\", \"unit\": \"celsius\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time"
               "<｜tool▁sep｜>{\"zone\": \"CET\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
               "", {kWeather, kTime});
  expect_parse(kDeepSeek,
               "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
               "{\"zone\": \"CET\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>\nThe time follows.",
               "Let me check.The time follows.", {kTime});
}

TEST(ToolParser, DeepSeekMalformedCallsStayContent) {
  const std::string bad =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": Paris}\n```"
      "<｜tool▁call▁end｜>";
  const std::string good =
      "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"CET\"}<｜tool▁call▁end｜>";
  // No call in the block: all of it, markers included, is content.
  const std::string only_bad = "<｜tool▁calls▁begin｜>" + bad + "<｜tool▁calls▁end｜>";
  expect_parse(kDeepSeek, only_bad, only_bad, {});
  // A good call and a bad one: the bad one's text is content.
  expect_parse(kDeepSeek, "<｜tool▁calls▁begin｜>" + good + bad + "<｜tool▁calls▁end｜>", bad,
               {kTime});
  // No separator; cut off inside the arguments; a block with text instead of calls.
  const std::string no_sep =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time {}<｜tool▁call▁end｜>";
  expect_parse(kDeepSeek, no_sep, no_sep, {});
  const std::string cut = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zo";
  expect_parse(kDeepSeek, cut, cut, {});
  expect_parse(kDeepSeek, "<｜tool▁calls▁begin｜>just text", "<｜tool▁calls▁begin｜>just text", {});
}

TEST(ToolParser, NoneIsAllContent) {
  const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  expect_parse(ToolCallFormat::kNone, text, text, {});
}

// Nothing is held back longer than a call could still be forming, and a call is given out with
// the piece that completes it.
TEST(ToolParser, HoldsBackOnlyWhatMayBeACall) {
  ToolCallParser p(kHermes);
  auto piece = p.feed("Hello <tool");
  EXPECT_EQ(piece.content, "Hello");  // the space waits: dropped if a call follows
  piece = p.feed("box> is not a marker ");
  EXPECT_EQ(piece.content, " <toolbox> is not a marker");
  piece = p.feed("<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}");
  EXPECT_EQ(piece.content, "");
  EXPECT_TRUE(piece.calls.empty());
  piece = p.feed("</tool_");
  EXPECT_TRUE(piece.calls.empty());
  piece = p.feed("call>");
  ASSERT_EQ(piece.calls.size(), 1u);
  EXPECT_EQ(piece.calls[0].name, "get_time");
  EXPECT_EQ(piece.calls[0].arguments, R"({"zone":"CET"})");
  piece = p.finish();
  EXPECT_EQ(piece.content, "");
  EXPECT_EQ(p.n_calls(), 1);

  // llama3_json holds a '{' that starts a line only until the next character says it is no key.
  ToolCallParser l(kLlama);
  EXPECT_EQ(l.feed("Code:\n{").content, "Code:");
  EXPECT_EQ(l.feed(" x").content, "\n{ x");
}

// Random answers made of every format's markers, JSON pieces and text: whatever the pieces,
// streaming gives what the whole text parses to, and content plus calls never lose text that is
// not a call.
TEST(ToolParser, RandomAnswersStreamAsTheyParseWhole) {
  // clang-format off
  const std::vector<std::string> frags = {
      "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>",
      "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁calls▁end｜>", "function", "get_time", "\n```json\n", "```", "{", "}", "[", "]",
      "\"name\": \"get_time\"", "\"arguments\": {\"zone\": \"CET\"}", ", ", "\"", "\\", ";", " ",
      "\n", "text", "<tool", "[TOOL", "<｜tool",
      // Whole calls of each format, so that some answers hold calls among the debris.
      "{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}",
      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
      "[TOOL_CALLS]get_time[ARGS]{\"zone\": \"CET\"}", "[TOOL_CALLS][{\"name\": \"f\"}]",
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>"};
  // clang-format on
  std::mt19937 rng(42);
  for (auto f : {kHermes, kLlama, kMistral, kDeepSeek}) {
    int n_calls = 0;
    for (int trial = 0; trial < 400; ++trial) {
      std::string text;
      const int n = std::uniform_int_distribution<int>(1, 24)(rng);
      for (int i = 0; i < n; ++i)
        text += frags[std::uniform_int_distribution<size_t>(0, frags.size() - 1)(rng)];
      const ToolCallParser::Piece whole = parse_tool_calls(f, text);
      n_calls += static_cast<int>(whole.calls.size());
      if (whole.calls.empty()) {
        // No call: the text itself, untouched.
        EXPECT_EQ(whole.content, text) << tool_call_format_name(f) << ": " << text;
      }
      std::vector<std::string> bytes;
      for (char c : text) bytes.emplace_back(1, c);
      const Parsed streamed = run(f, bytes);
      EXPECT_EQ(streamed.content, whole.content) << tool_call_format_name(f) << ": " << text;
      EXPECT_EQ(fns(streamed), fns(Parsed{whole.content, whole.calls}))
          << tool_call_format_name(f) << ": " << text;
    }
    EXPECT_GT(n_calls, 20) << tool_call_format_name(f)
                           << ": the random answers held few calls, the test checks too little";
  }
}

TEST(ToolParser, KeepsUnicodeAndKeyOrder) {
  expect_parse(kHermes,
               "<tool_call>{\"name\": \"translate\", \"arguments\": {\"text\": \"天气 ☀\", "
               "\"b\": 1, \"a\": [true, null, 2.5]}}</tool_call>",
               "", {{"translate", R"({"text":"天气 ☀","b":1,"a":[true,null,2.5]})"}});
  // Braces and markers inside JSON strings do not end the value.
  expect_parse(kLlama, "{\"name\": \"echo\", \"parameters\": {\"s\": \"}{\\\"]\"}}", "",
               {{"echo", R"({"s":"}{\"]"})"}});
}

}  // namespace
}  // namespace pagellm::server
