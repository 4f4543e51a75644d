#include "server/reasoning_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pagellm::server {
namespace {

struct Split {
  std::string reasoning, content;
};

// The text fed in the given pieces, then finished; each piece's output appended.
Split run(ReasoningFormat f, const std::vector<std::string>& pieces) {
  ReasoningSplitter s(f);
  Split out;
  for (const std::string& p : pieces) {
    const auto piece = s.feed(p);
    out.reasoning += piece.reasoning;
    out.content += piece.content;
  }
  const auto last = s.finish();
  out.reasoning += last.reasoning;
  out.content += last.content;
  return out;
}

// Every way of cutting `text` into two pieces gives the same split as the whole.
void expect_any_cut(ReasoningFormat f, const std::string& text, const std::string& reasoning,
                    const std::string& content) {
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const Split s = run(f, {text.substr(0, cut), text.substr(cut)});
    EXPECT_EQ(s.reasoning, reasoning) << "cut at " << cut << " of '" << text << "'";
    EXPECT_EQ(s.content, content) << "cut at " << cut << " of '" << text << "'";
  }
  // One character a piece.
  std::vector<std::string> chars;
  for (char c : text) chars.emplace_back(1, c);
  const Split s = run(f, chars);
  EXPECT_EQ(s.reasoning, reasoning) << "one character a piece of '" << text << "'";
  EXPECT_EQ(s.content, content) << "one character a piece of '" << text << "'";
}

TEST(ReasoningParser, Names) {
  EXPECT_EQ(*parse_reasoning_format("deepseek_r1"), ReasoningFormat::kDeepSeekR1);
  EXPECT_EQ(*parse_reasoning_format("qwen3"), ReasoningFormat::kQwen3);
  EXPECT_EQ(*parse_reasoning_format(""), ReasoningFormat::kNone);
  const auto bad = parse_reasoning_format("r1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("deepseek_r1 or qwen3"), std::string::npos);
}

TEST(ReasoningParser, DeepSeekR1StartsInsideTheThought) {
  const auto f = ReasoningFormat::kDeepSeekR1;
  // The template opened <think> in the prompt: no start marker in the answer.
  expect_any_cut(f, "Let me add.\n2 + 2 = 4.\n</think>\n\nIt is 4.", "Let me add.\n2 + 2 = 4.\n",
                 "\n\nIt is 4.");
  // Older templates leave <think> to the model: skipped.
  expect_any_cut(f, "<think>hmm</think>yes", "hmm", "yes");
  // No end marker (cut off by max_tokens): all of it is the thought.
  expect_any_cut(f, "<think>still thinking about </thi", "still thinking about </thi", "");
  expect_any_cut(f, "", "", "");
}

TEST(ReasoningParser, Qwen3ThinksOnlyWhenTheAnswerOpensWithTheMarker) {
  const auto f = ReasoningFormat::kQwen3;
  expect_any_cut(f, "<think>\nplan\n</think>\n\nanswer", "\nplan\n", "\n\nanswer");
  // enable_thinking false: no marker, all content, even a later </think>.
  expect_any_cut(f, "plain answer </think> x", "", "plain answer </think> x");
  expect_any_cut(f, "<thin", "", "<thin");  // ended before it could be the marker
  expect_any_cut(f, "<think>cut off", "cut off", "");
  // A second marker is the answer's text.
  expect_any_cut(f, "<think>a</think>b</think>c", "a", "b</think>c");
}

TEST(ReasoningParser, NoneIsAllContent) {
  expect_any_cut(ReasoningFormat::kNone, "<think>x</think>y", "", "<think>x</think>y");
}

// Nothing is held back longer than a marker could still be forming.
TEST(ReasoningParser, HoldsBackOnlyAPartialMarker) {
  ReasoningSplitter s(ReasoningFormat::kDeepSeekR1);
  auto p = s.feed("abc</th");
  EXPECT_EQ(p.reasoning, "abc");
  p = s.feed("ought");  // not the marker after all
  EXPECT_EQ(p.reasoning, "</thought");
  p = s.feed("</think>answer");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "answer");
}

}  // namespace
}  // namespace pagellm::server
