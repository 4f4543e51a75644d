"""--reasoning-parser through `pagellm serve` and the official openai client.

The splitting itself (markers split across pieces, a missing end marker, Qwen3's answer without a
thought) is tested on crafted text in tests/unit/server/reasoning_parser_test.cpp; a tiny random
model writes no markers, so here the whole answer is a DeepSeek-R1 thought (the answer starts
inside <think> and never closes it) and a Qwen3 plain answer, checked against the same request to
a server without a parser, streamed and not.
"""
import pytest

from conftest import KV_BYTES

MSGS = [{"role": "user", "content": "Why is the sky blue?"}]


def generate(server, stream, n=1):
    c = server.client()
    if not stream:
        r = c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=16, temperature=0, n=n)
        return [(getattr(ch.message, "reasoning_content", None), ch.message.content) for ch in r.choices]
    reasoning, content = [""] * n, [""] * n
    for chunk in c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=16, temperature=0,
                                           n=n, stream=True):
        for ch in chunk.choices:
            reasoning[ch.index] += getattr(ch.delta, "reasoning_content", None) or ""
            content[ch.index] += ch.delta.content or ""
    return list(zip(reasoning, content))


@pytest.fixture(scope="module")
def plain_text(byte_server):
    (reasoning, content), = generate(byte_server, stream=False)
    assert reasoning is None and content
    return content


@pytest.mark.parametrize("stream", [False, True])
def test_deepseek_r1_answer_is_all_thought(server_factory, byte_model_dir, plain_text, stream):
    s = server_factory(["--model", byte_model_dir, "--kv-cache-memory", KV_BYTES, "--served-model-name",
                        "tiny", "--reasoning-parser", "deepseek_r1"])
    for reasoning, content in generate(s, stream, n=2):
        assert reasoning == plain_text
        assert not content  # null (not streamed: no content deltas)


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_answer_without_marker_is_content(server_factory, byte_model_dir, plain_text, stream):
    s = server_factory(["--model", byte_model_dir, "--kv-cache-memory", KV_BYTES, "--served-model-name",
                        "tiny", "--reasoning-parser", "qwen3"])
    (reasoning, content), = generate(s, stream)
    assert not reasoning
    assert content == plain_text


def test_unknown_parser_is_refused(byte_model_dir):
    import subprocess
    from conftest import pagellm_bin
    r = subprocess.run([pagellm_bin(), "serve", "--model", byte_model_dir, "--port", "0",
                        "--reasoning-parser", "r2"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "deepseek_r1 or qwen3" in r.stderr + r.stdout
