#!/usr/bin/env python3
"""Converts a Hugging Face Llama / Mistral / Qwen2 / Qwen3 checkpoint folder into a GGUF file laid
out the way llama.cpp's converter lays it out, so that pagellm's GGUF reader can be tested against
the safetensors original.

    python scripts/hf_to_gguf.py MODEL_DIR --outtype q8_0 --outfile model-q8_0.gguf

Input: config.json, *.safetensors (one file or shards), optionally tokenizer.json (byte-level BPE),
tokenizer_config.json (add_bos_token, chat_template) and generation_config.json (eos/bos ids).

Output conventions (those of llama.cpp):
  * tensor names token_embd / blk.N.attn_q / ... / output_norm / output, dims fastest-first;
  * 2-D weights in --outtype (a row whose length is not a multiple of 32 falls back to f16),
    1-D tensors (norms, biases) always f32;
  * arch "llama" (Llama and Mistral): the rows of q_proj and k_proj (weights and biases) are
    permuted per head from HF's rotate-half RoPE order to GGML's interleaved order;
  * llama3 RoPE scaling is not stored as keys but as per-frequency divisors in rope_freqs.weight;
  * with tokenizer.json: tokenizer.ggml.model "gpt2", tokens (padded to vocab_size with [PADi]),
    token_type, merges, pre-tokenizer name, special token ids, chat template.

Needs numpy, safetensors and gguf (no torch).
"""
import argparse
import json
import math
import os
import struct
import sys
from pathlib import Path

import numpy as np
from safetensors import safe_open

import gguf

OUTTYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (gguf.GGMLQuantizationType.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),
}

# model_type -> GGUF architecture
ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

# HF layer tensor -> llama.cpp name (without the "blk.N." prefix).
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

# Split regexes of known byte-level BPE pre-tokenizers -> llama.cpp's pre-tokenizer names.
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def fail(msg):
    sys.exit(f"hf_to_gguf: {msg}")


def hf_to_gguf_name(name):
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    parts = name.split(".")
    # model.layers.N.<module...>.<weight|bias>
    if len(parts) >= 5 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        module = ".".join(parts[3:-1])
        if module in LAYER_NAMES and parts[-1] in ("weight", "bias"):
            return f"blk.{parts[2]}.{LAYER_NAMES[module]}.{parts[-1]}"
    return None


def load_safetensors(model_dir):
    """All tensors of the folder's *.safetensors as float32 numpy arrays (bf16 widened exactly)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        fail(f"{model_dir}: no *.safetensors files")
    out = {}
    for path in files:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        data_start = 8 + n
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                if name in out:
                    fail(f"{path}: tensor {name} appears in two files")
                dtype = f.get_slice(name).get_dtype()
                if dtype == "BF16":  # numpy has no bfloat16: widen the raw bits
                    begin, end = header[name]["data_offsets"]
                    raw = np.fromfile(path, dtype="<u2", count=(end - begin) // 2, offset=data_start + begin)
                    arr = (raw.astype(np.uint32) << 16).view(np.float32).reshape(header[name]["shape"])
                elif dtype in ("F32", "F16", "F64"):
                    arr = f.get_tensor(name).astype(np.float32)
                else:
                    fail(f"{path}: tensor {name} has dtype {dtype}; expected F32, F16 or BF16")
                out[name] = arr
    return out


def permute_qk(w, n_head):
    """llama.cpp's q/k permutation: per head, rows [x0..x_{d/2-1} | x_{d/2}..x_{d-1}] (HF's
    rotate-half order) become [x0, x_{d/2}, x1, x_{d/2+1}, ...] (GGML's interleaved order)."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        fail(f"q/k projection with {rows} rows does not split into {n_head} heads of even size")
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_params(cfg):
    """(theta, scaling dict or None) from classic keys or transformers 5's rope_parameters."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and "full_attention" in rp:
        rp = rp["full_attention"]
    if isinstance(rp, dict):
        theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
        kind = rp.get("rope_type", rp.get("type", "default"))
        return theta, (None if kind == "default" else dict(rp, rope_type=kind))
    theta = cfg.get("rope_theta", 10000.0)
    rs = cfg.get("rope_scaling")
    if not rs:
        return theta, None
    kind = rs.get("rope_type", rs.get("type", "default"))
    return theta, (None if kind == "default" else dict(rs, rope_type=kind))


def llama3_rope_freqs(theta, rot_dim, scaling, cfg):
    """The per-frequency divisors llama.cpp stores for llama3 RoPE scaling (HF's formula)."""
    factor = scaling["factor"]
    low = scaling.get("low_freq_factor", 1.0)
    high = scaling.get("high_freq_factor", 4.0)
    old_ctx = scaling.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings", 8192))
    low_wavelen = old_ctx / low
    high_wavelen = old_ctx / high
    out = []
    for i in range(0, rot_dim, 2):
        freq = 1.0 / (theta ** (i / rot_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def encode(arr, qtype):
    """(data, raw_dtype) for GGUFWriter.add_tensor."""
    if qtype == gguf.GGMLQuantizationType.F32:
        return arr.astype(np.float32), None
    if qtype == gguf.GGMLQuantizationType.F16:
        return arr.astype(np.float16), None
    return gguf.quants.quantize(arr.astype(np.float32), qtype), qtype


def pre_tokenizer_name(tok, model_type):
    """llama.cpp's name for the tokenizer's pre-tokenization rules."""
    def regexes(node):
        if not isinstance(node, dict):
            return []
        found = []
        if node.get("type") == "Split":
            pattern = node.get("pattern", {})
            if "Regex" in pattern:
                found.append(pattern["Regex"])
        for child in node.get("pretokenizers", []) or []:
            found += regexes(child)
        return found

    found = regexes(tok.get("pre_tokenizer") or {})
    if LLAMA3_REGEX in found:
        return "llama-bpe"
    if QWEN2_REGEX in found:
        return "qwen2"
    if not found:
        return "gpt-2"
    fallback = {"qwen2": "qwen2", "qwen3": "qwen2"}.get(model_type, "default")
    print(f"hf_to_gguf: unknown pre-tokenizer regex; writing tokenizer.ggml.pre = '{fallback}' "
          "(override with --pre)", file=sys.stderr)
    return fallback


def add_tokenizer(w, model_dir, vocab_size, model_type, pre_override):
    tok = json.loads(Path(model_dir, "tokenizer.json").read_text(encoding="utf-8"))
    model = tok.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        fail(f"{model_dir}/tokenizer.json: only byte-level BPE tokenizers (tokenizer.ggml.model "
             "'gpt2') are supported; use --no-tokenizer to convert the weights alone")
    vocab = dict(model["vocab"])
    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    for t in added.values():
        vocab[t["content"]] = t["id"]
    n = max(vocab_size, max(vocab.values()) + 1)
    by_id = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(n):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if added[i].get("special") else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_override or pre_tokenizer_name(tok, model_type))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)

    tc_path = Path(model_dir, "tokenizer_config.json")
    tc = json.loads(tc_path.read_text(encoding="utf-8")) if tc_path.exists() else {}
    if isinstance(tc.get("add_bos_token"), bool):
        w.add_add_bos_token(tc["add_bos_token"])
    # transformers 5 keeps the template in chat_template.jinja; older folders in tokenizer_config.json.
    jinja = Path(model_dir, "chat_template.jinja")
    if tc.get("chat_template"):
        w.add_chat_template(tc["chat_template"])
    elif jinja.exists():
        w.add_chat_template(jinja.read_text(encoding="utf-8"))


def first_id(v):
    if isinstance(v, list):
        return v[0] if v else None
    return v


def convert(args):
    model_dir = args.model_dir
    cfg = json.loads(Path(model_dir, "config.json").read_text())
    model_type = cfg.get("model_type")
    if model_type not in ARCHS:
        fail(f"{model_dir}/config.json: model_type {model_type!r} is not supported (llama, mistral, qwen2, qwen3)")
    arch = ARCHS[model_type]
    qtype, ftype = OUTTYPES[args.outtype]

    n_head = cfg["num_attention_heads"]
    n_head_kv = cfg.get("num_key_value_heads") or n_head
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    theta, scaling = rope_params(cfg)
    partial = cfg.get("partial_rotary_factor", 1.0)
    rot_dim = int(head_dim * partial)

    out = args.outfile or str(Path(model_dir, f"model-{args.outtype}.gguf"))
    w = gguf.GGUFWriter(out, arch)
    w.add_name(os.path.basename(os.path.normpath(model_dir)))
    w.add_file_type(int(ftype))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(rot_dim)
    w.add_vocab_size(cfg["vocab_size"])
    if "head_dim" in cfg:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)

    rope_freqs = None
    if scaling is not None:
        kind = scaling["rope_type"]
        if kind == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(scaling["factor"])
        elif kind == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            factor = scaling.get("factor")
            orig = scaling.get("original_max_position_embeddings",
                               cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"]))
            w.add_rope_scaling_factor(factor if factor else cfg["max_position_embeddings"] / orig)
            w.add_rope_scaling_orig_ctx_len(orig)
            for key in ("attention_factor", "mscale", "mscale_all_dim"):
                if scaling.get(key) is not None:
                    fail(f"{model_dir}/config.json: yarn {key} has no llama.cpp equivalent")
            if scaling.get("beta_fast"):
                w.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
            if scaling.get("beta_slow"):
                w.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])
        elif kind == "llama3" and arch == "llama":
            rope_freqs = llama3_rope_freqs(theta, rot_dim, scaling, cfg)
        else:
            fail(f"{model_dir}/config.json: rope scaling {kind!r} has no llama.cpp equivalent")

    # Sliding window: Mistral's applies to every layer (HF's default 4096 when the key is absent);
    # Qwen2/Qwen3's per-layer rule has no GGUF equivalent.
    if model_type == "mistral":
        window = cfg.get("sliding_window", 4096)
        if window is not None:
            w.add_sliding_window(window)
    elif model_type in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
        fail(f"{model_dir}/config.json: use_sliding_window is not supported")

    gen_path = Path(model_dir, "generation_config.json")
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    bos = first_id(gen.get("bos_token_id", cfg.get("bos_token_id")))
    eos = first_id(gen.get("eos_token_id", cfg.get("eos_token_id")))
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if not args.no_tokenizer and Path(model_dir, "tokenizer.json").exists():
        add_tokenizer(w, model_dir, cfg["vocab_size"], model_type, args.pre)

    tensors = load_safetensors(model_dir)
    if cfg.get("tie_word_embeddings") and "lm_head.weight" in tensors:
        del tensors["lm_head.weight"]  # tied: llama.cpp stores only token_embd
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    for name, arr in tensors.items():
        gname = hf_to_gguf_name(name)
        if gname is None:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            fail(f"{model_dir}: tensor {name} has no llama.cpp counterpart")
        if arch == "llama" and ".self_attn.q_proj." in name:
            arr = permute_qk(arr, n_head)
        elif arch == "llama" and ".self_attn.k_proj." in name:
            arr = permute_qk(arr, n_head_kv)
        if arr.ndim == 1:
            data, raw = encode(arr, gguf.GGMLQuantizationType.F32)
        elif qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0,
                       gguf.GGMLQuantizationType.Q4_1) and arr.shape[-1] % 32 != 0:
            data, raw = encode(arr, gguf.GGMLQuantizationType.F16)  # llama.cpp's fallback
        else:
            data, raw = encode(arr, qtype)
        w.add_tensor(gname, data, raw_dtype=raw)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--outfile", help="output path (default MODEL_DIR/model-OUTTYPE.gguf)")
    ap.add_argument("--outtype", choices=sorted(OUTTYPES), default="f16")
    ap.add_argument("--no-tokenizer", action="store_true", help="do not write tokenizer metadata")
    ap.add_argument("--pre", help="tokenizer.ggml.pre value (default: inferred from tokenizer.json)")
    convert(ap.parse_args())


if __name__ == "__main__":
    main()
