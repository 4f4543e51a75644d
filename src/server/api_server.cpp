#include "server/api_server.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <thread>

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>

#include "core/log.h"
#include "core/version.h"
#include "server/openai_protocol.h"
#include "server/server_log.h"

namespace pagellm::server {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kReplace = Json::error_handler_t::replace;

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, kReplace);
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A float request parameter as the double its shortest decimal form names, so a trace shows the
// 0.7 the client sent rather than 0.699999988079071.
double float_param(float f) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, f);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

// Constant-time comparison, so the key cannot be guessed byte by byte from response times.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0 && !b.empty();
}

// The state of one completions / chat request: its prompts (one engine request each), its
// choices (prompts x n), and the response being built. Lives on the exchange's strand.
class Generation : public std::enable_shared_from_this<Generation> {
 public:
  struct Prompt {
    std::vector<int32_t> ids;
    std::string text;  // for echo
    uint64_t engine_id = 0;
    bool submitted = false;
    bool done = false;
    Status error;
    int32_t prompt_tokens = 0;
    int32_t completion_tokens = 0;
    int32_t cached_tokens = 0;
    std::vector<LogprobsResult> prompt_logprobs;
    Clock::time_point first_token{};
    Clock::time_point last_token{};
    FinishReason finish0 = FinishReason::kNone;  // sequence 0's (for the success counter)
    Clock::time_point scheduled{};               // EngineOutput::scheduled_time (epoch: never ran)
    std::vector<Clock::time_point> preemptions;
  };
  struct Choice {
    std::string text;
    std::vector<int32_t> token_ids;
    std::vector<LogprobsResult> logprobs;
    FinishReason finish = FinishReason::kNone;
    std::optional<int32_t> stop_token;
    std::optional<std::string> stop_string;
    bool started = false;  // streaming: first chunk (role / echo) sent
    int64_t text_offset = 0;
    Clock::time_point last_token{};
    // Chat with --reasoning-parser: the text split as it comes (reasoning_content, content).
    std::optional<ReasoningSplitter> splitter;
    // Chat with --tool-call-parser and tools: the calls taken out of the answer part.
    std::optional<ToolCallParser> tool_parser;
    std::string reasoning, content;  // with either parser: the text split so far
    std::vector<ToolCall> tool_calls;
  };
  // A choice's new text as its parsers split it.
  struct Parsed {
    std::string reasoning, content;
    std::vector<ToolCall> calls;
  };

  Generation(ApiServer& server, std::shared_ptr<Exchange> ex, GenerateRequest req)
      : server_(server), ex_(std::move(ex)), req_(std::move(req)) {
    id_ = (req_.chat ? "chatcmpl-" : "cmpl-") + random_hex_id();
    created_ = static_cast<int64_t>(std::time(nullptr));
  }

  std::vector<Prompt>& prompts() { return prompts_; }

  // Submits every prompt; on a refusal aborts those already queued and answers the error.
  // `span`: the request's trace span, or null (tracing off, or not sampled).
  void start(std::unique_ptr<Span> span) {
    span_ = std::move(span);
    auto self = shared_from_this();
    ex_->on_close([self] { self->abort_all(); });
    ex_->on_timeout([self] { self->timed_out(); });
    const int32_t n = req_.params.n;
    choices_.resize(prompts_.size() * static_cast<size_t>(n));
    if (req_.chat && server_.config().reasoning != ReasoningFormat::kNone)
      for (Choice& ch : choices_) ch.splitter.emplace(server_.config().reasoning);
    // Tool calls are looked for only where the request offers tools (tool_choice "none" has
    // dropped them by now).
    const ToolCallFormat tools = server_.config().tool_calls;
    const bool parse_tools =
        req_.chat && tools != ToolCallFormat::kNone && req_.tools.is_array() && !req_.tools.empty();
    if (req_.chat && req_.forced_tool) {  // the grammar makes the answer the call(s)
      for (Choice& ch : choices_)
        ch.tool_parser.emplace(ToolCallParser::forced(
            req_.forced_tool->empty() ? std::nullopt
                                      : std::optional<std::string>(*req_.forced_tool)));
    } else if (parse_tools) {
      for (Choice& ch : choices_) ch.tool_parser.emplace(tools);
    }
    for (size_t pi = 0; pi < prompts_.size(); ++pi) {
      Prompt& p = prompts_[pi];
      EngineRequest er;
      er.prompt = p.ids;
      er.params = req_.params;
      er.grammar = req_.compiled_grammar;
      if (er.grammar && req_.chat) er.thinking = server_.grammar_thinking();
      er.detokenize = server_.tokenizer() != nullptr;
      er.skip_special_tokens =
          req_.skip_special_tokens && !(parse_tools && markers_are_special(tools));
      auto r = server_.engine().submit(std::move(er), [self, pi](EngineOutput&& o) {
        // Engine thread: hand over to the connection's strand and return at once.
        self->ex_->post(
            [self, pi, o = std::move(o)]() mutable { self->on_output(pi, std::move(o)); });
      });
      if (!r.ok()) {
        abort_all();
        fail(error_from_status(r.status()));
        return;
      }
      p.engine_id = *r;
      p.submitted = true;
      server_.track(p.engine_id);
    }
  }

 private:
  // Whether the tokenizer makes one of the format's markers a special token (Mistral's
  // [TOOL_CALLS], Llama's <|python_tag|>, and some Qwen/Hermes checkpoints' <tool_call>): then
  // the answer is detokenized with its special tokens, or the parser would never see the marker.
  bool markers_are_special(ToolCallFormat format) const {
    const Tokenizer* t = server_.tokenizer();
    if (!t) return false;
    for (std::string_view m : tool_call_markers(format))
      if (auto id = t->token_to_id(m); id && t->is_special(*id)) return true;
    return false;
  }

  // A choice's next text through its parsers (the thought apart, then the calls out of the
  // answer part), added to the choice's totals. `last`: no more text will come, so nothing is
  // held back.
  static Parsed parse_text(Choice& ch, std::string_view text, bool last) {
    Parsed out;
    ReasoningSplitter::Piece piece{"", std::string(text)};
    if (ch.splitter) {
      piece = ch.splitter->feed(text);
      if (last) {
        ReasoningSplitter::Piece rest = ch.splitter->finish();
        piece.reasoning += rest.reasoning;
        piece.content += rest.content;
      }
    }
    out.reasoning = std::move(piece.reasoning);
    if (ch.tool_parser) {
      ToolCallParser::Piece t = ch.tool_parser->feed(piece.content);
      if (last) {
        ToolCallParser::Piece rest = ch.tool_parser->finish();
        t.content += rest.content;
        for (ToolCall& c : rest.calls) t.calls.push_back(std::move(c));
      }
      out.content = std::move(t.content);
      out.calls = std::move(t.calls);
    } else {
      out.content = std::move(piece.content);
    }
    ch.reasoning += out.reasoning;
    ch.content += out.content;
    ch.tool_calls.insert(ch.tool_calls.end(), out.calls.begin(), out.calls.end());
    return out;
  }

  // The finish reason a client sees: "tool_calls" where a choice that stopped by itself (not
  // cut off by max_tokens) holds tool calls.
  static std::string finish_name(const Choice& ch, FinishReason f) {
    if (f == FinishReason::kStop && !ch.tool_calls.empty()) return "tool_calls";
    return finish_reason_name(f);
  }

  static Json tool_calls_json(const std::vector<ToolCall>& calls) {
    Json out = Json::array();
    for (const ToolCall& c : calls)
      out.push_back({{"id", c.id},
                     {"type", "function"},
                     {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    return out;
  }

  void abort_all() {
    for (Prompt& p : prompts_)
      if (p.submitted && !p.done) server_.engine().abort(p.engine_id);
  }

  void timed_out() {
    timed_out_ = true;
    abort_all();
    ApiError e;
    e.status = 504;
    e.type = "timeout_error";
    e.message = "the request did not complete within --request-timeout";
    fail(e);
  }

  // Answers an error: a JSON error response, or (once streaming) an error event and the end.
  void fail(const ApiError& e) {
    if (finished_) return;
    finished_ = true;
    error_ = e;
    if (!ex_->started()) {
      Headers h;
      if (e.status == 429 || e.status == 503) h.emplace_back("Retry-After", "1");
      reply_error(server_.metrics(), *ex_, e, h);
    } else {
      ex_->send("data: " + error_body(e) + "\n\n");
      ex_->send("data: [DONE]\n\n");
      ex_->end_stream();
    }
    maybe_settle();
  }

  std::string token_text(int32_t id) const {
    if (const Tokenizer* t = server_.tokenizer()) {
      auto s = t->decode(std::span<const int32_t>(&id, 1), /*skip_special_tokens=*/false);
      if (s.ok()) return *s;
    }
    return "token_id:" + std::to_string(id);
  }

  static Json bytes_of(const std::string& s) {
    Json b = Json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  }

  // Chat format: [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...].
  Json chat_logprobs(const std::vector<int32_t>& ids,
                     const std::vector<LogprobsResult>& lps) const {
    Json content = Json::array();
    const int32_t top_n = req_.logprobs.value_or(0);
    for (size_t i = 0; i < ids.size() && i < lps.size(); ++i) {
      const std::string t = token_text(ids[i]);
      Json e = {{"token", t}, {"logprob", json_logprob(lps[i].logprob)}, {"bytes", bytes_of(t)}};
      Json top = Json::array();
      for (size_t k = 0; k < lps[i].top.size() && static_cast<int32_t>(k) < top_n; ++k) {
        const std::string tt = token_text(lps[i].top[k].token);
        top.push_back({{"token", tt},
                       {"logprob", json_logprob(lps[i].top[k].logprob)},
                       {"bytes", bytes_of(tt)}});
      }
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    return Json{{"content", std::move(content)}};
  }

  // Completions format, appended into `lp` ({tokens, token_logprobs, top_logprobs,
  // text_offset}). `first_null`: the first entry is the prompt's first token (no logprob).
  void completion_logprobs(Json& lp, const std::vector<int32_t>& ids,
                           const std::vector<LogprobsResult>& lps, bool first_null,
                           int64_t& offset) const {
    if (lp.is_null())
      lp = Json{{"tokens", Json::array()},
                {"token_logprobs", Json::array()},
                {"top_logprobs", Json::array()},
                {"text_offset", Json::array()}};
    const int32_t top_n = req_.logprobs.value_or(0);
    size_t li = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string t = token_text(ids[i]);
      lp["tokens"].push_back(t);
      lp["text_offset"].push_back(offset);
      offset += static_cast<int64_t>(t.size());
      if (i == 0 && first_null) {
        lp["token_logprobs"].push_back(nullptr);
        lp["top_logprobs"].push_back(nullptr);
        continue;
      }
      if (li >= lps.size()) {
        lp["token_logprobs"].push_back(nullptr);
        lp["top_logprobs"].push_back(nullptr);
        continue;
      }
      const LogprobsResult& r = lps[li++];
      lp["token_logprobs"].push_back(json_logprob(r.logprob));
      // The top-N alternatives, and always the chosen token (so up to N + 1 entries, as OpenAI).
      Json top = Json::object();
      for (size_t k = 0; k < r.top.size() && static_cast<int32_t>(k) < top_n; ++k)
        top[token_text(r.top[k].token)] = json_logprob(r.top[k].logprob);
      if (!top.contains(t)) top[t] = json_logprob(r.logprob);
      lp["top_logprobs"].push_back(std::move(top));
    }
  }

  Json chunk_base() const {
    Json c = {{"id", id_},
              {"object", req_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", server_.config().served_model_name}};
    if (req_.chat) c["system_fingerprint"] = nullptr;
    return c;
  }

  void send_chunk(Json choice) {
    Json c = chunk_base();
    c["choices"] = Json::array({std::move(choice)});
    if (req_.include_usage) c["usage"] = nullptr;
    ex_->send("data: " + dump(c) + "\n\n");
  }

  void begin_stream_if_needed() {
    if (ex_->started()) return;
    server_.metrics().observe_http(200);
    ex_->begin_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
  }

  // One engine event, streamed; `piece` is its text as the parsers split it (all content
  // without parsers).
  void stream_event(size_t pi, Choice& ch, size_t index, const EngineOutput& o,
                    const Parsed& piece) {
    begin_stream_if_needed();
    const Prompt& p = prompts_[pi];
    const bool first = !ch.started;
    ch.started = true;
    const bool has_lp = req_.logprobs.has_value() && !o.token_ids.empty();
    if (req_.chat) {
      if (first) {
        Json c0 = {{"index", index},
                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
        send_chunk(std::move(c0));
      }
      const bool has_text = !piece.content.empty() || !piece.reasoning.empty();
      if (!has_text && piece.calls.empty() && o.finish == FinishReason::kNone && !has_lp &&
          !req_.return_token_ids)
        return;
      // The event's text, then each tool call completed with it as OpenAI streams one: a chunk
      // with its index, id and name (arguments ""), then its arguments. The first chunk carries
      // the event's logprobs and token ids, the last its finish reason.
      std::vector<Json> deltas;
      if (has_text || piece.calls.empty() || has_lp || req_.return_token_ids) {
        Json delta = Json::object();
        if (!piece.reasoning.empty()) delta["reasoning_content"] = piece.reasoning;
        if (!piece.content.empty()) delta["content"] = piece.content;
        deltas.push_back(std::move(delta));
      }
      size_t call_index = ch.tool_calls.size() - piece.calls.size();
      for (const ToolCall& call : piece.calls) {
        Json head = {{"index", call_index},
                     {"id", call.id},
                     {"type", "function"},
                     {"function", {{"name", call.name}, {"arguments", ""}}}};
        deltas.push_back({{"tool_calls", Json::array({std::move(head)})}});
        Json args = {{"index", call_index}, {"function", {{"arguments", call.arguments}}}};
        deltas.push_back({{"tool_calls", Json::array({std::move(args)})}});
        ++call_index;
      }
      for (size_t k = 0; k < deltas.size(); ++k) {
        const bool last = k + 1 == deltas.size();
        Json c = {
            {"index", index},
            {"delta", std::move(deltas[k])},
            {"logprobs", k == 0 && has_lp ? chat_logprobs(o.token_ids, o.logprobs) : Json(nullptr)},
            {"finish_reason", last && o.finish != FinishReason::kNone
                                  ? Json(finish_name(ch, o.finish))
                                  : Json(nullptr)}};
        if (k == 0 && req_.return_token_ids) c["token_ids"] = o.token_ids;
        send_chunk(std::move(c));
      }
      return;
    }
    std::string text;
    Json lp = nullptr;
    if (first && req_.echo) {
      text = p.text;
      if (req_.logprobs) completion_logprobs(lp, p.ids, p.prompt_logprobs, true, ch.text_offset);
    }
    text += o.text;
    if (has_lp) completion_logprobs(lp, o.token_ids, o.logprobs, false, ch.text_offset);
    if (text.empty() && o.finish == FinishReason::kNone && lp.is_null() && !req_.return_token_ids)
      return;
    Json c = {
        {"index", index},
        {"text", std::move(text)},
        {"logprobs", std::move(lp)},
        {"finish_reason",
         o.finish == FinishReason::kNone ? Json(nullptr) : Json(finish_reason_name(o.finish))}};
    if (req_.return_token_ids) c["token_ids"] = o.token_ids;
    send_chunk(std::move(c));
  }

  void on_output(size_t pi, EngineOutput o) {
    const auto now = Clock::now();
    Prompt& p = prompts_[pi];
    if (p.done) return;
    if (!o.prompt_logprobs.empty()) p.prompt_logprobs = std::move(o.prompt_logprobs);
    if (!o.request_done) {
      const size_t index =
          pi * static_cast<size_t>(req_.params.n) + static_cast<size_t>(o.seq_index);
      if (index >= choices_.size()) return;  // cannot happen: the engine numbers sequences 0..n-1
      Choice& ch = choices_[index];
      if (!o.token_ids.empty()) {
        if (p.first_token == Clock::time_point{}) p.first_token = now;
        if (ch.last_token != Clock::time_point{})
          server_.metrics().observe_inter_token(seconds_between(ch.last_token, now));
        ch.last_token = now;
        p.last_token = now;
      }
      ch.text += o.text;
      // The choice's last text (a finish reason) leaves nothing held back.
      const Parsed piece = parse_text(ch, o.text, o.finish != FinishReason::kNone);
      ch.token_ids.insert(ch.token_ids.end(), o.token_ids.begin(), o.token_ids.end());
      if (req_.logprobs)
        for (auto& l : o.logprobs) ch.logprobs.push_back(std::move(l));
      if (o.finish != FinishReason::kNone) {
        ch.finish = o.finish;
        ch.stop_token = o.stop_token;
        ch.stop_string = o.stop_string;
        if (o.seq_index == 0) p.finish0 = o.finish;
      }
      if (req_.stream && !finished_ && !ex_->closed()) stream_event(pi, ch, index, o, piece);
      return;
    }
    p.done = true;
    server_.untrack(p.engine_id);
    p.error = o.error;
    p.prompt_tokens = o.prompt_tokens;
    p.completion_tokens = o.completion_tokens;
    p.cached_tokens = o.cached_tokens;
    p.scheduled = o.scheduled_time;
    p.preemptions = std::move(o.preemption_times);
    record(p, o, now);
    if (!o.error.ok() && !finished_) {
      abort_all();
      fail(error_from_status(o.error));
    } else if (std::all_of(prompts_.begin(), prompts_.end(),
                           [](const Prompt& q) { return q.done; })) {
      finish();
    }
    maybe_settle();  // the response may have ended before (an error, a timeout)
  }

  void record(const Prompt& p, const EngineOutput& o, Clock::time_point now) {
    RequestRecord r;
    const auto arrival = ex_->request().arrival;
    r.e2e = seconds_between(arrival, now);
    if (o.scheduled_time != Clock::time_point{}) {
      r.queue = std::max(0.0, seconds_between(arrival, o.scheduled_time));
      if (p.first_token != Clock::time_point{})
        r.prefill = std::max(0.0, seconds_between(o.scheduled_time, p.first_token));
    }
    if (p.first_token != Clock::time_point{}) {
      r.ttft = seconds_between(arrival, p.first_token);
      r.decode = std::max(0.0, seconds_between(p.first_token, p.last_token));
    }
    r.prompt_tokens = o.prompt_tokens;
    r.generation_tokens = o.completion_tokens;
    r.finish = o.error.ok() ? (o.finish == FinishReason::kAbort ? FinishReason::kAbort : p.finish0)
                            : FinishReason::kAbort;
    if (r.finish == FinishReason::kNone) r.finish = FinishReason::kAbort;
    if (o.error.ok() || o.scheduled_time != Clock::time_point{})
      server_.metrics().observe_request(r);
  }

  Json usage() const {
    int64_t pt = 0, ct = 0, cached = 0;
    for (const Prompt& p : prompts_) {
      pt += p.prompt_tokens;
      ct += p.completion_tokens;
      cached += p.cached_tokens;
    }
    return Json{{"prompt_tokens", pt},
                {"completion_tokens", ct},
                {"total_tokens", pt + ct},
                {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  Json stop_reason(const Choice& ch) const {
    if (ch.stop_string) return *ch.stop_string;
    if (ch.stop_token) return *ch.stop_token;
    return nullptr;
  }

  bool engine_done() const {
    return std::all_of(prompts_.begin(), prompts_.end(),
                       [](const Prompt& p) { return !p.submitted || p.done; });
  }

  // The request is over once its response has ended and every engine request it submitted has
  // ended too (an aborted or failed one still reports its usage and times). Then: the exchange's
  // callbacks, which hold this object, are dropped (so it is freed once the engine lets go of it),
  // and the span is ended.
  void maybe_settle() {
    if (settled_ || !finished_ || !engine_done()) return;
    settled_ = true;
    ex_->on_close(nullptr);
    ex_->on_timeout(nullptr);
    if (span_) end_span();
  }

  // The request's span: vLLM's attribute names (vllm/tracing: SpanAttributes), latencies in
  // seconds measured as the metrics' are (metrics.h), over all prompts of the request: queue =
  // first scheduled - arrival, prefill = first token - first scheduled, decode = last token -
  // first token, inference = last token - first scheduled.
  void end_span() {
    Span& s = *span_;
    const auto arrival = ex_->request().arrival;
    const auto now = Clock::now();
    const ClockAnchor anchor = ClockAnchor::now();
    s.set("gen_ai.operation.name", std::string(req_.chat ? "chat" : "text_completion"));
    s.set("gen_ai.request.id", id_);
    s.set("gen_ai.response.model", server_.config().served_model_name);
    if (req_.params.max_tokens)
      s.set("gen_ai.request.max_tokens", int64_t{*req_.params.max_tokens});
    s.set("gen_ai.request.temperature", float_param(req_.params.temperature));
    s.set("gen_ai.request.top_p", float_param(req_.params.top_p));
    s.set("gen_ai.request.n", int64_t{req_.params.n});
    int64_t pt = 0, ct = 0, cached = 0, n_preempt = 0;
    Clock::time_point scheduled{}, first{}, last{};
    auto earliest = [](Clock::time_point& acc, Clock::time_point t) {
      if (t != Clock::time_point{} && (acc == Clock::time_point{} || t < acc)) acc = t;
    };
    for (size_t i = 0; i < prompts_.size(); ++i) {
      const Prompt& p = prompts_[i];
      pt += p.prompt_tokens;
      ct += p.completion_tokens;
      cached += p.cached_tokens;
      earliest(scheduled, p.scheduled);
      earliest(first, p.first_token);
      last = std::max(last, p.last_token);
      for (Clock::time_point t : p.preemptions) {
        SpanEvent e;
        e.time_unix_nano = anchor.to_unix_nano(t);
        e.name = "preempted";
        e.attributes.push_back({"pagellm.prompt_index", static_cast<int64_t>(i)});
        s.events.push_back(std::move(e));
        ++n_preempt;
      }
    }
    s.set("gen_ai.usage.prompt_tokens", pt);
    s.set("gen_ai.usage.completion_tokens", ct);
    s.set("gen_ai.usage.cached_tokens", cached);
    s.set("gen_ai.usage.num_sequences", static_cast<int64_t>(choices_.size()));
    s.set("gen_ai.latency.e2e", seconds_between(arrival, now));
    if (scheduled != Clock::time_point{})
      s.set("gen_ai.latency.time_in_queue", std::max(0.0, seconds_between(arrival, scheduled)));
    if (first != Clock::time_point{}) {
      s.set("gen_ai.latency.time_to_first_token", seconds_between(arrival, first));
      s.set("gen_ai.latency.time_in_model_decode", std::max(0.0, seconds_between(first, last)));
      if (scheduled != Clock::time_point{}) {
        s.set("gen_ai.latency.time_in_model_prefill",
              std::max(0.0, seconds_between(scheduled, first)));
        s.set("gen_ai.latency.time_in_model_inference",
              std::max(0.0, seconds_between(scheduled, last)));
      }
    }
    std::vector<std::string> reasons;
    reasons.reserve(choices_.size());
    for (const Choice& ch : choices_)
      reasons.emplace_back(ch.finish == FinishReason::kNone ? "abort"
                                                            : finish_reason_name(ch.finish));
    s.set("gen_ai.response.finish_reasons", std::move(reasons));
    s.set("pagellm.stream", req_.stream);
    s.set("pagellm.num_preemptions", n_preempt);
    if (ex_->closed() && !error_) s.set("pagellm.client_disconnected", true);
    server_.end_span(std::move(span_), *ex_, error_ ? &*error_ : nullptr);
  }

  void finish() {
    if (finished_) return;
    finished_ = true;
    respond_final();
    maybe_settle();
  }

  // The whole response, or the end of the stream, once every prompt is done.
  void respond_final() {
    if (req_.stream) {
      if (ex_->closed()) return;
      begin_stream_if_needed();
      if (req_.include_usage) {
        Json c = chunk_base();
        c["choices"] = Json::array();
        c["usage"] = usage();
        ex_->send("data: " + dump(c) + "\n\n");
      }
      ex_->send("data: [DONE]\n\n");
      ex_->end_stream();
      return;
    }
    if (ex_->closed()) return;
    Json body = {{"id", id_},
                 {"object", req_.chat ? "chat.completion" : "text_completion"},
                 {"created", created_},
                 {"model", server_.config().served_model_name}};
    Json choices = Json::array();
    const size_t n = static_cast<size_t>(req_.params.n);
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& ch = choices_[i];
      const Prompt& p = prompts_[i / n];
      const Json finish =
          ch.finish == FinishReason::kNone ? Json("abort") : Json(finish_name(ch, ch.finish));
      Json c;
      if (req_.chat) {
        Json message = {{"role", "assistant"}, {"content", ch.text}};
        if (ch.splitter || ch.tool_parser) {
          // An aborted choice may still hold back a partial marker or an unfinished call.
          Choice rest;
          const Choice* parsed = &ch;
          if (ch.finish == FinishReason::kNone) {
            rest.splitter = ch.splitter;
            rest.tool_parser = ch.tool_parser;
            rest.reasoning = ch.reasoning;
            rest.content = ch.content;
            rest.tool_calls = ch.tool_calls;
            parse_text(rest, "", /*last=*/true);
            parsed = &rest;
          }
          const std::string& reasoning = parsed->reasoning;
          const std::string& content = parsed->content;
          if (ch.splitter)
            message["reasoning_content"] = reasoning.empty() ? Json(nullptr) : Json(reasoning);
          // null where the answer is all thought or all calls
          message["content"] =
              content.empty() && (!reasoning.empty() || !parsed->tool_calls.empty())
                  ? Json(nullptr)
                  : Json(content);
          if (!parsed->tool_calls.empty())
            message["tool_calls"] = tool_calls_json(parsed->tool_calls);
        }
        c = {{"index", i},
             {"message", std::move(message)},
             {"logprobs", req_.logprobs ? chat_logprobs(ch.token_ids, ch.logprobs) : Json(nullptr)},
             {"finish_reason", finish},
             {"stop_reason", stop_reason(ch)}};
      } else {
        Json lp = nullptr;
        int64_t offset = 0;
        if (req_.logprobs) {
          if (req_.echo) completion_logprobs(lp, p.ids, p.prompt_logprobs, true, offset);
          completion_logprobs(lp, ch.token_ids, ch.logprobs, false, offset);
        }
        c = {{"index", i},
             {"text", req_.echo ? p.text + ch.text : ch.text},
             {"logprobs", std::move(lp)},
             {"finish_reason", finish},
             {"stop_reason", stop_reason(ch)}};
        if (req_.return_token_ids) c["prompt_token_ids"] = p.ids;
      }
      if (req_.return_token_ids) c["token_ids"] = ch.token_ids;
      choices.push_back(std::move(c));
    }
    body["choices"] = std::move(choices);
    body["usage"] = usage();
    if (req_.chat) body["system_fingerprint"] = nullptr;
    server_.metrics().observe_http(200);
    ex_->respond(200, "application/json", dump(body));
  }

  ApiServer& server_;
  std::shared_ptr<Exchange> ex_;
  GenerateRequest req_;
  std::string id_;
  int64_t created_ = 0;
  std::vector<Prompt> prompts_;
  std::vector<Choice> choices_;
  bool finished_ = false;  // the response has ended (or was abandoned by the client)
  bool timed_out_ = false;
  bool settled_ = false;  // maybe_settle() ran
  std::unique_ptr<Span> span_;
  std::optional<ApiError> error_;  // what fail() answered
};

}  // namespace

void reply_error(ServerMetrics& metrics, Exchange& ex, const ApiError& e, Headers extra) {
  metrics.observe_http(e.status);
  if (e.status >= 500) {
    log_request(LogLevel::kWarn, ex.request_id(), "error: " + e.message, {{"status", e.status}});
  } else {
    log_request(LogLevel::kDebug, ex.request_id(), "refused: " + e.message, {{"status", e.status}});
  }
  ex.respond(e.status, "application/json", error_body(e), std::move(extra));
}

ApiServer::ApiServer(ApiServerConfig config, Engine& engine, const Tokenizer* tokenizer,
                     const ChatTemplate* chat_template)
    : config_(std::move(config)),
      engine_(engine),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      metrics_(config_.served_model_name, engine.max_model_len()),
      created_(static_cast<int64_t>(std::time(nullptr))) {
  http_ = std::make_unique<HttpServer>(
      config_.http, [this](std::shared_ptr<Exchange> ex) { handle(std::move(ex)); });
  // Structured output binds a reasoning model's answer, not its thought: the grammar starts
  // after </think>. Both markers are single tokens in DeepSeek-R1's and Qwen3's vocabularies.
  if (config_.reasoning != ReasoningFormat::kNone && tokenizer_) {
    const auto start = tokenizer_->token_to_id("<think>");
    const auto end = tokenizer_->token_to_id("</think>");
    if (start && end) {
      thinking_ =
          EngineRequest::Thinking{*start, *end, config_.reasoning == ReasoningFormat::kDeepSeekR1};
    } else {
      PAGELLM_LOG_WARN(
          "--reasoning-parser: <think> and </think> are not single tokens here, so "
          "structured output binds the whole answer, thought included");
    }
  }
}

ApiServer::~ApiServer() {
  grammar_pool_.stop();  // compiles not started are dropped; one under way finishes
  grammar_pool_.join();
  engine_.shutdown();  // its last callbacks post into the I/O context, which must still exist
  http_->stop();
  if (tracer_) tracer_->shutdown(config_.tracing.shutdown_timeout_s);
}

Status ApiServer::start() {
  if (!config_.tracing.endpoint.empty() && !tracer_) {
    auto t = TraceExporter::create(config_.tracing, version());
    if (!t.ok()) return t.status();
    tracer_ = std::move(*t);
    log_request(
        LogLevel::kInfo, "", "tracing: spans go to an OTLP/HTTP collector",
        {{"endpoint", config_.tracing.endpoint}, {"service_name", config_.tracing.service_name}});
  }
  // Signals are caught from here on (before "listening" is printed), so a SIGTERM always drains.
  signals_ = std::make_unique<boost::asio::signal_set>(http_->io_context(), SIGINT, SIGTERM);
  wait_signal();
  return http_->start();
}

void ApiServer::wait_signal() {
  signals_->async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    log_request(LogLevel::kInfo, "",
                std::string("received ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT"));
    request_stop();
    wait_signal();
  });
}

void ApiServer::track(uint64_t id) {
  std::lock_guard<std::mutex> lock(live_mu_);
  live_.insert(id);
}
void ApiServer::untrack(uint64_t id) {
  std::lock_guard<std::mutex> lock(live_mu_);
  live_.erase(id);
}
int64_t ApiServer::n_tracked() const {
  std::lock_guard<std::mutex> lock(live_mu_);
  return static_cast<int64_t>(live_.size());
}
void ApiServer::abort_all() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(live_mu_);
    ids.assign(live_.begin(), live_.end());
  }
  for (uint64_t id : ids) engine_.abort(id);
}

void ApiServer::request_stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  ++n_stop_requests_;
  stop_cv_.notify_all();
}

int ApiServer::run_until_stopped() {
  {
    std::unique_lock<std::mutex> lock(stop_mu_);
    stop_cv_.wait(lock, [&] { return n_stop_requests_ > 0; });
  }
  const auto t0 = Clock::now();
  log_request(LogLevel::kInfo, "", "draining: no new connections; waiting for requests in flight",
              {{"in_flight", http_->n_active()}, {"drain_timeout_s", config_.drain_timeout_s}});
  http_->begin_drain();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(config_.drain_timeout_s));
  {
    std::unique_lock<std::mutex> lock(stop_mu_);
    while (Clock::now() < deadline && n_stop_requests_ < 2 &&
           (http_->n_active() > 0 || n_tracked() > 0))
      stop_cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
  if (http_->n_active() > 0 || n_tracked() > 0) {
    log_request(LogLevel::kWarn, "", "drain timeout: aborting the requests still in flight",
                {{"in_flight", http_->n_active()}});
    abort_all();
    // Aborted streams end (finish_reason "abort") within a step or two.
    const auto until = Clock::now() + std::chrono::seconds(2);
    while (Clock::now() < until && http_->n_active() > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  boost::system::error_code ignored;
  signals_->cancel(ignored);
  engine_.shutdown();
  http_->stop();
  if (tracer_) {  // the spans of the requests that just ended, within its own time limit
    tracer_->shutdown(config_.tracing.shutdown_timeout_s);
    const TraceExportStats st = tracer_->stats();
    log_request(
        LogLevel::kInfo, "", "tracing: stopped",
        {{"spans_exported", st.exported}, {"spans_dropped", st.dropped_queue + st.dropped_export}});
  }
  log_request(LogLevel::kInfo, "", "stopped",
              {{"drain_s", std::round(seconds_between(t0, Clock::now()) * 1000) / 1000}});
  return 0;
}

bool ApiServer::authorized(const HttpRequest& r) const {
  if (config_.api_key.empty()) return true;
  std::string_view h = r.header("authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (h.size() < kBearer.size() ||
      !std::equal(kBearer.begin(), kBearer.end(), h.begin(), [](char a, char b) {
        return std::tolower(static_cast<unsigned char>(a)) ==
               std::tolower(static_cast<unsigned char>(b));
      }))
    return false;
  h.remove_prefix(kBearer.size());
  return same_secret(h, config_.api_key);
}

std::optional<ApiError> ApiServer::check_model(const std::string& model) const {
  if (model.empty() || model == config_.served_model_name) return std::nullopt;
  ApiError e;
  e.status = 404;
  e.message = "The model '" + model + "' does not exist (this server serves '" +
              config_.served_model_name + "')";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

void ApiServer::handle(std::shared_ptr<Exchange> ex) {
  const HttpRequest& r = ex->request();
  const std::string& path = r.path;
  const std::string& m = r.method;
  struct Route {
    const char* path;
    const char* method;
    bool prefix;
    bool auth;
  };
  static const Route kRoutes[] = {
      {"/v1/completions", "POST", false, true}, {"/v1/chat/completions", "POST", false, true},
      {"/v1/models", "GET", false, true},       {"/v1/models/", "GET", true, true},
      {"/tokenize", "POST", false, true},       {"/detokenize", "POST", false, true},
      {"/health", "GET", false, false},         {"/version", "GET", false, false},
      {"/metrics", "GET", false, false},        {"/ping", "GET", false, false},
  };
  const Route* route = nullptr;
  for (const Route& rt : kRoutes) {
    if (rt.prefix ? (path.rfind(rt.path, 0) == 0 && path.size() > std::strlen(rt.path))
                  : path == rt.path) {
      route = &rt;
      break;
    }
  }
  if (!route) {
    ApiError e;
    e.status = 404;
    e.message = "no such endpoint: " + path;
    return reply_error(metrics_, *ex, e);
  }
  if (m != route->method) {
    ApiError e;
    e.status = 405;
    e.message = "method " + m + " is not allowed on " + path + " (use " + route->method + ")";
    return reply_error(metrics_, *ex, e, {{"Allow", route->method}});
  }
  if (route->auth && !authorized(r)) {
    ApiError e;
    e.status = 401;
    e.message = "missing or incorrect API key: send 'Authorization: Bearer <key>'";
    e.code = "invalid_api_key";
    return reply_error(metrics_, *ex, e, {{"WWW-Authenticate", "Bearer"}});
  }
  const std::string_view rp = route->path;
  if (rp == "/v1/completions") return handle_generate(ex, false);
  if (rp == "/v1/chat/completions") return handle_generate(ex, true);
  if (rp == "/v1/models") return handle_models(ex, "");
  if (rp == "/v1/models/") return handle_models(ex, path.substr(rp.size()));
  if (rp == "/tokenize") return handle_tokenize(ex);
  if (rp == "/detokenize") return handle_detokenize(ex);
  if (rp == "/health" || rp == "/ping") {
    if (http_->draining()) {
      ApiError e;
      e.status = 503;
      e.message = "the server is shutting down";
      return reply_error(metrics_, *ex, e);
    }
    metrics_.observe_http(200);
    return ex->respond(200, "", "");
  }
  if (rp == "/version") {
    metrics_.observe_http(200);
    return ex->respond(200, "application/json",
                       dump(Json{{"version", version()}, {"commit", build_commit()}}));
  }
  if (rp == "/metrics") {
    metrics_.observe_http(200);
    const TraceExportStats trace_stats = tracer_ ? tracer_->stats() : TraceExportStats{};
    const GrammarCompileStats grammar_stats =
        engine_.grammars() ? engine_.grammars()->stats() : GrammarCompileStats{};
    return ex->respond(
        200, "text/plain; version=0.0.4; charset=utf-8",
        metrics_.render(engine_.stats(), http_->n_connections(), tracer_ ? &trace_stats : nullptr,
                        engine_.grammars() ? &grammar_stats : nullptr));
  }
}

void ApiServer::handle_models(const std::shared_ptr<Exchange>& ex, const std::string& id) {
  Json card = {{"id", config_.served_model_name},
               {"object", "model"},
               {"created", created_},
               {"owned_by", "pagellm"},
               {"root", config_.model_path},
               {"parent", nullptr},
               {"max_model_len", engine_.max_model_len()},
               {"permission", Json::array()}};
  if (!id.empty()) {
    if (auto e = check_model(id)) return reply_error(metrics_, *ex, *e);
    metrics_.observe_http(200);
    return ex->respond(200, "application/json", dump(card));
  }
  metrics_.observe_http(200);
  ex->respond(200, "application/json",
              dump(Json{{"object", "list"}, {"data", Json::array({card})}}));
}

std::unique_ptr<Span> ApiServer::start_span(const Exchange& ex) const {
  if (!tracer_) return nullptr;
  const HttpRequest& r = ex.request();
  auto parent = extract_trace_parent(r.headers);
  if (parent && !parent->sampled()) return nullptr;  // the caller records none of this trace
  auto s = std::make_unique<Span>();
  if (parent) {
    s->trace_id = parent->trace_id;
    s->parent_span_id = parent->span_id;
    s->parent_is_remote = true;
    s->trace_flags = parent->flags & 0x03;  // sampled, and Trace Context Level 2's random-id bit
    s->trace_state = std::move(parent->trace_state);
  } else {
    s->trace_id = new_trace_id();
    s->trace_flags = kTraceFlagSampled;
  }
  s->span_id = new_span_id();
  s->name = r.method + " " + r.path;  // OpenTelemetry's HTTP server span name: method and route
  s->kind = SpanKind::kServer;
  return s;
}

void ApiServer::end_span(std::unique_ptr<Span> span, const Exchange& ex, const ApiError* error) {
  if (!span || !tracer_) return;
  const HttpRequest& r = ex.request();
  const ClockAnchor anchor = ClockAnchor::now();
  span->start_time_unix_nano = anchor.to_unix_nano(r.arrival);
  span->end_time_unix_nano = anchor.unix_nano;
  span->set("http.request.method", r.method);
  span->set("url.path", r.path);
  if (ex.status() != 0) span->set("http.response.status_code", int64_t{ex.status()});
  span->set("pagellm.request_id", r.request_id);
  // ERROR when the server failed the request: a 5xx, a 429 (its queue was full), or an error
  // after the stream had begun (the response status is then 200). Other 4xx are the client's
  // mistakes and stay UNSET, as OpenTelemetry's HTTP conventions have it for server spans.
  if (error && (error->status >= 500 || error->status == 429 || ex.status() != error->status)) {
    span->status = SpanStatusCode::kError;
    span->status_message = error->message;
    span->set("error.type", error->type.empty() ? std::to_string(error->status) : error->type);
  }
  tracer_->submit(std::move(*span));
}

void ApiServer::refuse(Exchange& ex, std::unique_ptr<Span> span, const ApiError& e, Headers extra) {
  reply_error(metrics_, ex, e, std::move(extra));
  end_span(std::move(span), ex, &e);
}

void ApiServer::handle_generate(const std::shared_ptr<Exchange>& ex, bool chat) {
  const HttpRequest& r = ex->request();
  // Tracing: refused requests get a span too (their status code tells why).
  std::unique_ptr<Span> span = start_span(*ex);
  Json body;
  if (auto e = parse_json_body(r.body, body)) return refuse(*ex, std::move(span), *e);
  const int32_t vocab = static_cast<int32_t>(engine_.model_config().vocab_size);
  GenerateRequest req;
  if (auto e =
          chat ? parse_chat_request(body, vocab, req) : parse_completion_request(body, vocab, req))
    return refuse(*ex, std::move(span), *e);
  if (auto e = check_model(req.model)) return refuse(*ex, std::move(span), *e);
  if (!req.grammar) return start_generation(ex, chat, std::move(req), std::move(span));
  // Compiled once per distinct spec (later requests with it take the cached grammar), before
  // the request is queued, so that a schema, regex or grammar that does not compile is this
  // request's 400.
  GrammarCompiler* grammars = engine_.grammars();
  if (!grammars)
    return refuse(*ex, std::move(span),
                  bad_request("structured output needs the model's tokenizer, which this server "
                              "does not have"));
  if (auto g = grammars->find(*req.grammar)) {
    req.compiled_grammar = std::move(g);
    return start_generation(ex, chat, std::move(req), std::move(span));
  }
  // Not built yet: on grammar_pool_, then back on this exchange's strand.
  struct Pending {
    GenerateRequest req;
    std::unique_ptr<Span> span;
    Result<std::shared_ptr<const CompiledGrammar>> grammar = internal_error("not compiled");
  };
  auto p = std::make_shared<Pending>(Pending{std::move(req), std::move(span)});
  boost::asio::post(grammar_pool_, [this, ex, chat, grammars, p] {
    p->grammar = grammars->compile(*p->req.grammar);
    ex->post([this, ex, chat, p] {
      // The client left, or the request timed out (answered by the server), meanwhile.
      if (ex->closed() || ex->started()) return;
      if (!p->grammar.ok())
        return refuse(*ex, std::move(p->span),
                      bad_request("invalid structured output: " + p->grammar.status().message()));
      p->req.compiled_grammar = std::move(*p->grammar);
      start_generation(ex, chat, std::move(p->req), std::move(p->span));
    });
  });
}

void ApiServer::start_generation(const std::shared_ptr<Exchange>& ex, bool chat,
                                      GenerateRequest req, std::unique_ptr<Span> span) {
  auto refuse = [&](const ApiError& e, Headers extra = {}) {
    this->refuse(*ex, std::move(span), e, std::move(extra));
  };
  if (req.compiled_grammar) metrics_.observe_structured_request();
  if (http_->draining()) {
    ApiError e;
    e.status = 503;
    e.message = "the server is shutting down";
    return refuse(e, {{"Retry-After", "1"}});
  }

  auto gen = std::make_shared<Generation>(*this, ex, req);
  auto& prompts = gen->prompts();
  if (chat) {
    if (!tokenizer_ || !chat_template_)
      return refuse(
          bad_request("this model has no chat template (or tokenizer): use /v1/completions"));
    ChatRequest cr;
    cr.messages = req.messages;
    cr.add_generation_prompt = req.add_generation_prompt;
    cr.tools = req.tools;
    cr.extra = req.chat_template_kwargs;
    auto text = chat_template_->apply(cr);
    if (!text.ok()) return refuse(error_from_status(text.status(), "messages"));
    auto ids = tokenizer_->encode(*text, /*add_special_tokens=*/false);
    if (!ids.ok()) return refuse(error_from_status(ids.status(), "messages"));
    Generation::Prompt p;
    p.ids = std::move(*ids);
    prompts.push_back(std::move(p));
  } else {
    for (const PromptInput& in : req.prompts) {
      Generation::Prompt p;
      if (in.text) {
        if (!tokenizer_)
          return refuse(
              bad_request("this model has no tokenizer: send the prompt as token ids", "prompt"));
        auto ids = tokenizer_->encode(*in.text, req.add_special_tokens);
        if (!ids.ok()) return refuse(error_from_status(ids.status(), "prompt"));
        p.ids = std::move(*ids);
        p.text = *in.text;
      } else {
        p.ids = in.ids;
        if (req.echo && tokenizer_) {
          auto t = tokenizer_->decode(p.ids, req.skip_special_tokens);
          if (t.ok()) p.text = std::move(*t);
        }
      }
      if (p.ids.empty()) return refuse(bad_request("the prompt is empty (no tokens)", "prompt"));
      prompts.push_back(std::move(p));
    }
  }
  // The context check, with both numbers, before anything is queued.
  const int32_t ctx = engine_.max_model_len();
  for (const auto& p : prompts) {
    const int64_t n = static_cast<int64_t>(p.ids.size());
    if (n >= ctx)
      return refuse(bad_request("This model's maximum context length is " + std::to_string(ctx) +
                                    " tokens, but the prompt has " + std::to_string(n) + " tokens",
                                chat ? "messages" : "prompt"));
    if (req.params.max_tokens && n + *req.params.max_tokens > ctx)
      return refuse(bad_request("This model's maximum context length is " + std::to_string(ctx) +
                                    " tokens, but " + std::to_string(n) + " prompt tokens + " +
                                    std::to_string(*req.params.max_tokens) +
                                    " max_tokens = " + std::to_string(n + *req.params.max_tokens) +
                                    " tokens were requested",
                                chat ? "max_completion_tokens" : "max_tokens"));
  }
  log_request(LogLevel::kDebug, ex->request_id(), chat ? "chat completion" : "completion",
              {{"prompts", prompts.size()}, {"n", req.params.n}, {"stream", req.stream}});
  gen->start(std::move(span));
}

void ApiServer::handle_tokenize(const std::shared_ptr<Exchange>& ex) {
  Json body;
  if (auto e = parse_json_body(ex->request().body, body)) return reply_error(metrics_, *ex, *e);
  TokenizeRequest req;
  if (auto e = parse_tokenize_request(body, req)) return reply_error(metrics_, *ex, *e);
  if (auto e = check_model(req.model)) return reply_error(metrics_, *ex, *e);
  if (!tokenizer_) return reply_error(metrics_, *ex, bad_request("this model has no tokenizer"));
  std::string text;
  if (req.prompt) {
    text = *req.prompt;
  } else {
    if (!chat_template_)
      return reply_error(metrics_, *ex, bad_request("this model has no chat template", "messages"));
    ChatRequest cr;
    cr.messages = req.messages;
    cr.add_generation_prompt = req.add_generation_prompt;
    cr.tools = req.tools;
    cr.extra = req.chat_template_kwargs;
    auto t = chat_template_->apply(cr);
    if (!t.ok()) return reply_error(metrics_, *ex, error_from_status(t.status(), "messages"));
    text = std::move(*t);
  }
  auto ids = tokenizer_->encode(text, req.add_special_tokens);
  if (!ids.ok()) return reply_error(metrics_, *ex, error_from_status(ids.status(), "prompt"));
  Json out = {{"count", ids->size()}, {"max_model_len", engine_.max_model_len()}, {"tokens", *ids}};
  if (req.return_token_strs) {
    Json strs = Json::array();
    for (int32_t id : *ids) {
      auto s = tokenizer_->id_to_token(id);
      strs.push_back(s ? Json(*s) : Json(nullptr));
    }
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  metrics_.observe_http(200);
  ex->respond(200, "application/json", dump(out));
}

void ApiServer::handle_detokenize(const std::shared_ptr<Exchange>& ex) {
  Json body;
  if (auto e = parse_json_body(ex->request().body, body)) return reply_error(metrics_, *ex, *e);
  DetokenizeRequest req;
  const int32_t vocab = static_cast<int32_t>(engine_.model_config().vocab_size);
  if (auto e = parse_detokenize_request(body, vocab, req)) return reply_error(metrics_, *ex, *e);
  if (auto e = check_model(req.model)) return reply_error(metrics_, *ex, *e);
  if (!tokenizer_) return reply_error(metrics_, *ex, bad_request("this model has no tokenizer"));
  auto text = tokenizer_->decode(req.tokens, /*skip_special_tokens=*/false);
  if (!text.ok()) return reply_error(metrics_, *ex, error_from_status(text.status(), "tokens"));
  metrics_.observe_http(200);
  ex->respond(200, "application/json", dump(Json{{"prompt", *text}}));
}

}  // namespace pagellm::server
