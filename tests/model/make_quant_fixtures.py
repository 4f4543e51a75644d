#!/usr/bin/env python3
"""Builds tiny random 4-bit checkpoints (AWQ, GPTQ, compressed-tensors pack-quantized) of the
architectures pagellm serves, packed by the reference libraries' own packers, and records what
transformers computes on their *dequantized* weights (the same math pagellm does: d * (q - z) in
float32), in the golden format of make_fixtures.py, so tests/model/golden_test.cpp runs them.

Needs torch, transformers, autoawq (0.2.9), auto-gptq (0.7.1, built without its CUDA extension:
BUILD_CUDA_EXT=0 pip install --no-deps --no-build-isolation auto-gptq==0.7.1) and
compressed-tensors (0.20.0). Only the packing modules of AutoAWQ and AutoGPTQ are imported (their
packages' __init__ pull in training dependencies). The outputs are committed:
    python tests/model/make_quant_fixtures.py --out tests/data/golden

For every quantized tensor the script also unpacks the packed tensors itself (numpy, from the
formats' published layouts) and checks the result equals the library's own dequantization bit for
bit, so the layout pagellm reads is the one the libraries write.
"""
import argparse
import os
import shutil
import sys
import types
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import (BASE, MLA, classic_config, random_state,  # noqa: E402
                           write_quantized_fixture)

warnings.filterwarnings("ignore")


def import_without_init(package):
    """Makes `package` importable module by module without running its __init__."""
    import importlib.util
    spec = importlib.util.find_spec(package)
    pkg = types.ModuleType(package)
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules[package] = pkg


import_without_init("awq")
import_without_init("auto_gptq")
from awq.modules.linear.gemm import WQLinear_GEMM  # noqa: E402
from awq.utils.packing_utils import dequantize_gemm  # noqa: E402
from auto_gptq.nn_modules.qlinear.qlinear_cuda_old import QuantLinear as GptqLinear  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme  # noqa: E402

# Shapes whose every quantized row length (128, 256; 32 for DeepSeek's latent and expert rows) is a
# multiple of each group size used, and every output count a multiple of 32 (AutoGPTQ packs the
# zero points of 32 outputs at a time: DeepSeek's rotary part is 32 wide for that).
# The initializer range is BASE's scaled by sqrt(64 / 128), so logits are as peaked as the 64-wide
# fixtures' and bf16's noise on the GPU as small (at BASE's 0.25 transformers' own bf16 error was
# 2.3x the float fixtures', its max a fragile bound).
QBASE = dict(BASE, hidden_size=128, intermediate_size=256, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=BASE["initializer_range"] * 0.5 ** 0.5)

# name -> (model_type, architecture, config overrides, format, group size, symmetric)
VARIANTS = {
    "awq_llama": ("llama", "LlamaForCausalLM", {}, "awq", 128, False),
    "awq_qwen2": ("qwen2", "Qwen2ForCausalLM", {}, "awq", 64, False),
    "awq_mixtral": ("mixtral", "MixtralForCausalLM",
                    {"intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2,
                     "sliding_window": None}, "awq", 64, False),
    "gptq_llama_sym": ("llama", "LlamaForCausalLM", {}, "gptq", 32, True),
    "gptq_mistral": ("mistral", "MistralForCausalLM", {"sliding_window": None}, "gptq", 128, False),
    "gptq_qwen3_rows": ("qwen3", "Qwen3ForCausalLM", {"head_dim": 32}, "gptq", -1, True),
    "gptq_deepseek_v2": ("deepseek_v2", "DeepseekV2ForCausalLM",
                         dict(MLA, num_key_value_heads=4, moe_intermediate_size=32,
                              intermediate_size=256, qk_rope_head_dim=32), "gptq", 32, False),
    "ct_llama": ("llama", "LlamaForCausalLM", {}, "ct", 64, True),
    "ct_mistral_rows": ("mistral", "MistralForCausalLM", {"sliding_window": None}, "ct", -1,
                        False),
    # GPTQ act-order (desc_act): each linear's inputs quantized in a permuted order, g_idx giving
    # each input's group.
    "gptq_llama_act_order": ("llama", "LlamaForCausalLM", {}, "gptq_act_order", 64, False),
}

# Weights that stay in their float type: embeddings, norms, the LM head and MoE routers.
def quantized(name, shape):
    if len(shape) != 2 or not name.endswith(".weight"):
        return False
    skip = ("embed_tokens", "lm_head", "norm", "mlp.gate.weight", "block_sparse_moe.gate.weight")
    return not any(s in name for s in skip)


def rtn(w, group, symmetric):
    """Round-to-nearest 4-bit group quantization of w [N, K] (float32): ints q [N, K], scales and
    zero points [N, K/group], as AutoAWQ's and GPTQ's round-to-nearest compute them."""
    n, k = w.shape
    g = k if group == -1 else group
    wg = w.reshape(n, k // g, g)
    lo, hi = wg.amin(-1), wg.amax(-1)
    if symmetric:
        hi = torch.maximum(lo.abs(), hi)
        scale = (2 * hi / 15).clamp(min=1e-5)
        zero = torch.full_like(scale, 8.0)
    else:
        scale = ((hi - lo) / 15).clamp(min=1e-5)
        zero = (-torch.round(lo / scale)).clamp(0, 15)
    scale = scale.half().float()  # the scale as stored
    q = (torch.round(wg / scale[..., None]) + zero[..., None]).clamp(0, 15)
    return q.reshape(n, k), scale, zero


def pseudo(q, scale, zero, group):
    n, k = q.shape
    g = k if group == -1 else group
    return ((q.reshape(n, k // g, g) - zero[..., None]) * scale[..., None]).reshape(n, k)


# --- the formats' layouts, unpacked here from their published descriptions ---

def nibbles(words, axis):
    """int32 words -> their 8 nibbles, low first, spread along `axis`."""
    w = words.astype(np.uint32)
    parts = [(w >> (4 * i)) & 0xF for i in range(8)]
    return np.stack(parts, axis=axis + 1).reshape(
        *w.shape[:axis], w.shape[axis] * 8, *w.shape[axis + 1:])


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_columns(words):
    v = nibbles(words, 1)  # [rows, N]: nibble i of word c at column 8c + i
    out = np.empty_like(v)
    for i, o in enumerate(AWQ_ORDER):
        out[:, o::8] = v[:, i::8]
    return out


def unpack_awq(t, group):
    q = awq_columns(t["qweight"]).T  # [N, K]
    z = awq_columns(t["qzeros"]).T  # [N, K/G]
    s = t["scales"].astype(np.float32).T
    return (q.astype(np.float32) - np.repeat(z, group, 1)) * np.repeat(s, group, 1)


def unpack_gptq(t, group):
    q = nibbles(t["qweight"], 0).T  # [N, K]
    z = (nibbles(t["qzeros"], 1).T + 1) & 0xF  # v1: stored z - 1
    s = t["scales"].astype(np.float32).T
    g = t["g_idx"]
    return (q.astype(np.float32) - z[:, g]) * s[:, g]


def unpack_ct(t, group, symmetric):
    n, k = (int(x) for x in t["weight_shape"])
    g = k if group == -1 else group
    q = nibbles(t["weight_packed"], 1)[:, :k].astype(np.float32)  # stored q + 8
    s = t["weight_scale"].astype(np.float32)
    z = 8 + 0 * s if symmetric else nibbles(t["weight_zero_point"], 0)[:n].astype(np.float32)
    return (q - np.repeat(z, g, 1)) * np.repeat(s, g, 1)


# --- packing through the libraries, and their own dequantization ---

def pack_awq(w, group):
    q, scale, zero = rtn(w, group, symmetric=False)
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight.data = pseudo(q, scale, zero, group).half()
    m = WQLinear_GEMM.from_linear(lin, 4, group, scales=scale.t().contiguous().half(),
                                  zeros=zero.t().contiguous().half())
    t = {"qweight": m.qweight, "qzeros": m.qzeros, "scales": m.scales}
    ref = dequantize_gemm(m.qweight, m.qzeros, m.scales.float(), 4, group).t()
    return t, ref


def pack_gptq(w, group, symmetric, act_order=False):
    n, k = w.shape
    g = k if group == -1 else group
    if act_order:
        # GPTQ orders the inputs by its Hessian's diagonal; any fixed permutation exercises the
        # layout. Groups are formed in that order; g_idx gives each input its group.
        perm = torch.randperm(k, generator=torch.Generator().manual_seed(k + n))
        inv = torch.argsort(perm)
        qp, scale, zero = rtn(w[:, perm], group, symmetric)
        q, g_idx = qp[:, inv], inv // g
    else:
        q, scale, zero = rtn(w, group, symmetric)
        g_idx = torch.arange(k) // g
    lin = torch.nn.Linear(k, n, bias=False)
    lin.weight.data = ((q - zero[:, g_idx]) * scale[:, g_idx]).half()
    m = GptqLinear(4, group, k, n, bias=False)
    m.pack(lin, scale.half(), zero, g_idx)
    t = {"qweight": m.qweight, "qzeros": m.qzeros, "scales": m.scales, "g_idx": m.g_idx}
    # AutoGPTQ's own (torch) dequantization, with float32 scales so nothing rounds.
    m.scales = m.scales.float()
    with torch.no_grad():
        ref = m(torch.eye(k)).t()
    return t, ref


def ct_scheme(group, symmetric):
    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric,
                            strategy="channel" if group == -1 else "group",
                            group_size=None if group == -1 else group)
    return QuantizationScheme(targets=["Linear"], weights=args)


def pack_ct(w, group, symmetric):
    q, scale, zero = rtn(w, group, symmetric)
    scheme = ct_scheme(group, symmetric)
    sd = {"weight": pseudo(q, scale, zero, group), "weight_scale": scale.bfloat16()}
    if not symmetric:
        sd["weight_zero_point"] = (zero - 8).to(torch.int8)
    t = PackedQuantizationCompressor.compress(sd, scheme)
    dq = dict(t, weight_scale=t["weight_scale"].float())
    ref = PackedQuantizationCompressor.decompress(dq, scheme)["weight"]
    return t, ref


def quant_config(fmt, group, symmetric):
    if fmt == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": None}
    if fmt in ("gptq", "gptq_act_order"):
        return {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": symmetric,
                "desc_act": fmt == "gptq_act_order", "checkpoint_format": "gptq",
                "damp_percent": 0.01, "true_sequential": True, "static_groups": False}
    cfg = QuantizationConfig(config_groups={"group_0": ct_scheme(group, symmetric)},
                             format="pack-quantized", ignore=["lm_head"])
    return cfg.model_dump(exclude_none=False, mode="json")


def to_numpy(t):
    return {k: (v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()) for k, v in t.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/golden")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    for name, (model_type, arch, overrides, fmt, group, symmetric) in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        folder = os.path.join(args.out, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        classic = classic_config(model_type, arch, dict(QBASE, **overrides))
        state = random_state(classic, name, torch.float16 if fmt != "ct" else torch.bfloat16)
        packed, dequant = {}, {}
        for n, w in state.items():
            if not quantized(n, w.shape):
                packed[n] = w
                dequant[n] = w.float()
                continue
            prefix = n[: -len(".weight")]
            w32 = w.float()
            if fmt == "awq":
                t, ref = pack_awq(w32, group)
                mine = unpack_awq(to_numpy(t), group)
            elif fmt in ("gptq", "gptq_act_order"):
                t, ref = pack_gptq(w32, group, symmetric, act_order=fmt == "gptq_act_order")
                mine = unpack_gptq(to_numpy(t), group)
            else:
                t, ref = pack_ct(w32, group, symmetric)
                mine = unpack_ct(to_numpy(t), group, symmetric)
            if not np.array_equal(mine, ref.float().numpy()):
                raise SystemExit(f"{name}: {n}: unpacking differs from the library's dequantization "
                                 f"(max {np.abs(mine - ref.float().numpy()).max()})")
            for part, v in t.items():
                packed[f"{prefix}.{part}"] = v.contiguous()
            dequant[n] = torch.from_numpy(mine)
        classic["quantization_config"] = quant_config(fmt, group, symmetric)
        classic["torch_dtype"] = "float16" if fmt != "ct" else "bfloat16"
        m = write_quantized_fixture(
            folder, name, arch, classic, packed, dequant, f"{fmt} 4-bit",
            {"quantization": {"format": fmt, "group_size": group, "symmetric": symmetric}})
        print(f"{name}: {arch} {fmt} group {group}, min greedy margin {m:.4f}")


if __name__ == "__main__":
    main()
