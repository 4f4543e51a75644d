// Reasoning parsers (`serve --reasoning-parser`): models that think before they answer write the
// thought between markers (DeepSeek-R1 and Qwen3: <think> ... </think>); the chat API returns it
// apart, as message.reasoning_content (delta.reasoning_content when streaming), and the answer
// as content. A ReasoningSplitter takes one choice's text as it is generated and says which part
// each piece belongs to, holding back only text that may be the start of a marker split across
// pieces.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace pagellm::server {

enum class ReasoningFormat {
  kNone,        // no parser: all text is content
  kDeepSeekR1,  // the answer starts inside the thought (R1's template opens <think> in the
                // prompt; a leading <think> is skipped): reasoning up to </think>, all of it
                // reasoning if the end marker never comes
  kQwen3,       // a thought only where the answer starts with <think> (enable_thinking false:
                // none); reasoning up to </think>, all of it if the end marker never comes
};

// "deepseek_r1" or "qwen3" (the names vLLM's --reasoning-parser takes); "" is kNone.
Result<ReasoningFormat> parse_reasoning_format(std::string_view name);

class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(ReasoningFormat format);

  struct Piece {
    std::string reasoning, content;
  };
  // The next text of the answer: what can be told apart now.
  Piece feed(std::string_view text);
  // The answer has ended: the text held back, as what it turned out to be.
  Piece finish();

 private:
  enum class State { kStart, kReasoning, kContent };
  // Emits pending_ up to where `marker` may begin, or through it (switching state) if found.
  void scan(Piece& out);
  static void add(Piece& out, State state, std::string_view text);

  ReasoningFormat format_;
  State state_;
  std::string pending_;  // text not yet attributed
};

}  // namespace pagellm::server
