"""Speculative decoding through `pagellm serve` and the official openai client, on the default
model (SmolLM2-135M-Instruct): asked to copy a paragraph, it repeats its prompt, which prompt
lookup guesses. The texts must equal those of the plain server (greedy, streamed and not), the
guesses must be counted in /metrics under vLLM's names, a draft model (the model itself: nearly
every guess right) must give the same texts, and bad settings must stop the server with the reason.
"""
import os
import re
import subprocess

import httpx
import pytest

from conftest import GOLDEN_LLAMA, KV_BYTES, ROOT, default_model_path, pagellm_bin

PARAGRAPH = ("The river left its banks in early spring, as it did most years, and the farmers along "
             "the valley moved their animals to the higher fields.")
PROMPTS = [
    f"Copy the following text exactly.\n\nText:\n{PARAGRAPH}\n\nCopy:\n",
    f"Repeat this sentence twice: {PARAGRAPH}\n",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n",
]
BASE = ["--max-model-len", "512", "--kv-cache-memory", KV_BYTES, "--served-model-name", "smol"]


def metric(server, name):
    text = httpx.get(server.url + "/metrics").text
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def texts(server, stream):
    out = []
    client = server.client()
    for p in PROMPTS:
        kw = dict(model="smol", prompt=p, max_tokens=64, temperature=0)
        if stream:
            out.append("".join(c.choices[0].text for c in client.completions.create(stream=True, **kw)
                               if c.choices))
        else:
            out.append(client.completions.create(**kw).choices[0].text)
    return out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    from conftest import Server
    default_model_path()
    s = Server(BASE)
    yield texts(s, False)
    assert s.stop() == 0


def test_prompt_lookup_keeps_the_texts_and_counts_its_guesses(server_factory, plain):
    s = server_factory(BASE + ["--speculative-method", "ngram"])
    assert metric(s, "vllm:spec_decode_num_drafts_total") == 0
    assert texts(s, False) == plain
    assert texts(s, True) == plain
    drafts = metric(s, "vllm:spec_decode_num_drafts_total")
    draft_tokens = metric(s, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric(s, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and 0 < accepted <= draft_tokens, (drafts, draft_tokens, accepted)
    assert accepted > draft_tokens / 3, "copying text, most guesses should be right"
    first = metric(s, "vllm:spec_decode_num_accepted_tokens_per_pos_total")  # position 0
    assert first > 0
    assert metric(s, "pagellm:spec_decode_draft_seconds_total") >= 0


def test_a_draft_model_keeps_the_texts(server_factory, plain):
    s = server_factory(BASE + ["--speculative-model", default_model_path(),
                               "--num-speculative-tokens", "3"])
    assert texts(s, False) == plain
    # The model drafting for itself: every guess right but near-ties, where its one-token steps
    # and the verifying chunk (other kernels, other rounding) may pick different tokens.
    accepted = metric(s, "vllm:spec_decode_num_accepted_tokens_total")
    draft_tokens = metric(s, "vllm:spec_decode_num_draft_tokens_total")
    assert draft_tokens > 0 and accepted >= 0.9 * draft_tokens, (accepted, draft_tokens)


def test_a_draft_model_draws_the_guesses_of_sampled_requests(server_factory):
    # Sampled requests draw their guesses from the draft's distribution and the rejection sampler
    # keeps each with probability min(1, p/q): the model drafting for itself (q = p but for
    # rounding) has nearly all kept, where guessing its own top token would be kept only as often
    # as the sampled token happens to be it.
    s = server_factory(BASE + ["--speculative-model", default_model_path(),
                               "--num-speculative-tokens", "3"])
    client = s.client()
    for i, p in enumerate(PROMPTS):
        r = client.completions.create(model="smol", prompt=p, max_tokens=48, temperature=1.0,
                                      top_p=0.95, seed=i, logprobs=1)
        c = r.choices[0]
        assert c.finish_reason in ("stop", "length")
        assert len(c.logprobs.tokens) == r.usage.completion_tokens > 0
    accepted = metric(s, "vllm:spec_decode_num_accepted_tokens_total")
    draft_tokens = metric(s, "vllm:spec_decode_num_draft_tokens_total")
    assert draft_tokens > 0 and accepted >= 0.9 * draft_tokens, (accepted, draft_tokens)


def test_no_speculation_metrics_without_it(plain):
    # (The plain server's texts were made above; a fresh one shows no spec_decode series.)
    from conftest import Server
    s = Server(BASE)
    try:
        assert metric(s, "vllm:spec_decode_num_drafts_total") is None
    finally:
        s.stop()


@pytest.mark.parametrize("args, fragment", [
    (["--speculative-method", "eagle"], "must be ngram, draft_model, mtp or none"),
    (["--speculative-method", "mtp"], "has no multi-token-prediction layers"),
    (["--speculative-method", "draft_model"], "needs --speculative-model"),
    (["--speculative-model", GOLDEN_LLAMA], "vocabulary (256 tokens)"),
    (["--speculative-method", "ngram", "--num-speculative-tokens", "0"], "out of range"),
    (["--speculative-method", "ngram", "--prompt-lookup-min", "5", "--prompt-lookup-max", "3"],
     "out of range"),
])
def test_bad_settings_stop_the_server_with_the_reason(args, fragment):
    r = subprocess.run([pagellm_bin(), "serve", "--port", "0", *BASE, *args], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    assert fragment in r.stderr, r.stderr[-2000:]


def test_mtp_serves_and_counts_its_guesses(server_factory):
    # DeepSeek-V3's MTP layer (the tiny golden model with a random one, no tokenizer: token ids
    # in): requests complete, the guesses are counted. That they keep the outputs is
    # tests/unit/runtime/engine_spec_test.cpp's MtpOutputsAreUnchanged.
    mtp_model = os.path.join(ROOT, "tests", "data", "mtp", "deepseek_v3")
    args = ["--model", mtp_model, "--max-model-len", "64", "--kv-cache-memory", KV_BYTES,
            "--served-model-name", "mtp", "--speculative-method", "mtp",
            "--speculative-disable-by-batch-size", "0"]
    s = server_factory(args)
    client = s.client()
    for prompt in ([5, 17, 42, 99, 3, 250, 7, 61], [9, 8, 7, 6, 5, 4, 3]):
        r = client.completions.create(model="mtp", prompt=prompt, max_tokens=20, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert 0 < r.usage.completion_tokens <= 20
    assert metric(s, "vllm:spec_decode_num_drafts_total") > 0
    assert metric(s, "vllm:spec_decode_num_draft_tokens_total") > 0
