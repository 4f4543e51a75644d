#!/usr/bin/env python3
"""Builds tiny random GGUF checkpoints quantized by llama.cpp's own quantizer to the k-quant mixes
people serve (Q4_K_M, Q5_K_M, Q6_K, Q3_K_M, Q2_K), and records what transformers computes on them
(transformers reads GGUF files and dequantizes them with the gguf package), in the golden format of
make_fixtures.py, so tests/model/golden_test.cpp runs them on the CPU and the GPU.

Rows are 256 wide (k-quants need multiples of 256), except the attention's 64-wide per-head
vectors, which never reach the quantizer; llama.cpp's mixes put Q5_0 / Q6_K / Q8_0 where their
rules say, so each file holds several types.

Needs torch, transformers, gguf (0.19.0) and llama.cpp's llama-quantize (built from the
llama-cpp-python 0.3.36 source distribution's vendor/llama.cpp:
`cmake -B build && cmake --build build --target llama-quantize`). The outputs are committed:
    python tests/model/make_gguf_kquant_fixtures.py --quantize PATH/TO/llama-quantize
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import gguf
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import BASE, classic_config, random_model, write_reference  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# 256-wide rows; the initializer range scaled to the width (see make_quant_fixtures.py).
KBASE = dict(BASE, hidden_size=256, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=BASE["initializer_range"] * 0.5)

# An MLP 288 wide: ffn_down's rows are not a multiple of 256, so llama.cpp's mixes fall back to
# Q5_0 (Q4_K_M) and Q5_1 (Q5_K_M) there, as in models whose widths are not (SmolLM2's 576).
NARROW = {"intermediate_size": 288}

# name -> (model_type, architecture, llama.cpp file type, config overrides)
VARIANTS = {
    "gguf_llama_q4_k_m": ("llama", "LlamaForCausalLM", "Q4_K_M", {}),
    "gguf_llama_q5_k_m": ("llama", "LlamaForCausalLM", "Q5_K_M", {}),
    "gguf_llama_q6_k": ("llama", "LlamaForCausalLM", "Q6_K", {}),
    "gguf_llama_q3_k_m": ("llama", "LlamaForCausalLM", "Q3_K_M", {}),
    "gguf_llama_q2_k": ("llama", "LlamaForCausalLM", "Q2_K", {}),
    "gguf_qwen2_q4_k_m": ("qwen2", "Qwen2ForCausalLM", "Q4_K_M", {}),
    "gguf_llama_q4_k_m_q5_0": ("llama", "LlamaForCausalLM", "Q4_K_M", NARROW),
    "gguf_llama_q5_k_m_q5_1": ("llama", "LlamaForCausalLM", "Q5_K_M", NARROW),
}


def write_byte_tokenizer(folder):
    """A byte-level BPE tokenizer.json of the fixtures' 256 tokens, one a byte: the GGUF files
    carry a vocabulary so that llama.cpp loads them (add_llama_cpp_reference.py). llama.cpp
    wants merges too: one ("a" + "b"), whose result no token is, so it never applies."""
    # GPT-2's byte-to-character map: printable bytes map to themselves, the rest above 255.
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                             "use_regex": False},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None,
                     "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": False, "byte_fallback": False,
                     "vocab": {chars[b]: b for b in range(256)}, "merges": ["a b"]}}
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tok, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/golden")
    ap.add_argument("--quantize", required=True, help="llama.cpp's llama-quantize binary")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    for name, (model_type, arch, ftype, overrides) in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        folder = os.path.join(args.out, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        classic = classic_config(model_type, arch, dict(KBASE, **overrides))
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(classic, f)
            model = random_model(tmp, name)
            model.save_pretrained(tmp)
            write_byte_tokenizer(tmp)
            f32 = os.path.join(tmp, "model-f32.gguf")
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "hf_to_gguf.py"), tmp,
                            "--outtype", "f32", "--outfile", f32], check=True,
                           stdout=subprocess.DEVNULL)
            out = os.path.join(folder, "model.gguf")
            subprocess.run([args.quantize, f32, out, ftype], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        types = sorted({t.tensor_type.name for t in gguf.GGUFReader(out).tensors})

        # The reference: transformers reading the quantized file (the gguf package dequantizes).
        m = write_reference(
            folder, name, arch, f"gguf {ftype}", classic["vocab_size"],
            lambda dt: AutoModelForCausalLM.from_pretrained(folder, gguf_file="model.gguf",
                                                            dtype=dt).eval(),
            {"gguf_tensor_types": types})
        print(f"{name}: {ftype} ({', '.join(types)}), {os.path.getsize(out)} bytes, "
              f"min greedy margin {m:.4f}")


if __name__ == "__main__":
    main()
