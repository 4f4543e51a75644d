"""The server through the official openai client: completions and chat, streamed and not, n > 1,
stop, logprobs, seeds, usage, and the errors the client raises for bad input."""
import json
import math
import urllib.error
import urllib.request

import openai
import pytest

SMOL = "SmolLM2-135M-Instruct"


def raw(url, path, body=None, method=None, headers=None):
    """(status, headers, body bytes) of one HTTP request, errors included."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


# --- completions ---

def test_models_lists_the_served_model(smol_server):
    models = smol_server.client().models.list()
    assert [m.id for m in models.data] == [SMOL]
    assert smol_server.model == SMOL


def test_completion_text_usage_and_greedy_determinism(smol_server):
    c = smol_server.client()
    r1 = c.completions.create(model=SMOL, prompt="The capital of France is", max_tokens=8, temperature=0)
    r2 = c.completions.create(model=SMOL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r1.object == "text_completion" and r1.id.startswith("cmpl-")
    assert r1.choices[0].text == r2.choices[0].text
    assert "Paris" in r1.choices[0].text
    assert r1.choices[0].finish_reason == "length"
    tok = json.loads(raw(smol_server.url, "/tokenize", {"prompt": "The capital of France is"})[2])
    assert r1.usage.prompt_tokens == tok["count"]
    assert r1.usage.completion_tokens == 8
    assert r1.usage.total_tokens == tok["count"] + 8


def test_completion_stream_equals_non_stream(smol_server):
    c = smol_server.client()
    kw = dict(model=SMOL, prompt="Once upon a time", max_tokens=20, temperature=0.8, seed=1234)
    full = c.completions.create(**kw)
    chunks = list(c.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == full.choices[0].text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(ch.usage is None for ch in chunks[:-1])


def test_seed_reproducible_and_different_seeds_differ(smol_server):
    c = smol_server.client()
    kw = dict(model=SMOL, prompt="My favourite animal is", max_tokens=16, temperature=1.0)
    a = c.completions.create(seed=7, **kw).choices[0].text
    b = c.completions.create(seed=7, **kw).choices[0].text
    others = {c.completions.create(seed=s, **kw).choices[0].text for s in (8, 9, 10)}
    assert a == b
    assert others != {a}


def test_n_choices_and_prompt_lists(smol_server):
    c = smol_server.client()
    r = c.completions.create(model=SMOL, prompt=["Hello", "One two three"], n=3, max_tokens=5, temperature=1.0, seed=3,
                             extra_body={"return_token_ids": True})
    assert [ch.index for ch in r.choices] == list(range(6))
    assert r.usage.completion_tokens == sum(len(ch.model_extra["token_ids"]) for ch in r.choices)
    # Choices 0-2 continue the first prompt, 3-5 the second.
    assert [ch.model_extra["prompt_token_ids"] for ch in r.choices[:3]] == [r.choices[0].model_extra["prompt_token_ids"]] * 3
    assert r.choices[3].model_extra["prompt_token_ids"] != r.choices[0].model_extra["prompt_token_ids"]
    # Seeded n > 1: each sequence has its own stream, so the three are not all equal.
    assert len({ch.text for ch in r.choices[:3]}) > 1


def test_stop_strings_are_not_emitted(smol_server):
    c = smol_server.client()
    base = c.completions.create(model=SMOL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0].text
    assert " 6" in base, base
    r = c.completions.create(model=SMOL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[" 6"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[: base.index(" 6")]


def test_completion_logprobs_and_echo(smol_server):
    c = smol_server.client()
    r = c.completions.create(model=SMOL, prompt="The capital of France is", max_tokens=4, temperature=0,
                             logprobs=3, echo=True)
    lp = r.choices[0].logprobs
    n_prompt = r.usage.prompt_tokens
    assert len(lp.tokens) == n_prompt + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert r.choices[0].text.startswith("The capital of France is")
    assert "".join(lp.tokens) == r.choices[0].text
    for i in range(1, len(lp.tokens)):
        assert lp.token_logprobs[i] <= 0
        assert 1 <= len(lp.top_logprobs[i]) <= 4
    # Greedy: each generated token is the most likely one.
    for i in range(n_prompt, len(lp.tokens)):
        assert math.isclose(lp.token_logprobs[i], max(lp.top_logprobs[i].values()), abs_tol=1e-5)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_token_id_prompts_on_a_model_without_tokenizer(tiny_server):
    c = tiny_server.client()
    r = c.completions.create(model=tiny_server.model, prompt=[[1, 5, 7], [1, 9]], max_tokens=6, temperature=0,
                             extra_body={"return_token_ids": True})
    assert len(r.choices) == 2
    for ch in r.choices:
        assert ch.text == ""
        assert len(ch.model_extra["token_ids"]) == 6
    s = list(c.completions.create(model=tiny_server.model, prompt=[1, 5, 7], max_tokens=6, temperature=0, stream=True,
                                  extra_body={"return_token_ids": True}))
    streamed = [t for ch in s for t in ch.choices[0].model_extra["token_ids"]]
    assert streamed == r.choices[0].model_extra["token_ids"]
    with pytest.raises(openai.BadRequestError, match="no tokenizer"):
        c.completions.create(model=tiny_server.model, prompt="text", max_tokens=2)


# --- chat ---

def test_chat_non_stream_and_stream(smol_server):
    c = smol_server.client()
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]
    r = c.chat.completions.create(model=SMOL, messages=msgs, max_tokens=12, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    text = r.choices[0].message.content
    assert "Paris" in text
    chunks = list(c.chat.completions.create(model=SMOL, messages=msgs, max_tokens=12, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    # The prompt is the chat template's: /tokenize with the same messages counts the same tokens.
    tok = json.loads(raw(smol_server.url, "/tokenize", {"messages": msgs})[2])
    assert tok["count"] == r.usage.prompt_tokens


def test_chat_logprobs_n_and_max_completion_tokens(smol_server):
    c = smol_server.client()
    r = c.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "Count to five."}],
                                  max_completion_tokens=6, n=2, temperature=0.9, seed=11, logprobs=True, top_logprobs=2)
    assert len(r.choices) == 2
    for ch in r.choices:
        content = ch.logprobs.content
        assert len(content) == 6 and ch.finish_reason == "length"
        for e in content:
            assert len(e.top_logprobs) == 2 and e.logprob <= 0
            assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    assert r.usage.completion_tokens == 12


def test_chat_roles_and_tools_pass_through_the_template(smol_server):
    c = smol_server.client()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    r = c.chat.completions.create(model=SMOL, messages=msgs, tools=tools, max_tokens=4, temperature=0)
    assert r.choices[0].message.role == "assistant"


# --- errors ---

def test_errors_raised_by_the_client(smol_server):
    c = smol_server.client()
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=SMOL, prompt="x", max_tokens=2, temperature="hot")
    assert "temperature" in e.value.message and e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError, match="top_p"):
        c.completions.create(model=SMOL, prompt="x", max_tokens=2, top_p=1.5)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=SMOL, prompt="x", max_tokens=600)
    assert "512" in e.value.message and "600" in e.value.message
    with pytest.raises(openai.BadRequestError, match="suffix"):
        c.completions.create(model=SMOL, prompt="x", max_tokens=2, suffix="end")
    with pytest.raises(openai.BadRequestError, match="response_format"):
        c.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "x"}],
                                  response_format={"type": "xml"})
    with pytest.raises(openai.BadRequestError, match="role"):
        c.chat.completions.create(model=SMOL, messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        c.completions.create(model=SMOL, prompt="x", max_tokens=2, logit_bias={"abc": 1})


def test_http_level_errors(smol_server):
    url = smol_server.url
    status, _, body = raw(url, "/v1/completions", b"{not json")
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    status, _, body = raw(url, "/v1/completions", b"[" * 100000)
    assert status == 400 and "nests" in json.loads(body)["error"]["message"]
    status, _, body = raw(url, "/v1/completions", {"prompt": "x", "max_tokens": "3"})
    assert status == 400 and json.loads(body)["error"]["param"] == "max_tokens"
    status, _, body = raw(url, "/v1/nothing")
    assert status == 404 and set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    status, headers, _ = raw(url, "/v1/completions", method="GET")
    assert status == 405 and headers.get("Allow") == "POST"
    status, headers, _ = raw(url, "/health", {"x": 1}, method="POST")
    assert status == 405
    status, _, body = raw(url, "/version")
    assert status == 200 and "version" in json.loads(body)
    status, _, _ = raw(url, "/health")
    assert status == 200


def test_request_id_in_and_out(smol_server):
    status, headers, _ = raw(smol_server.url, "/v1/models", headers={"X-Request-Id": "my-req-42"})
    assert status == 200 and headers["X-Request-Id"] == "my-req-42"
    status, headers, _ = raw(smol_server.url, "/v1/models")
    assert len(headers["X-Request-Id"]) == 32
    import time
    deadline = time.time() + 5  # the access line is written just after the response is out
    while "[my-req-42]" not in smol_server.log() and time.time() < deadline:
        time.sleep(0.02)
    assert "[my-req-42]" in smol_server.log()


def test_tokenize_detokenize_roundtrip(smol_server):
    status, _, body = raw(smol_server.url, "/tokenize", {"prompt": "Hello, world!", "return_token_strs": True})
    tok = json.loads(body)
    assert status == 200 and tok["count"] == len(tok["tokens"]) == len(tok["token_strs"])
    assert tok["max_model_len"] == 512
    status, _, body = raw(smol_server.url, "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and json.loads(body)["prompt"] == "Hello, world!"
    status, _, body = raw(smol_server.url, "/detokenize", {"tokens": [10 ** 9]})
    assert status == 400 and "tokens" in json.loads(body)["error"]["message"]


def test_queue_full_is_429_with_retry_after(server_factory):
    import concurrent.futures
    s = server_factory(["--max-model-len", "512", "--kv-cache-memory", "33554432",
                        "--max-num-seqs", "1", "--max-waiting", "1"])
    body = {"prompt": "Tell me a long story about a dragon.", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    import re
    import time

    def running():
        m = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", raw(s.url, "/metrics")[2].decode(), re.M)
        return float(m.group(1)) if m else 0
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        # One request running first (on a busy machine the engine may not have admitted it yet
        # when the others arrive, and then it holds the waiting place itself), then five more:
        # one takes the waiting place, the rest are refused.
        first = ex.submit(raw, s.url, "/v1/completions", body)
        deadline = time.time() + 30
        while running() < 1 and time.time() < deadline:
            time.sleep(0.005)
        rest = [ex.submit(raw, s.url, "/v1/completions", body) for _ in range(5)]
        results = [first.result()] + [f.result() for f in rest]
    statuses = sorted(r[0] for r in results)
    assert statuses.count(200) >= 2 and 429 in statuses, statuses
    for status, headers, b in results:
        if status == 429:
            assert headers.get("Retry-After") == "1"
            assert json.loads(b)["error"]["code"] == "rate_limit_exceeded"
    c = s.client()
    with pytest.raises(openai.RateLimitError):
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            list(ex.map(lambda _: c.completions.create(model=SMOL, prompt=body["prompt"], max_tokens=40,
                                                       extra_body={"ignore_eos": True}), range(6)))
