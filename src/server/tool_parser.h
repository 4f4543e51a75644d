// Tool-call parsers (`serve --tool-call-parser`): a chat model asked with `tools` writes its calls
// into the answer in its family's own syntax; the chat API returns them apart, as
// message.tool_calls (delta.tool_calls when streaming), and the rest of the answer as content.
//
//   llama3_json  Llama 3.1-3.3 (JSON tool calling): a JSON object
//                {"name": ..., "parameters": {...}} ("arguments" is accepted too) at the start of
//                the answer or of a line, or after <|python_tag|>; several calls separated by ';'
//                and/or whitespace.
//   hermes       Hermes 2 Pro, Qwen2.5, Qwen3: <tool_call>{"name": ..., "arguments": {...}}
//                </tool_call>, one block per call.
//   mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (tokenizers before v11), or
//                [TOOL_CALLS]name[ARGS]{...} once per call (v11 and later).
//   deepseek_v3  DeepSeek-V3, R1 and V3.1: <｜tool▁calls▁begin｜> then per call
//                <｜tool▁call▁begin｜>function<｜tool▁sep｜>name\n```json\n{...}\n```<｜tool▁call▁end｜>
//                (V3, R1) or <｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//                (V3.1), then <｜tool▁calls▁end｜>.
//
// A ToolCallParser takes one choice's answer text as it is generated and says which part is
// content and which calls are complete, holding back only text that may still turn out to be (part
// of) a call: the start of a marker split across pieces, or a call whose end has not come yet. A
// call is given out once it is complete and its JSON checked, so the streamed pieces always add up
// to what the whole text parses to. Malformed output is never an error: a call whose JSON does not
// parse (or has no name) stays in the content as the model wrote it, markers included.
// Whitespace around calls is dropped, except that the whitespace before a run of calls stays
// between the text before and the text after it ("A\n<call>\nB" -> "A\nB").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace pagellm::server {

enum class ToolCallFormat { kNone, kLlama3Json, kHermes, kMistral, kDeepSeekV3 };

// "llama3_json", "hermes", "mistral", "deepseek_v3" or "none" (vLLM's --tool-call-parser names).
Result<ToolCallFormat> parse_tool_call_format(std::string_view name);
std::string_view tool_call_format_name(ToolCallFormat format);

// The format a chat template's model writes, from the markers the template itself renders (it
// shows the model earlier calls, or tells it the syntax), checked in this order:
//   <｜tool▁calls▁begin｜>                              -> deepseek_v3
//   [TOOL_CALLS]                                        -> mistral
//   <tool_call> (but not Qwen3-Coder's XML <function=)  -> hermes
//   <|python_tag|>, or "parameters": in a Llama 3 template (<|start_header_id|>) -> llama3_json
//   anything else                                       -> none
ToolCallFormat detect_tool_call_format(std::string_view chat_template);

// The marker texts the format's parser looks for. Where the tokenizer makes one of them a special
// token, the answer must be detokenized without skipping special tokens, or the parser never sees
// the marker.
std::vector<std::string_view> tool_call_markers(ToolCallFormat format);

// A fresh call id: "call_" and 24 random letters and digits (OpenAI's form); for mistral 9 letters
// and digits, the only ids Mistral's chat templates accept back.
std::string new_tool_call_id(ToolCallFormat format);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as text (compact)
};

class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallFormat format);
  // tool_choice "required" or a named function: the request's grammar (structured_output.h,
  // forced_tool_grammar) made the whole answer the call(s): a JSON list of {"name", "parameters"}
  // objects, or the named function's arguments object. Nothing is given out before finish().
  static ToolCallParser forced(std::optional<std::string> function_name);

  struct Piece {
    std::string content;
    std::vector<ToolCall> calls;  // complete calls, in the order written
  };
  // The next text of the answer: what can be told apart now.
  Piece feed(std::string_view text);
  // The answer has ended: the text held back, as what it turned out to be (a call whose end
  // marker never came is still a call if its JSON is complete).
  Piece finish();

  int n_calls() const { return n_calls_; }

 private:
  enum class State {
    kText,   // content, looking for the start of a call
    kCall,   // pending_ starts with a call's start (marker or '{'), its end not yet known
    kBlock,  // deepseek_v3: inside <｜tool▁calls▁begin｜>, between calls
  };
  // What a call's text turned out to be, once it can be told.
  struct Match {
    enum Kind { kNeedMore, kCalls, kNotCall } kind = kNeedMore;
    size_t consumed = 0;          // bytes of pending_ it covers
    std::vector<ToolCall> calls;  // kCalls
  };

  void scan(Piece& out, bool final);
  bool scan_text(Piece& out, bool final);
  bool scan_block(Piece& out, bool final);
  // Where a call may start in pending_ (npos: nowhere), and how much of its end is held back as a
  // possible start that has not fully arrived.
  size_t find_start(bool final, size_t& hold) const;
  Match match_call(bool final) const;
  // Content text: whitespace next to a call is held (and dropped if a call follows).
  void emit(Piece& out, std::string_view text);
  void add_calls(Piece& out, std::vector<ToolCall>& calls);

  ToolCallFormat format_;
  bool forced_ = false;
  std::optional<std::string> forced_name_;  // a named function; none: "required"
  State state_ = State::kText;
  std::string pending_;    // text not yet attributed
  std::string ws_;         // trailing whitespace of the content so far, held back
  std::string call_ws_;    // the whitespace held when the current call (or block) started
  std::string gap_ws_;     // the whitespace before the last run of calls: kept if text follows
  std::string block_raw_;  // deepseek_v3: the block's start marker, while no call in it succeeded
  bool block_has_call_ = false;
  bool after_call_ = false;  // a call was the last thing: leading whitespace (and ';') dropped
  bool line_blank_ = true;   // llama3_json: only whitespace since the answer's or a line's start
  int n_calls_ = 0;
};

// The whole answer at once (a ToolCallParser fed once, then finished).
ToolCallParser::Piece parse_tool_calls(ToolCallFormat format, std::string_view text);

}  // namespace pagellm::server
