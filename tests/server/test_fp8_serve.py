"""An FP8 DeepSeek-V3 checkpoint served end to end.

The tiny fp8_deepseek_v3_block golden fixture (tests/model/make_fp8_fixtures.py: multi-head
latent attention, routed and shared experts with noaux_tc routing, DeepSeek-V3's published tensor
names with e4m3 weights and 128 x 128 block scales in weight_scale_inv) gets a byte-level
tokenizer and runs through `pagellm serve` on the CPU. Through the official openai client, greedy
completions of the fixture's prompts must give transformers' greedy tokens on the dequantized
weights, with their log-probabilities.
"""
import json
import math
import os
import subprocess

import pytest

from byte_model import make_byte_model
from conftest import KV_BYTES, ROOT, Server, pagellm_bin

FIXTURE = os.path.join(ROOT, "tests", "data", "golden", "fp8_deepseek_v3_block")
NAME = "deepseek-v3-fp8-tiny"


@pytest.fixture(scope="module")
def fp8_server(tmp_path_factory):
    model = make_byte_model(FIXTURE, str(tmp_path_factory.mktemp("fp8_deepseek_v3")))
    s = Server(["--model", model, "--kv-cache-memory", KV_BYTES, "--served-model-name", NAME])
    yield s
    assert s.stop() == 0


def test_greedy_tokens_and_logprobs_match_transformers(fp8_server):
    with open(os.path.join(FIXTURE, "reference.json"), encoding="utf-8") as f:
        ref = json.load(f)
    c = fp8_server.client()
    for case in ref["cases"]:
        prompt, greedy = case["prompt"], case["greedy"]
        r = c.completions.create(model=NAME, prompt=prompt, max_tokens=len(greedy), temperature=0,
                                 logprobs=1, extra_body={"return_token_ids": True, "ignore_eos": True})
        choice = r.choices[0]
        assert choice.model_extra["token_ids"] == greedy
        assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(greedy)
        for i, lp in enumerate(choice.logprobs.token_logprobs):
            # The CPU computes in f32 from the same FP8 values and scales (the golden tests' bound).
            assert math.isclose(lp, case["full_logprobs"][len(prompt) + i], abs_tol=2e-3), i


def test_an_fp8_kv_cache_serves_the_same_fixture(tmp_path):
    # --kv-cache-dtype fp8: keys and latent rows stored as e4m3 (a quarter of the CPU's f32 bytes
    # a token); the completions run through (their tokens may differ from f32's at near-ties:
    # tests/unit/runtime/engine_fp8_kv_test.cpp measures by how much).
    model = make_byte_model(FIXTURE, str(tmp_path))
    s = Server(["--model", model, "--kv-cache-memory", KV_BYTES, "--served-model-name", NAME,
                "--kv-cache-dtype", "fp8"])
    try:
        c = s.client()
        r = c.completions.create(model=NAME, prompt="hello", max_tokens=12, temperature=0,
                                 logprobs=1, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 12
        assert all(math.isfinite(lp) for lp in r.choices[0].logprobs.token_logprobs)
    finally:
        assert s.stop() == 0
    bad = subprocess.run([pagellm_bin(), "serve", "--port", "0", "--model", model,
                          "--kv-cache-dtype", "int8"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    assert "--kv-cache-dtype must be auto, fp8 or fp8_e4m3" in bad.stderr, bad.stderr[-2000:]
