#include "bench/sse.h"

#include <gtest/gtest.h>

namespace pagellm::bench {
namespace {

// CRLF and LF and CR line ends, a comment, a multi-line event, a field without a space, an
// unknown field and an event with no data.
constexpr std::string_view kStream =
    ": keep-alive\r\n\r\n"
    "data: {\"a\":1}\r\n\r\n"
    "event: message\nid: 7\ndata: line1\ndata: line2\n\n"
    "data:{\"b\":2}\r\r"
    "retry: 10\n\n"
    "data: [DONE]\n\n";

const std::vector<std::string> kExpected = {"{\"a\":1}", "line1\nline2", "{\"b\":2}", "[DONE]"};

TEST(Sse, WholeStream) {
  SseParser p;
  std::vector<std::string> ev;
  p.feed(kStream, ev);
  EXPECT_EQ(ev, kExpected);
  EXPECT_EQ(p.pending_bytes(), 0u);
}

TEST(Sse, SplitAtEveryByteBoundary) {
  for (size_t cut = 0; cut <= kStream.size(); ++cut) {
    SseParser p;
    std::vector<std::string> ev;
    p.feed(kStream.substr(0, cut), ev);
    p.feed(kStream.substr(cut), ev);
    EXPECT_EQ(ev, kExpected) << "split at " << cut;
  }
  SseParser p;
  std::vector<std::string> ev;
  for (char c : kStream) p.feed(std::string_view(&c, 1), ev);
  EXPECT_EQ(ev, kExpected);
}

TEST(Sse, UnfinishedEventIsPending) {
  SseParser p;
  std::vector<std::string> ev;
  p.feed("data: {\"a\":1}\n", ev);
  EXPECT_TRUE(ev.empty());
  EXPECT_GT(p.pending_bytes(), 0u);
  p.feed("\n", ev);
  ASSERT_EQ(ev.size(), 1u);
}

}  // namespace
}  // namespace pagellm::bench
