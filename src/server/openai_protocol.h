// The OpenAI request schemas (completions and chat completions, plus vLLM's common extensions),
// parsed and checked into plain structs. Every wrong type or value becomes an ApiError (400)
// naming the field, e.g. "'temperature' must be a number, got string". Unknown fields are
// ignored, as OpenAI's and vLLM's servers do. No model logic: token ids are checked against the
// vocabulary size given, and sampling ranges by SamplingParams::validate().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/grammar.h"
#include "sample/sampling_params.h"
#include "server/api_error.h"

namespace pagellm::server {

using Json = nlohmann::ordered_json;

// Deepest JSON nesting accepted; a deeper body is refused before it reaches the recursive parser.
inline constexpr int kMaxJsonDepth = 64;

// Parses a request body as a JSON object. Errors: 400 naming the problem (malformed JSON with
// its byte offset, nesting deeper than kMaxJsonDepth, not an object).
std::optional<ApiError> parse_json_body(const std::string& body, Json& out);

struct PromptInput {
  std::optional<std::string> text;  // a text prompt, or
  std::vector<int32_t> ids;         // token ids
};

struct GenerateRequest {
  bool chat = false;
  std::string model;  // "" when absent
  // Completions: one entry per prompt.
  std::vector<PromptInput> prompts;
  // Chat: the messages as the template sees them (content parts joined to text).
  Json messages;
  Json tools;                           // null or a list
  Json chat_template_kwargs = Json::object();
  bool add_generation_prompt = true;

  SamplingParams params;
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  bool return_token_ids = false;        // vLLM extension: choices[].token_ids
  bool skip_special_tokens = true;
  bool add_special_tokens = true;       // completions: BOS etc.; chat: false (template has them)
  // Completions: logprobs = N (top-N). Chat: logprobs = true with top_logprobs = N.
  std::optional<int32_t> logprobs;
  std::string user;
  // Structured output (response_format, guided_*, structured_outputs; server/structured_output.h)
  // and, once the server has compiled it, its grammar.
  std::optional<GrammarSpec> grammar;
  std::shared_ptr<const CompiledGrammar> compiled_grammar;
  // tool_choice "required" (an empty name) or a named function: the answer is the call(s).
  std::optional<std::string> forced_tool;
};

// `vocab_size` bounds token ids in prompts, logit_bias and stop_token_ids.
std::optional<ApiError> parse_completion_request(const Json& body, int32_t vocab_size,
                                                 GenerateRequest& out);
std::optional<ApiError> parse_chat_request(const Json& body, int32_t vocab_size,
                                           GenerateRequest& out);

// /tokenize: {"prompt": str} or {"messages": [...]} (+ add_special_tokens, add_generation_prompt).
struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;
  Json messages;  // null unless a chat request
  Json tools;
  Json chat_template_kwargs = Json::object();
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
  bool return_token_strs = false;
};
std::optional<ApiError> parse_tokenize_request(const Json& body, TokenizeRequest& out);

struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
std::optional<ApiError> parse_detokenize_request(const Json& body, int32_t vocab_size,
                                                 DetokenizeRequest& out);

// A float for JSON: -inf (a token the model rules out) becomes -9999.0, as OpenAI reports it.
double json_logprob(float lp);

}  // namespace pagellm::server
