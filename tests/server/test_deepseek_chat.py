"""DeepSeek-V2 served end to end, with its own chat template.

The tiny golden DeepSeek-V2 checkpoint (multi-head latent attention, DeepSeekMoE routed and shared
experts) gets a byte-level tokenizer whose ids 1 and 2 are DeepSeek's begin- and end-of-sentence
tokens (the checkpoint's bos_token_id and eos_token_id), and DeepSeek-V2's chat template
(tests/data/templates/deepseek-v2.jinja, as published with the model). The reference is
transformers: its apply_chat_template (jinja2) and tokenizer (HF tokenizers) on the same folder
must give the token ids the server prompts the model with, and chat completions must work through
the official openai client, streamed and not, ending at the model's end-of-sentence token or at
max_tokens. (One token per byte and 64 positions: the conversations are short.)
"""
import json
import os

import pytest

from byte_model import make_byte_model
from conftest import KV_BYTES, ROOT, Server
from test_openai_api import raw

GOLDEN_DEEPSEEK = os.path.join(ROOT, "tests", "data", "golden", "deepseek_v2")
TEMPLATE = os.path.join(ROOT, "tests", "data", "templates", "deepseek-v2.jinja")
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
NAME = "deepseek-v2-tiny"
MESSAGES = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Terse."},
     {"role": "user", "content": "Prime?"},
     {"role": "assistant", "content": "7"},
     {"role": "user", "content": "ü ✓"}],
]


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    with open(TEMPLATE, encoding="utf-8") as f:
        template = f.read()
    return make_byte_model(GOLDEN_DEEPSEEK, str(tmp_path_factory.mktemp("deepseek_v2")), chat_template=template,
                           special_tokens={1: BOS, 2: EOS},
                           tokenizer_config={"bos_token": BOS, "eos_token": EOS, "add_bos_token": False})


@pytest.fixture(scope="module")
def deepseek_server(deepseek_dir):
    s = Server(["--model", deepseek_dir, "--kv-cache-memory", KV_BYTES, "--served-model-name", NAME])
    yield s
    assert s.stop() == 0


def reference_ids(model_dir, messages):
    transformers = pytest.importorskip("transformers")  # the test requirements pin it
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


@pytest.mark.parametrize("case", range(len(MESSAGES)))
def test_template_and_tokens_match_transformers(deepseek_server, deepseek_dir, case):
    want = reference_ids(deepseek_dir, MESSAGES[case])
    assert want[0] == 1  # the template's bos_token, as one special token
    status, _, body = raw(deepseek_server.url, "/tokenize", {"model": NAME, "messages": MESSAGES[case]})
    assert status == 200, body
    assert json.loads(body)["tokens"] == want
    # The chat completion is prompted with exactly those tokens.
    r = deepseek_server.client().chat.completions.create(model=NAME, messages=MESSAGES[case], max_tokens=4,
                                                         temperature=0)
    assert r.usage.prompt_tokens == len(want)


def test_chat_completions_stream_and_not(deepseek_server):
    c = deepseek_server.client()
    msgs = MESSAGES[0]
    r = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.model == NAME
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    n_out = r.usage.completion_tokens
    assert 1 <= n_out <= 12 and (r.choices[0].finish_reason == "stop" or n_out == 12)
    chunks = list(c.chat.completions.create(model=NAME, messages=msgs, max_tokens=12, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == r.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == r.choices[0].finish_reason
    # Sampled too: seeded requests repeat.
    a = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=8, temperature=0.8, seed=5)
    b = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=8, temperature=0.8, seed=5)
    assert a.choices[0].message.content == b.choices[0].message.content
