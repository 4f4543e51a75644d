#include "sample/stop_checker.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace pagellm {
namespace {

constexpr int32_t kEos = 2;
constexpr int32_t kTextToken = 100;  // any token that is neither EOS nor a stop id

struct Fed {
  std::vector<std::string> emitted;  // per append
  std::string streamed;              // concatenation
  StopUpdate last;
};

// Feeds the deltas as text tokens; stops feeding once finished.
Fed feed(StopChecker& checker, const std::vector<std::string>& deltas) {
  Fed run;
  for (const std::string& d : deltas) {
    if (checker.finished()) break;
    run.last = checker.append(kTextToken, d);
    run.emitted.push_back(run.last.text);
    run.streamed += run.last.text;
  }
  return run;
}

std::vector<std::string> chars(const std::string& s) {
  std::vector<std::string> out;
  for (char c : s) out.push_back(std::string(1, c));
  return out;
}

SamplingParams with_stops(std::vector<std::string> stops) {
  SamplingParams p;
  p.stop = std::move(stops);
  return p;
}

TEST(StopChecker, PassesTextThroughAndStopsAtMaxTokens) {
  SamplingParams p;
  p.max_tokens = 3;
  StopChecker c(p, std::vector<int32_t>{kEos});
  Fed r = feed(c, {"Hello", ",", " world", " again"});
  EXPECT_EQ(r.emitted, (std::vector<std::string>{"Hello", ",", " world"}));
  EXPECT_EQ(r.last.finish, FinishReason::kLength);
  EXPECT_STREQ(finish_reason_name(c.finish_reason()), "length");
  EXPECT_EQ(c.text(), "Hello, world");
  EXPECT_EQ(c.n_tokens(), 3);
}

TEST(StopChecker, StopStringSplitAcrossManyDeltasIsNeverStreamed) {
  StopChecker c(with_stops({"<|end|>"}), std::vector<int32_t>{kEos});
  Fed r = feed(c, {"The answer", " is 4", ".<", "|", "e", "n", "d", "|", ">", " ignored"});
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
  EXPECT_EQ(r.last.stop_string, "<|end|>");
  EXPECT_FALSE(r.last.stop_token.has_value());
  EXPECT_EQ(r.streamed, "The answer is 4.");
  EXPECT_EQ(c.text(), "The answer is 4.");
  // "." went out with its delta; "<" onwards was held.
  EXPECT_EQ(r.emitted[2], ".");
  for (size_t i = 3; i < r.emitted.size(); ++i) EXPECT_EQ(r.emitted[i], "") << i;
}

TEST(StopChecker, HeldTextIsReleasedWhenItCannotMatch) {
  StopChecker c(with_stops({"END"}), std::vector<int32_t>{kEos});
  Fed r = feed(c, {"the E", "N", "able", "d E"});
  EXPECT_EQ(r.emitted, (std::vector<std::string>{"the ", "", "ENable", "d "}));
  EXPECT_EQ(c.n_held(), 1u);
  EXPECT_EQ(c.finish(FinishReason::kAbort), "E");  // released at finish
  EXPECT_EQ(c.text(), "the ENabled E");
  EXPECT_EQ(c.finish(FinishReason::kLength), "");  // already finished: no change
  EXPECT_EQ(c.finish_reason(), FinishReason::kAbort);
}

TEST(StopChecker, OverlappingCandidatesEarliestCompletionWins) {
  // "bc" completes (at byte 3) before "abcd" (byte 4): the cut is before "bc", whatever the split.
  StopChecker whole(with_stops({"abcd", "bc"}), std::vector<int32_t>{});
  Fed r = feed(whole, {"xabcd"});
  EXPECT_EQ(r.streamed, "xa");
  EXPECT_EQ(r.last.stop_string, "bc");
  StopChecker split(with_stops({"abcd", "bc"}), std::vector<int32_t>{});
  r = feed(split, chars("xabcd"));
  EXPECT_EQ(r.streamed, "xa");
  // Same end: the longer string (earlier start) wins.
  StopChecker tie(with_stops({"b", "ab"}), std::vector<int32_t>{});
  r = feed(tie, {"xa", "b"});
  EXPECT_EQ(r.streamed, "x");
  EXPECT_EQ(r.last.stop_string, "ab");
}

TEST(StopChecker, SelfOverlappingPrefixHoldback) {
  StopChecker c(with_stops({"aab"}), std::vector<int32_t>{});
  Fed r = feed(c, {"a", "a", "a", "b", "zzz"});
  EXPECT_EQ(r.emitted, (std::vector<std::string>{"", "", "a", ""}));
  EXPECT_EQ(c.text(), "a");
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
}

TEST(StopChecker, Unicode) {
  StopChecker c(with_stops({"終わり", "🛑"}), std::vector<int32_t>{});
  Fed r = feed(c, {"これで", "終", "わ", "り", "です"});
  EXPECT_EQ(r.streamed, "これで");
  EXPECT_EQ(r.emitted[1], "");  // 終 held: a prefix of 終わり
  StopChecker e(with_stops({"終わり", "🛑"}), std::vector<int32_t>{});
  r = feed(e, {"終", "点 ", "go 🛑 no"});
  EXPECT_EQ(r.emitted, (std::vector<std::string>{"", "終点 ", "go "}));
  EXPECT_EQ(r.last.stop_string, "🛑");
  // A character sharing a lead byte with the stop string (é = C3 A9, è = C3 A8) is not held.
  StopChecker accent(with_stops({"é!"}), std::vector<int32_t>{});
  r = feed(accent, {"è", "é", "!"});
  EXPECT_EQ(r.emitted, (std::vector<std::string>{"è", "", ""}));
  EXPECT_EQ(accent.text(), "è");
}

TEST(StopChecker, StopTokensAndEos) {
  SamplingParams p = with_stops({"STOP"});
  p.stop_token_ids = {7};
  StopChecker c(p, std::vector<int32_t>{kEos});
  EXPECT_EQ(c.append(kTextToken, "go ST").text, "go ");
  StopUpdate u = c.append(7, "<tool>");
  EXPECT_EQ(u.finish, FinishReason::kStop);
  EXPECT_EQ(u.stop_token, 7);
  EXPECT_EQ(u.text, "ST");  // held text released, the stop token's own text dropped
  EXPECT_EQ(c.text(), "go ST");

  StopChecker eos(p, std::vector<int32_t>{kEos});
  u = eos.append(kEos, "</s>");
  EXPECT_EQ(u.finish, FinishReason::kStop);
  EXPECT_FALSE(u.stop_token.has_value());
  EXPECT_FALSE(u.stop_string.has_value());
  EXPECT_EQ(eos.text(), "");

  p.ignore_eos = true;
  p.include_stop_str_in_output = true;
  StopChecker ignore(p, std::vector<int32_t>{kEos});
  u = ignore.append(kEos, "</s>");
  EXPECT_EQ(u.finish, FinishReason::kNone);
  EXPECT_EQ(u.text, "</s>");
  u = ignore.append(7, "<tool>");
  EXPECT_EQ(u.finish, FinishReason::kStop);
  EXPECT_EQ(ignore.text(), "</s><tool>");  // include_stop_str_in_output keeps the token text
}

TEST(StopChecker, IncludeStopStringInOutput) {
  SamplingParams p = with_stops({"\n\n"});
  p.include_stop_str_in_output = true;
  StopChecker c(p, std::vector<int32_t>{});
  Fed r = feed(c, {"line one", "\n", "\nline two"});
  EXPECT_EQ(c.text(), "line one\n\n");
  EXPECT_EQ(r.emitted, (std::vector<std::string>{"line one", "", "\n\n"}));
}

TEST(StopChecker, MinTokensDefersStops) {
  SamplingParams p = with_stops({"x"});
  p.stop_token_ids = {7};
  p.min_tokens = 3;
  StopChecker c(p, std::vector<int32_t>{kEos});
  EXPECT_EQ(c.append(kEos, "").finish, FinishReason::kNone);      // token 1: too early
  EXPECT_EQ(c.append(kTextToken, "ax").text, "ax");               // token 2: too early
  StopUpdate u = c.append(kTextToken, "bxc");                     // token 3: eligible
  EXPECT_EQ(u.finish, FinishReason::kStop);
  EXPECT_EQ(u.text, "b");
  EXPECT_EQ(c.text(), "axb");
  // A stop string that starts before min_tokens and completes after it still counts.
  SamplingParams q = with_stops({"abc"});
  q.min_tokens = 2;
  StopChecker d(q, std::vector<int32_t>{});
  EXPECT_EQ(d.append(kTextToken, "zab").text, "z");
  u = d.append(kTextToken, "cd");
  EXPECT_EQ(u.finish, FinishReason::kStop);
  EXPECT_EQ(d.text(), "z");
}

TEST(StopChecker, LengthReleasesHeldText) {
  SamplingParams p = with_stops({"END"});
  p.max_tokens = 2;
  StopChecker c(p, std::vector<int32_t>{});
  Fed r = feed(c, {"x E", "N"});
  EXPECT_EQ(r.last.finish, FinishReason::kLength);
  EXPECT_EQ(c.text(), "x EN");
}

// Reference on the whole text: the output is the text before the earliest-completing stop
// occurrence (longest on ties), or all of it.
std::string reference_output(const std::string& text, const std::vector<std::string>& stops,
                             bool* stopped) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = std::string::npos;
    for (const std::string& s : stops)
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0)
        best = std::min(best, end - s.size());
    if (best != std::string::npos) {
      *stopped = true;
      return text.substr(0, best);
    }
  }
  *stopped = false;
  return text;
}

// The longest suffix of `text` that is a proper prefix of a stop string.
size_t reference_holdback(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& s : stops)
    for (size_t len = 1; len < s.size() && len <= text.size(); ++len)
      if (text.compare(text.size() - len, len, s, 0, len) == 0) best = std::max(best, len);
  return best;
}

TEST(StopChecker, RandomTextsAndSplitsMatchTheReference) {
  std::mt19937 rng(31337);
  const std::string alphabet = "abc";
  int checked = 0, stopped_runs = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::uniform_int_distribution<int> len_dist(0, 24), stop_len(1, 4), n_stops(1, 3),
        letter(0, 2), piece(0, 4);
    std::string text;
    for (int i = len_dist(rng); i > 0; --i) text += alphabet[letter(rng)];
    std::vector<std::string> stops;
    for (int i = n_stops(rng); i > 0; --i) {
      std::string s;
      for (int j = stop_len(rng); j > 0; --j) s += alphabet[letter(rng)];
      stops.push_back(s);
    }
    bool stopped = false;
    const std::string want = reference_output(text, stops, &stopped);
    StopChecker c(with_stops(stops), std::vector<int32_t>{});
    std::string fed, streamed;
    size_t pos = 0;
    while (pos < text.size() && !c.finished()) {
      const size_t n = std::min<size_t>(piece(rng), text.size() - pos);  // empty deltas too
      fed += text.substr(pos, n);
      const StopUpdate u = c.append(kTextToken, text.substr(pos, n));
      ASSERT_EQ(u.finish, c.finish_reason());
      pos += n;
      streamed += u.text;
      // Streamed text is always a prefix of the final output...
      ASSERT_EQ(want.compare(0, streamed.size(), streamed), 0)
          << "text " << text << " streamed " << streamed;
      // ...and while running, exactly the fed text minus the longest partial stop suffix.
      if (!c.finished()) {
        ASSERT_EQ(streamed.size(), fed.size() - reference_holdback(fed, stops))
            << "text " << text << " fed " << fed;
      }
    }
    if (!c.finished()) streamed += c.finish(FinishReason::kLength);
    ASSERT_EQ(streamed, want) << "text " << text;
    ASSERT_EQ(c.text(), want);
    ASSERT_EQ(c.finish_reason(), stopped ? FinishReason::kStop : FinishReason::kLength);
    stopped_runs += stopped;
    ++checked;
  }
  EXPECT_EQ(checked, 3000);
  EXPECT_GT(stopped_runs, 500);  // the generator does exercise both outcomes
  EXPECT_LT(stopped_runs, 2990);
}

}  // namespace
}  // namespace pagellm
