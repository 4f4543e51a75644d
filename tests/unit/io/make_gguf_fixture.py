#!/usr/bin/env python3
"""Test fixture for the GGUF reader: a tiny random Llama-shaped Hugging Face checkpoint and its
conversion by scripts/hf_to_gguf.py to every tensor type pagellm reads.

    python tests/unit/io/make_gguf_fixture.py --out DIR

Writes DIR/hf/{config.json, model.safetensors, tokenizer.json} (weights in bf16 as published
checkpoints are, norms in f32) and DIR/model-{f32,f16,bf16,q8_0,q4_0,q4_1}.gguf. Before returning
it checks the conversion from Python with independent code:
  * transformers' own GGUF loader permutation reversal (LlamaTensorProcessor) turns the stored
    q/k rows back into the checkpoint's, so the converter permutes exactly as llama.cpp does;
  * the tokenizer metadata matches tokenizer.json.
It also converts the golden checkpoints of tests/data/golden to DIR/golden/<name>.gguf (f32).
The C++ test (gguf_convert_test.cpp) then reads every tensor through GgufWeightSource.
Needs numpy, safetensors, gguf, tokenizers, transformers (no torch). Exits non-zero on a mismatch.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import gguf
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[3]
OUTTYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"]

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "attention_bias": True,  # q/k biases are permuted by the converter too
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bits (as torch does)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, raw little-endian bytes, shape). The format is an 8-byte
    header length, a JSON header and the data; numpy has no bfloat16, so it is written by hand."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, raw, shape) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def make_checkpoint(hf_dir, rng):
    c = CONFIG
    hd = c["hidden_size"] // c["num_attention_heads"]
    q_rows, kv_rows = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], c["hidden_size"]),
              "lm_head.weight": (c["vocab_size"], c["hidden_size"]),
              "model.norm.weight": (c["hidden_size"],)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes.update({
            p + "input_layernorm.weight": (c["hidden_size"],),
            p + "post_attention_layernorm.weight": (c["hidden_size"],),
            p + "self_attn.q_proj.weight": (q_rows, c["hidden_size"]),
            p + "self_attn.q_proj.bias": (q_rows,),
            p + "self_attn.k_proj.weight": (kv_rows, c["hidden_size"]),
            p + "self_attn.k_proj.bias": (kv_rows,),
            p + "self_attn.v_proj.weight": (kv_rows, c["hidden_size"]),
            p + "self_attn.v_proj.bias": (kv_rows,),
            p + "self_attn.o_proj.weight": (c["hidden_size"], q_rows),
            p + "self_attn.o_proj.bias": (c["hidden_size"],),
            p + "mlp.gate_proj.weight": (c["intermediate_size"], c["hidden_size"]),
            p + "mlp.up_proj.weight": (c["intermediate_size"], c["hidden_size"]),
            p + "mlp.down_proj.weight": (c["hidden_size"], c["intermediate_size"]),
        })
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            x = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            tensors[name] = ("F32", x.astype("<f4").tobytes(), shape)
            continue
        x = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 2:
            # Row scales over four decades (tiny rows land in f16's subnormal range, where the f16
            # conversion of a bf16 value is lossy), one all-zero quantization block, one outlier.
            x *= (10.0 ** rng.uniform(-5, 0, size=(shape[0], 1))).astype(np.float32)
            x[0, :32] = 0.0
            x[1, 5] = 40.0
        tensors[name] = ("BF16", to_bf16_bits(x).astype("<u2").tobytes(), shape)
    write_safetensors(hf_dir / "model.safetensors", tensors)
    # Sanity: the file reads back with the safetensors library.
    with safe_open(str(hf_dir / "model.safetensors"), framework="numpy") as f:
        assert sorted(f.keys()) == sorted(tensors), "safetensors round trip"
    (hf_dir / "config.json").write_text(json.dumps(c, indent=1))


def make_tokenizer(hf_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = ["the quick brown fox jumps over the lazy dog", "hello world, hello pagellm",
            "paged attention keeps the cache in blocks", "über naïve café 東京"] * 20
    tok.train_from_iterator(text, trainer)
    tok.save(str(hf_dir / "tokenizer.json"))


def check_conversion(out, hf_dir):
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    src = {}
    with open(hf_dir / "model.safetensors", "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
        base = 8 + n
    for name, e in header.items():
        b, end = e["data_offsets"]
        raw = np.fromfile(hf_dir / "model.safetensors", dtype="<u2" if e["dtype"] == "BF16" else "<f4",
                          count=(end - b) // (2 if e["dtype"] == "BF16" else 4), offset=base + b)
        x = (raw.astype(np.uint32) << 16).view(np.float32) if e["dtype"] == "BF16" else raw
        src[name] = x.reshape(e["shape"])

    reader = gguf.GGUFReader(str(out / "model-f32.gguf"))
    c = CONFIG
    proc = LlamaTensorProcessor(config={"num_attention_heads": c["num_attention_heads"],
                                        "num_key_value_heads": c["num_key_value_heads"]})
    n_checked = 0
    for t in reader.tensors:
        for part, hf_part in (("attn_q", "q_proj"), ("attn_k", "k_proj")):
            if f".{part}." not in t.name:
                continue
            layer, kind = t.name.split(".")[1], t.name.split(".")[-1]
            stored = np.array(t.data).reshape(tuple(reversed([int(d) for d in t.shape])))
            restored = proc.process(stored, t.name,
                                    parsed_parameters={"config": proc.config}).weights
            want = src[f"model.layers.{layer}.self_attn.{hf_part}.{kind}"]
            if not np.array_equal(restored, want):
                sys.exit(f"make_gguf_fixture: {t.name}: transformers' reversal does not give the checkpoint's rows")
            n_checked += 1
    if n_checked != 4 * c["num_hidden_layers"]:
        sys.exit(f"make_gguf_fixture: checked {n_checked} q/k tensors")

    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    fields = reader.fields
    def strings(key):
        f = fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    tokens = strings("tokenizer.ggml.tokens")
    vocab = tok["model"]["vocab"]
    assert len(tokens) == c["vocab_size"], len(tokens)
    for s, i in vocab.items():
        assert tokens[i] == s, (i, s, tokens[i])
    assert tokens[-1] == f"[PAD{c['vocab_size'] - 1}]"
    merges = strings("tokenizer.ggml.merges")
    want_merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    assert merges == want_merges
    types = [int(fields["tokenizer.ggml.token_type"].parts[i][0]) for i in fields["tokenizer.ggml.token_type"].data]
    assert types[1] == gguf.TokenType.CONTROL and types[10] == gguf.TokenType.NORMAL
    assert types[-1] == gguf.TokenType.UNUSED
    assert strings("tokenizer.ggml.model") == ["gpt2"]
    assert strings("tokenizer.ggml.pre") == ["gpt-2"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    hf_dir = out / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1234)
    make_checkpoint(hf_dir, rng)
    make_tokenizer(hf_dir)
    for t in OUTTYPES:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "hf_to_gguf.py"), str(hf_dir), "--outtype", t,
                        "--outfile", str(out / f"model-{t}.gguf")], check=True, stdout=subprocess.DEVNULL)
    check_conversion(out, hf_dir)
    # The golden checkpoints of tests/model (every Llama-family variant llama.cpp can represent:
    # not dynamic rope scaling) in f32, for the config comparison.
    golden = out / "golden"
    golden.mkdir(exist_ok=True)
    for d in sorted((ROOT / "tests" / "data" / "golden").iterdir()):
        # MoE / MLA fixtures (Mixtral, DeepSeek-V2/V3) are not converted: hf_to_gguf.py covers
        # the Llama family only, and float checkpoints only (not the 4-bit packed ones).
        if not (d / "config.json").exists() or d.name == "llama_dynamic":
            continue
        config = json.loads((d / "config.json").read_text())
        if config.get("model_type") in ("llama", "mistral", "qwen2", "qwen3") and "quantization_config" not in config:
            subprocess.run([sys.executable, str(ROOT / "scripts" / "hf_to_gguf.py"), str(d), "--outtype", "f32",
                            "--outfile", str(golden / f"{d.name}.gguf")], check=True, stdout=subprocess.DEVNULL)
    print(f"make_gguf_fixture: wrote {out}")


if __name__ == "__main__":
    main()
