"""Structured outputs through `pagellm serve` and the official openai client.

The model is the tiny random Llama with a byte-level tokenizer (one token a byte) and a 512-token
context: at temperature 1 it writes noise, so unconstrained output essentially never parses, and
every constrained output must still validate. Each request kind (response_format json_schema and
json_object, client.chat.completions.parse with a Pydantic model, vLLM's guided_* and
structured_outputs), streamed and not, and the 400s for specs that cannot work.
"""
import json
import os
import re
import threading
import time

import httpx
import jsonschema
import openai
import pydantic
import pytest

from byte_model import make_byte_model
from conftest import GOLDEN_LLAMA, KV_BYTES, Server

# Nested objects, arrays, enums, anyOf, $ref, string patterns and number bounds; strings and
# numbers bounded so that a noise model finishes within max_tokens. Strings are bounded by
# ASCII patterns rather than maxLength: a model writing random bytes can put together byte runs
# that are not UTF-8 (each becomes U+FFFD in the text, so the length in characters grows).
SCHEMA = {
    "$defs": {
        "point": {
            "type": "object",
            "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99},
                           "y": {"type": "number", "minimum": -1, "maximum": 1}},
            "required": ["x", "y"],
            "additionalProperties": False,
        }
    },
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z]{2,4}$"},
        "kind": {"enum": ["a", "b", "c"]},
        "at": {"$ref": "#/$defs/point"},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z0-9]{0,3}$"}, "maxItems": 3},
        "v": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 9}, {"type": "boolean"},
                        {"type": "null"}]},
    },
    "required": ["id", "kind", "at", "tags", "v"],
    "additionalProperties": False,
}
COMPACT = {"structured_outputs": {"disable_any_whitespace": True}}


def byte_model_512(dst, **kw):
    """The byte-level golden Llama with a 512-token context (random weights: any length works)."""
    d = make_byte_model(GOLDEN_LLAMA, dst, **kw)
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    config["max_position_embeddings"] = 512
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = byte_model_512(str(tmp_path_factory.mktemp("byte_llama_512")))
    s = Server(["--model", d, "--kv-cache-memory", KV_BYTES, "--served-model-name", "tiny"])
    yield s
    assert s.stop() == 0


def chat(server, **kw):
    kw.setdefault("messages", [{"role": "user", "content": "Describe a point."}])
    kw.setdefault("temperature", 1.0)
    kw.setdefault("max_tokens", 400)
    return server.client().chat.completions.create(model="tiny", **kw)


def test_json_schema_outputs_always_validate(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}
    outputs = []
    for seed in range(25):  # 25 x n=8: 200 sampled generations
        r = chat(server, response_format=fmt, n=8, seed=seed, extra_body=COMPACT)
        for ch in r.choices:
            assert ch.finish_reason == "stop", ch.message.content
            outputs.append(ch.message.content)
    assert len(outputs) == 200
    for text in outputs:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(outputs)) > 150  # sampled, not one answer repeated


def test_unconstrained_output_does_not_validate(server):
    r = chat(server, n=8, seed=1, max_tokens=60)
    for ch in r.choices:
        with pytest.raises((json.JSONDecodeError, jsonschema.ValidationError)):
            jsonschema.validate(json.loads(ch.message.content), SCHEMA)


def test_streamed_output_validates(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
    text, finish = "", None
    for chunk in chat(server, response_format=fmt, seed=3, stream=True, extra_body=COMPACT):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


class Point(pydantic.BaseModel):
    x: int = pydantic.Field(ge=0, le=9)
    label: str = pydantic.Field(pattern="^[a-z]{1,4}$")
    ok: bool


def test_parse_with_a_pydantic_model(server):
    for seed in range(5):
        r = server.client().chat.completions.parse(
            model="tiny", messages=[{"role": "user", "content": "A point?"}], response_format=Point,
            temperature=1.0, max_tokens=400, seed=seed, extra_body=COMPACT)
        p = r.choices[0].message.parsed
        assert isinstance(p, Point) and 0 <= p.x <= 9 and 1 <= len(p.label) <= 4


def test_json_object_with_any_whitespace(server):
    # Whitespace as the model likes (bounded per run), any JSON object.
    for seed in range(5):
        r = chat(server, response_format={"type": "json_object"}, seed=seed, max_tokens=450)
        ch = r.choices[0]
        if ch.finish_reason == "stop":
            assert isinstance(json.loads(ch.message.content), dict)
        else:  # a noise model may write a long object; what it wrote is still a prefix of one
            assert ch.message.content.lstrip().startswith("{")


@pytest.mark.parametrize("extra,check", [
    ({"guided_choice": ["yes", "no", "a \"quoted\" maybe"]},
     lambda t: t in ("yes", "no", "a \"quoted\" maybe")),
    ({"guided_regex": r"[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
    ({"guided_grammar": 'root ::= "(" num ("," num)* ")"\nnum ::= [0-9] | [1-9] [0-9]'},
     lambda t: re.fullmatch(r"\((\d{1,2})(,\d{1,2})*\)", t)),
    ({"guided_json": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4}},
     lambda t: 1 <= len(json.loads(t)) <= 4),
    ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
    ({"structured_outputs": {"regex": "[A-Z][a-z]{1,5}"}}, lambda t: re.fullmatch("[A-Z][a-z]{1,5}", t)),
])
def test_vllm_constraint_kinds(server, extra, check):
    for seed in range(4):
        r = server.client().completions.create(model="tiny", prompt="x", temperature=1.0, max_tokens=300,
                                               seed=seed, n=3, extra_body=extra)
        for ch in r.choices:
            assert ch.finish_reason == "stop" and check(ch.text), ch.text


def test_mixed_batch_of_constrained_and_free_requests(server):
    # Concurrent requests in the same engine steps: each follows its own constraint or none.
    import concurrent.futures as cf
    c = server.client()

    def one(i):
        extra = {"guided_choice": ["red", "blue"]} if i % 2 else {}
        r = c.completions.create(model="tiny", prompt=f"q{i}", temperature=1.0, max_tokens=24, seed=i,
                                 extra_body=extra)
        return i, r.choices[0]

    with cf.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, range(16)))
    for i, ch in results:
        if i % 2:
            assert ch.text in ("red", "blue") and ch.finish_reason == "stop"
        else:
            assert ch.finish_reason == "length"


@pytest.mark.parametrize("extra,fragment", [
    ({"guided_json": {"type": "nope"}}, "Unsupported type"),
    ({"guided_json": "{not json"}, "not a JSON schema"),
    ({"guided_json": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}},
     "keyword 'not' at /properties/a"),
    ({"guided_regex": r"[^\s\S]"}, "matches no text"),
    ({"guided_regex": "(unclosed"}, "invalid structured output"),
    ({"guided_grammar": "root ::= ("}, "EBNF parser error"),
    ({"guided_choice": []}, "non-empty list"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "not both"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "json_schema"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "not supported"),
    ({"structured_outputs": {"nope": 1}}, "not a structured-output option"),
])
def test_bad_specs_are_400_with_the_reason(server, extra, fragment):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model="tiny", prompt="x", max_tokens=4, extra_body=extra)
    assert fragment in e.value.message
    # The server is fine afterwards.
    assert server.client().completions.create(model="tiny", prompt="x", max_tokens=2).choices


def metric(server, name):
    m = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", httpx.get(server.url + "/metrics").text, re.M)
    return float(m.group(1))


def test_compiled_once_per_schema(server):
    def compiled():
        return metric(server, "pagellm:grammar_compiles_total")
    schema = {"type": "object", "properties": {"unique_key_for_this_test": {"type": "boolean"}},
              "required": ["unique_key_for_this_test"], "additionalProperties": False}
    before = compiled()
    for seed in range(3):
        chat(server, response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
             seed=seed, extra_body=COMPACT)
    assert compiled() == before + 1


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
            "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 99},
            "b": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["a", "b"], "additionalProperties": False}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_tool_choice_always_calls_with_valid_arguments(server, choice, stream):
    for seed in range(6):
        kw = dict(tools=TOOLS, tool_choice=choice, seed=seed, extra_body=COMPACT)
        if not stream:
            ch = chat(server, **kw).choices[0]
            calls, finish = ch.message.tool_calls, ch.finish_reason
            assert ch.message.content is None
        else:
            parts, finish = {}, None
            for chunk in chat(server, stream=True, **kw):
                for c in chunk.choices:
                    assert not c.delta.content
                    finish = c.finish_reason or finish
                    for tc in c.delta.tool_calls or []:
                        p = parts.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                        p["id"] = tc.id or p["id"]
                        p["name"] += (tc.function.name or "") if tc.function else ""
                        p["arguments"] += (tc.function.arguments or "") if tc.function else ""
            calls = [openai.types.chat.ChatCompletionMessageToolCall(
                id=p["id"], type="function", function={"name": p["name"], "arguments": p["arguments"]})
                for _, p in sorted(parts.items())]
        assert finish == "tool_calls" and calls
        for call in calls:
            assert call.id.startswith("call_")
            if isinstance(choice, dict):
                assert call.function.name == "add"
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_forced_tool_choice_errors(server):
    for kw, fragment in [
        (dict(tool_choice={"type": "function", "function": {"name": "nope"}}, tools=TOOLS), "lacks"),
        (dict(tool_choice="required"), "needs 'tools'"),
        (dict(tool_choice="required", tools=TOOLS, response_format={"type": "json_object"}), "cannot be combined"),
        (dict(tool_choice="sometimes", tools=TOOLS), "must be"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            chat(server, max_tokens=4, **kw)
        assert fragment in e.value.message


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_reasoning_is_free_and_the_answer_follows_the_schema(server_factory, tmp_path, parser):
    d = byte_model_512(str(tmp_path / "think"), special_tokens={3: "<think>", 4: "</think>"})
    # As in DeepSeek-R1's and Qwen3's tokenizers, the markers are added tokens that stay in the text.
    with open(os.path.join(d, "tokenizer.json")) as f:
        tok = json.load(f)
    for t in tok["added_tokens"]:
        t["special"] = False
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    s = server_factory(["--model", d, "--kv-cache-memory", KV_BYTES, "--served-model-name", "tiny",
                        "--reasoning-parser", parser])
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    thoughts = 0
    for seed in range(12):
        # Biased towards the markers, so that thoughts open (qwen3) and end within max_tokens, and
        # away from EOS (2), which would end a thought with no answer (once the JSON is complete,
        # EOS is the one token the grammar allows).
        r = chat(s, seed=seed, max_tokens=300, logit_bias={"3": 4, "4": 3, "2": -100},
                 response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
                 extra_body=COMPACT)
        ch = r.choices[0]
        assert ch.finish_reason == "stop", ch.message
        assert ch.message.content is not None, ch.message
        jsonschema.validate(json.loads(ch.message.content), schema)
        # The thought is the model's own: unconstrained bytes, not JSON.
        thought = getattr(ch.message, "reasoning_content", None)
        thoughts += bool(thought)
    assert thoughts >= 3


SLOW_PROPERTIES = 1500


def slow_schema(n_properties):
    """An object of many string properties, each with a pattern of its own: a grammar of many
    rules, whose token masks the compiler precomputes rule by rule."""
    props = {f"p{i}": {"type": "string", "pattern": f"^[a-z]{{{i % 5 + 1},{i % 5 + 9}}}-[0-9]{{{i % 4 + 2}}}x{i}$"}
             for i in range(n_properties)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def test_a_grammar_compile_does_not_hold_up_other_requests(server_factory, tmp_path):
    """With one I/O thread, requests keep being answered while a large new schema compiles: the
    compile runs on the server's grammar threads, not on the thread that serves connections."""
    d = byte_model_512(str(tmp_path / "m"))
    s = server_factory(["--model", d, "--kv-cache-memory", KV_BYTES, "--served-model-name", "tiny",
                        "--io-threads", "1"])
    fmt = {"type": "json_schema", "json_schema": {"name": "slow", "schema": slow_schema(SLOW_PROPERTIES)}}
    done = {}

    def constrained():
        t0 = time.monotonic()
        done["response"] = chat(s, response_format=fmt, max_tokens=1)
        done["span"] = (t0, time.monotonic())

    th = threading.Thread(target=constrained)
    th.start()
    probes = []  # (sent, answered) of /health requests while the compile runs
    while th.is_alive():
        t0 = time.monotonic()
        assert httpx.get(s.url + "/health", timeout=60).status_code == 200
        probes.append((t0, time.monotonic()))
        time.sleep(0.01)
    th.join()
    assert done["response"].choices[0].finish_reason == "length"
    compile_s = metric(s, "pagellm:grammar_compile_seconds_total")
    assert compile_s > 0.3, f"the schema compiled in {compile_s:.3f} s: too fast to tell; make it larger"
    start, end = done["span"]
    during = [b - a for a, b in probes if a > start and b < end]
    assert len(during) >= 3, (probes, done["span"], compile_s)
    # Blocked behind the compile, a probe would wait for most of it.
    assert max(during) < compile_s / 4, (max(during), compile_s)
