"""--tool-call-parser through `pagellm serve` and the official openai client.

The parsers themselves (every format, malformed calls, markers split at every byte) are tested on
crafted text in tests/unit/server/tool_parser_test.cpp. Here the whole path runs on a model whose
answers we write: a one-layer Llama whose attention and MLP add nothing, so that the next token
depends only on the current one (a table kept in the embeddings and lm_head), with a byte-level
vocabulary whose high bytes are replaced by whole words ("<tool", "_call>\\n{...", markers split
across tokens as real tokenizers split them). Its chat template writes the messages' text and
nothing after it, so the last character of the last message picks the scripted answer, which
greedy sampling then follows word by word to EOS. Each family's model has its own template, which
mentions the family's markers the way the published templates do, so that the parser is chosen
from the template (no --tool-call-parser).
"""
import json
import os
import re
import subprocess

import numpy as np
import openai
import pytest
from openai.types.chat import ChatCompletionMessageToolCall
from safetensors.numpy import save_file

from byte_model import bytes_to_unicode, make_byte_model
from conftest import KV_BYTES, Server, pagellm_bin

HIDDEN = 64
EOS = 2

# What the answers call, as (name, arguments).
WEATHER = ("get_weather", {"city": "Paris"})
TIME = ("get_time", {"zone": "CET"})

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
]

# The conversation's text and nothing else: the last message's last character picks the answer.
BODY = "{%- for m in messages %}{{ m['content'] or '' }}{% endfor %}"

# Per family: a template that mentions its markers (in a comment: they render nothing), the
# special tokens {id: text}, and the scripted answers {selector character: [token texts]}.
FAMILIES = {
    "hermes": {
        "template": "{#- Calls: <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call> -#}" + BODY,
        "special": {},
        "scripts": {
            "W": ["<tool", "_call>\n{\"name\": \"get_weather\", ",
                  "\"arguments\": {\"city\": \"Paris\"}}\n</tool_", "call>"],
            "P": ["Checking both.",
                  "\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                  "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>"],
            # A brace short: stays content.
            "M": ["<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ", "\n</tool_call>"],
            "T": ["Paris is", " lovely."],
            # A Qwen3 thought that mentions the marker, then the call.
            "R": ["<think>", "\nI should call <tool_call> for this.\n", "</think>\n\n",
                  "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}</tool_call>"],
            # After the tool's result ("sunny").
            "y": ["It is sunny", " in Paris."],
        },
    },
    "llama3_json": {
        "template": "{#- <|start_header_id|>system<|end_header_id|> Respond in the format {\"name\": "
                    "function name, \"parameters\": dictionary of argument name and its value}. -#}" + BODY,
        "special": {},
        "scripts": {
            "W": ["{\"name\": \"get_weather\", ", "\"parameters\": {\"city\": \"Paris\"}}"],
            "P": ["{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "; ",
                  "{\"name\": \"get_time\", \"parameters\": {\"zone\": \"CET\"}}"],
            # JSON that is not a call.
            "J": ["{\"answer\": ", "42}"],
        },
    },
    "mistral": {
        "template": "{#- [AVAILABLE_TOOLS] ... [TOOL_CALLS] [{\"name\": ..., \"arguments\": ...}] -#}" + BODY,
        # As in Mistral's tokenizers, the marker is a special token: skipped from text unless the
        # server keeps special tokens for the parser.
        "special": {200: "[TOOL_CALLS]"},
        "scripts": {
            "P": ["[TOOL_CALLS]", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, ",
                  "{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}]"],
            "T": ["Bonjour", "!"],
        },
    },
    "deepseek_v3": {
        "template": "{#- <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name -#}" + BODY,
        "special": {},
        "scripts": {
            # V3 / R1.
            "W": ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n",
                  "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"],
            # V3.1, after some text.
            "V": ["Let me check.",
                  "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}"
                  "<｜tool▁call▁end｜>",
                  "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"CET\"}<｜tool▁call▁end｜>"
                  "<｜tool▁calls▁end｜>"],
        },
    },
}


def make_scripted_model(dst, template, scripts, special):
    """Writes the model described in the module docstring into `dst`."""
    cfg = {"vocab_size": 256, "hidden_size": HIDDEN, "intermediate_size": HIDDEN, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 1024,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
           "bos_token_id": 1, "eos_token_id": EOS, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    special_ids = {text: i for i, text in special.items()}
    free = [i for i in range(128, 256) if i not in special]  # bytes no ASCII prompt uses
    words, successor = {}, {}
    for selector, pieces in scripts.items():
        chain = [ord(selector)]
        for p in pieces:
            if p not in special_ids:
                assert p not in words, f"'{p}' is in two scripts: give each token one successor"
                words[p] = free.pop(0)
            chain.append(special_ids.get(p, words.get(p)))
        chain.append(EOS)
        for a, b in zip(chain, chain[1:]):
            assert a not in successor, f"token {a} has two successors"
            successor[a] = b
    # A token with a successor gets a one-hot embedding of its own (RMSNorm scales it to 8), and
    # lm_head gives its successor a logit of 80, every other token 0; the rest share the last
    # dimension, whose successor is EOS.
    assert len(successor) < HIDDEN
    emb = np.zeros((256, HIDDEN), np.float32)
    head = np.zeros((256, HIDDEN), np.float32)
    emb[:, HIDDEN - 1] = 1.0
    head[EOS, HIDDEN - 1] = 10.0
    for k, (a, b) in enumerate(sorted(successor.items())):
        emb[a] = 0.0
        emb[a, k] = 1.0
        head[b, k] = 10.0
    zeros = lambda *shape: np.zeros(shape, np.float32)
    ones = np.ones(HIDDEN, np.float32)
    layer = "model.layers.0."
    tensors = {"model.embed_tokens.weight": emb, "lm_head.weight": head, "model.norm.weight": ones,
               layer + "input_layernorm.weight": ones, layer + "post_attention_layernorm.weight": ones,
               layer + "mlp.gate_proj.weight": zeros(HIDDEN, HIDDEN), layer + "mlp.up_proj.weight": zeros(HIDDEN, HIDDEN),
               layer + "mlp.down_proj.weight": zeros(HIDDEN, HIDDEN)}
    for p in "qkvo":
        tensors[layer + f"self_attn.{p}_proj.weight"] = zeros(HIDDEN, HIDDEN)
    src = dst + "-weights"
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(tensors, os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    make_byte_model(src, dst, chat_template=template, special_tokens=special)
    # The words take the places of their ids' bytes in the vocabulary.
    path = os.path.join(dst, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    by_id = {i: s for s, i in vocab.items()}
    to_unicode = bytes_to_unicode()
    for word, i in words.items():
        del vocab[by_id[i]]
        vocab["".join(to_unicode[b] for b in word.encode("utf-8"))] = i
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    return dst


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("scripted")
    return {name: make_scripted_model(str(root / name), fam["template"], fam["scripts"], fam["special"])
            for name, fam in FAMILIES.items()}


@pytest.fixture(scope="module")
def servers(model_dirs):
    """One server per family, the parser chosen from the chat template."""
    started = {name: Server(["--model", d, "--kv-cache-memory", KV_BYTES, "--served-model-name", "tiny"])
               for name, d in model_dirs.items()}
    yield started
    for s in started.values():
        assert s.stop() == 0


def ask(server, selector, stream=False, tools=TOOLS, **kw):
    """A chat request whose answer is script `selector`: (content, calls, finish_reason) per choice,
    calls as the client's objects (non-streamed) or as assembled dicts (streamed)."""
    msgs = kw.pop("messages", [{"role": "user", "content": f"What is the weather in Paris? {selector}"}])
    if tools is not None:
        kw["tools"] = tools
    c = server.client()
    if not stream:
        r = c.chat.completions.create(model="tiny", messages=msgs, temperature=0, **kw)
        return r, [(ch.message.content, ch.message.tool_calls, ch.finish_reason) for ch in r.choices]
    n = kw.get("n", 1)
    content, calls, finish = [""] * n, [{} for _ in range(n)], [None] * n
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, temperature=0, stream=True, **kw))
    for chunk in chunks:
        for ch in chunk.choices:
            assert finish[ch.index] is None, "a chunk after the choice's finish_reason"
            content[ch.index] += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                if d.index not in calls[ch.index]:
                    # A call's first chunk: its id, type and name (arguments "").
                    assert d.id and d.type == "function" and d.function.name, d
                    calls[ch.index][d.index] = {"id": d.id, "name": d.function.name,
                                                "arguments": d.function.arguments or ""}
                else:
                    assert d.id is None and not d.function.name, d
                    calls[ch.index][d.index]["arguments"] += d.function.arguments or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    out = []
    for i in range(n):
        assert sorted(calls[i]) == list(range(len(calls[i]))), "call indices are 0, 1, ..."
        out.append((content[i], [calls[i][k] for k in sorted(calls[i])], finish[i]))
    return chunks, out


def check_calls(family, got, want):
    """Calls (the client's objects or assembled stream dicts) against [(name, arguments)]."""
    assert len(got) == len(want)
    id_form = r"[A-Za-z0-9]{9}" if family == "mistral" else r"call_[A-Za-z0-9]{24}"
    ids = set()
    for g, (name, args) in zip(got, want):
        if isinstance(g, dict):
            gid, gname, gargs = g["id"], g["name"], g["arguments"]
        else:
            assert isinstance(g, ChatCompletionMessageToolCall)
            assert g.type == "function"
            gid, gname, gargs = g.id, g.function.name, g.function.arguments
        assert re.fullmatch(id_form, gid), gid
        ids.add(gid)
        assert gname == name
        assert json.loads(gargs) == args
    assert len(ids) == len(got), "ids repeat"


CALL_CASES = [
    ("hermes", "W", None, [WEATHER]),
    ("hermes", "P", "Checking both.", [WEATHER, TIME]),
    ("llama3_json", "W", None, [WEATHER]),
    ("llama3_json", "P", None, [WEATHER, TIME]),
    ("mistral", "P", None, [WEATHER, TIME]),
    ("deepseek_v3", "W", None, [WEATHER]),
    ("deepseek_v3", "V", "Let me check.", [WEATHER, TIME]),
]


@pytest.mark.parametrize("family,selector,content,calls", CALL_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CALL_CASES])
def test_calls(servers, family, selector, content, calls):
    _, [(got_content, got_calls, finish)] = ask(servers[family], selector)
    assert got_content == content  # null when the answer is only calls
    check_calls(family, got_calls, calls)
    assert finish == "tool_calls"


@pytest.mark.parametrize("family,selector,content,calls", CALL_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CALL_CASES])
def test_calls_streamed(servers, family, selector, content, calls):
    chunks, [(got_content, got_calls, finish)] = ask(servers[family], selector, stream=True)
    assert got_content == (content or "")
    check_calls(family, got_calls, calls)
    assert finish == "tool_calls"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


TEXT_CASES = [
    # Malformed: the call stays content as written.
    ("hermes", "M", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>"),
    ("hermes", "T", "Paris is lovely."),
    ("llama3_json", "J", "{\"answer\": 42}"),
    ("mistral", "T", "Bonjour!"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("family,selector,text", TEXT_CASES, ids=[f"{c[0]}-{c[1]}" for c in TEXT_CASES])
def test_answers_without_calls_are_content(servers, family, selector, text, stream):
    _, [(content, calls, finish)] = ask(servers[family], selector, stream=stream)
    assert content == text
    assert not calls
    assert finish == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_no_parsing_without_tools_or_with_tool_choice_none(servers, stream):
    raw = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
    for kw in ({"tools": None}, {"tool_choice": "none"}, {"tools": []}):
        _, [(content, calls, finish)] = ask(servers["hermes"], "W", stream=stream, **kw)
        assert content == raw, kw
        assert not calls
        assert finish == "stop"


def test_special_marker_is_kept_for_the_parser(servers):
    # Without tools the special token is skipped as usual; with them the parser saw it (above).
    _, [(content, calls, _)] = ask(servers["mistral"], "P", tools=None)
    assert content.startswith("[{\"name\": \"get_weather\"") and not calls
    _, [(content, calls, _)] = ask(servers["mistral"], "P", tools=None, extra_body={"skip_special_tokens": False})
    assert content.startswith("[TOOL_CALLS][{")


def test_usage_is_unchanged(servers):
    with_tools, _ = ask(servers["hermes"], "P")
    without, _ = ask(servers["hermes"], "P", tools=None)
    assert with_tools.usage.completion_tokens == without.usage.completion_tokens == 4  # 3 words + EOS
    assert with_tools.usage.prompt_tokens == without.usage.prompt_tokens


def test_cut_off_call_is_content(servers):
    for stream in (False, True):
        _, [(content, calls, finish)] = ask(servers["hermes"], "W", stream=stream, max_tokens=2)
        assert content == "<tool_call>\n{\"name\": \"get_weather\", "
        assert not calls
        assert finish == "length"


def test_n_choices_each_parsed(servers):
    _, choices = ask(servers["hermes"], "P", n=2)
    for content, calls, finish in choices:
        assert content == "Checking both."
        check_calls("hermes", calls, [WEATHER, TIME])
        assert finish == "tool_calls"
    _, choices = ask(servers["hermes"], "P", n=2, stream=True)
    for content, calls, finish in choices:
        assert content == "Checking both."
        check_calls("hermes", calls, [WEATHER, TIME])
        assert finish == "tool_calls"


def test_round_trip(servers):
    """The returned calls go back in the next request (through the template), with the result."""
    question = {"role": "user", "content": "What is the weather in Paris? W"}
    r, [(_, calls, _)] = ask(servers["hermes"], "W", messages=[question])
    assistant = r.choices[0].message.model_dump(exclude_none=True)
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    result = {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"}
    _, [(content, calls, finish)] = ask(servers["hermes"], None, messages=[question, assistant, result])
    assert content == "It is sunny in Paris."
    assert not calls
    assert finish == "stop"


@pytest.mark.parametrize("choice,words", [
    ({"type": "function", "function": {"name": "no_such_tool"}}, "which 'tools' lacks"),
    ("sometimes", "must be 'none', 'auto', 'required'"),
])
def test_bad_tool_choice_is_refused_clearly(servers, choice, words):
    # Forcing calls ("required", a named function) is tested in test_structured_output.py.
    with pytest.raises(openai.BadRequestError) as e:
        ask(servers["hermes"], "W", tool_choice=choice)
    err = e.value.body
    assert words in err["message"]
    assert err["param"] == "tool_choice"


@pytest.mark.parametrize("stream", [False, True])
def test_calls_only_in_the_answer_not_the_thought(model_dirs, server_factory, stream):
    s = server_factory(["--model", model_dirs["hermes"], "--kv-cache-memory", KV_BYTES, "--served-model-name",
                        "tiny", "--reasoning-parser", "qwen3"])
    c = s.client()
    msgs = [{"role": "user", "content": "What time is it in Paris? R"}]
    if not stream:
        r = c.chat.completions.create(model="tiny", messages=msgs, temperature=0, tools=TOOLS)
        m = r.choices[0].message
        reasoning, content, calls, finish = m.reasoning_content, m.content, m.tool_calls, r.choices[0].finish_reason
    else:
        reasoning = ""
        _, [(content, calls, finish)] = ask(s, None, stream=True, messages=msgs)
        for chunk in c.chat.completions.create(model="tiny", messages=msgs, temperature=0, tools=TOOLS, stream=True):
            for ch in chunk.choices:
                reasoning += getattr(ch.delta, "reasoning_content", None) or ""
    assert reasoning == "\nI should call <tool_call> for this.\n"
    assert not content
    check_calls("hermes", calls, [TIME])
    assert finish == "tool_calls"


def test_parser_chosen_from_template_and_overridden(servers, model_dirs, server_factory):
    for name, s in servers.items():
        assert f"tool-call parser: {name} (from the chat template)" in s.log()
    s = server_factory(["--model", model_dirs["hermes"], "--kv-cache-memory", KV_BYTES, "--served-model-name",
                        "tiny", "--tool-call-parser", "none"])
    assert "tool-call parser: none\n" in s.log()
    _, [(content, calls, finish)] = ask(s, "W")
    assert content.startswith("<tool_call>") and not calls and finish == "stop"


def test_unknown_parser_is_refused(model_dirs):
    r = subprocess.run([pagellm_bin(), "serve", "--model", model_dirs["hermes"], "--port", "0",
                        "--tool-call-parser", "qwen"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "llama3_json, hermes, mistral, deepseek_v3 or none" in r.stderr + r.stdout
