// The n-gram proposer against a brute-force statement of its rule (the longest suffix first, the
// most recent earlier occurrence, max_tokens of what followed, going on from the guesses past the
// text's end), on hand-made sequences and random ones over small alphabets (where suffixes recur
// often).
#include "spec/ngram_proposer.h"

#include <gtest/gtest.h>

#include <random>

namespace pagellm {
namespace {

std::vector<int32_t> propose(const std::vector<int32_t>& tokens, int32_t k, int32_t min_n,
                             int32_t max_n) {
  std::vector<int32_t> draft = {-7};  // overwritten
  NgramProposer::propose_one(tokens, k, {min_n, max_n}, draft);
  return draft;
}

// The rule, spelled out: every n from max_n down, every earlier end position from the latest.
std::vector<int32_t> reference(const std::vector<int32_t>& t, int32_t k, int32_t min_n,
                               int32_t max_n) {
  const int64_t len = static_cast<int64_t>(t.size());
  for (int64_t n = max_n; n >= min_n; --n) {
    if (n >= len) continue;
    for (int64_t e = len - 2; e >= n - 1; --e) {
      bool same = true;
      for (int64_t i = 0; i < n; ++i) same = same && t[e - i] == t[len - 1 - i];
      if (!same) continue;
      // Past the end of the text, the guesses go on from themselves (the text and the guesses as
      // one sequence).
      std::vector<int32_t> all = t;
      for (int64_t j = e + 1; static_cast<int64_t>(all.size()) < len + k; ++j)
        all.push_back(all[j]);
      return std::vector<int32_t>(all.begin() + len, all.end());
    }
  }
  return {};
}

TEST(NgramProposer, CopiesWhatFollowedTheSuffixBefore) {
  // "the cat sat on the" -> "cat sat on ..."
  const std::vector<int32_t> t = {10, 11, 12, 13, 10};
  EXPECT_EQ(propose(t, 3, 1, 3), (std::vector<int32_t>{11, 12, 13}));
  // Past the text's end the copy goes on from the guesses: 11 12 13 10 11 12 13 10 11.
  EXPECT_EQ(propose(t, 9, 1, 3), (std::vector<int32_t>{11, 12, 13, 10, 11, 12, 13, 10, 11}));
  // A token over and over: whole drafts of it.
  EXPECT_EQ(propose({4, 7, 7, 7}, 4, 2, 3), (std::vector<int32_t>{7, 7, 7, 7}));
}

TEST(NgramProposer, LongestSuffixFirstThenMostRecent) {
  // [1 2 3] occurred once (then 9); [2 3] most recently before 7.
  const std::vector<int32_t> t = {1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3};
  EXPECT_EQ(propose(t, 1, 1, 3), (std::vector<int32_t>{9}));
  EXPECT_EQ(propose(t, 1, 1, 2), (std::vector<int32_t>{7}));
  // Only n >= 3 allowed, and no earlier [5 1 2 3]: the 3-gram still matches.
  EXPECT_EQ(propose(t, 2, 3, 4), (std::vector<int32_t>{9, 5}));
}

TEST(NgramProposer, NoGuessWithoutAnEarlierOccurrence) {
  EXPECT_TRUE(propose({1, 2, 3, 4}, 4, 1, 4).empty());
  EXPECT_TRUE(propose({5}, 4, 1, 4).empty());
  EXPECT_TRUE(propose({}, 4, 1, 4).empty());
  EXPECT_TRUE(propose({1, 2, 1, 2}, 0, 1, 4).empty());     // nothing asked
  EXPECT_TRUE(propose({1, 2, 3, 1, 2}, 4, 3, 4).empty());  // [1 2] recurs, but n >= 3 wanted
}

TEST(NgramProposer, MatchesTheRuleOnRandomSequences) {
  std::mt19937 rng(20261206);
  int n_guesses = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    const int alphabet = 2 + static_cast<int>(rng() % 6);
    const int len = static_cast<int>(rng() % 40);
    std::vector<int32_t> t(len);
    for (int32_t& x : t) x = static_cast<int32_t>(rng() % alphabet);
    const int32_t min_n = 1 + static_cast<int32_t>(rng() % 3);
    const int32_t max_n = min_n + static_cast<int32_t>(rng() % 4);
    const int32_t k = static_cast<int32_t>(rng() % 6);
    const auto want = reference(t, k, min_n, max_n);
    EXPECT_EQ(propose(t, k, min_n, max_n), want) << "trial " << trial;
    n_guesses += !want.empty();
  }
  EXPECT_GT(n_guesses, 1000);
}

TEST(NgramProposer, BatchFillsEveryDraft) {
  NgramProposer p({1, 3});
  const std::vector<int32_t> a = {4, 5, 6, 4}, b = {1, 2, 3};
  std::vector<int32_t> da, db = {99};
  const std::vector<ProposalRequest> batch = {{1, 0, a, 2, &da}, {2, 0, b, 2, &db}};
  p.propose(batch);
  EXPECT_EQ(da, (std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(db.empty());
}

}  // namespace
}  // namespace pagellm
