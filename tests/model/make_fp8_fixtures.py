#!/usr/bin/env python3
"""Builds tiny random FP8 (e4m3) checkpoints in the layouts FP8 models are published in, and
records what transformers computes on their *dequantized* weights (float32: each e4m3 value times
its scale, the math pagellm's weight-only path does), in the golden format of make_fixtures.py, so
tests/model/golden_test.cpp runs them:

  fp8_llama_tensor       quant_method "fp8", one scale per tensor ("weight_scale"), static
                         activation scales ("input_scale", checked and unused by weight-only math)
  fp8_qwen2_block        quant_method "fp8", weight_block_size [128, 128], "weight_scale_inv"
  ct_fp8_mistral_channel compressed-tensors float-quantized, strategy channel, bf16 scales [M, 1]
  fp8_deepseek_v3_block  DeepSeek-V3 (MLA, routed and shared experts, noaux_tc routing) with the
                         names and block scales DeepSeek-V3/R1 are published with

Every 2-D projection of the decoder is FP8; embeddings, norms, the LM head and MoE routers stay
bf16, as the published checkpoints keep them. Scales are the block's (row's, tensor's) largest
magnitude over 448, the values torch's round-to-nearest-even cast of weight / scale.

Needs torch and transformers. The outputs are committed:
    python tests/model/make_fp8_fixtures.py --out tests/data/golden
"""
import argparse
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import (BASE, MLA, classic_config, random_state,  # noqa: E402
                           write_quantized_fixture)

FP8_MAX = 448.0
# Row lengths that are multiples of 32 (pagellm keeps 32-value blocks) and of the 128-wide
# blocks where it matters; the initializer as make_quant_fixtures.py's, for the same reason.
QBASE = dict(BASE, hidden_size=128, intermediate_size=256, num_attention_heads=4,
             num_key_value_heads=2, initializer_range=BASE["initializer_range"] * 0.5 ** 0.5)

# name -> (model_type, architecture, config overrides, scheme)
VARIANTS = {
    "fp8_llama_tensor": ("llama", "LlamaForCausalLM", {}, "tensor"),
    "fp8_qwen2_block": ("qwen2", "Qwen2ForCausalLM", {}, "block"),
    "ct_fp8_mistral_channel": ("mistral", "MistralForCausalLM", {"sliding_window": None},
                               "ct_channel"),
    "fp8_deepseek_v3_block": ("deepseek_v3", "DeepseekV3ForCausalLM",
                              dict(MLA, q_lora_rank=32, topk_method="noaux_tc",
                                   scoring_func="sigmoid", n_group=4, topk_group=2,
                                   num_experts_per_tok=3, norm_topk_prob=True,
                                   routed_scaling_factor=2.5), "block"),
}


def quantized(name, shape):
    if len(shape) != 2 or not name.endswith(".weight"):
        return False
    skip = ("embed_tokens", "lm_head", "norm", "mlp.gate.weight", "block_sparse_moe.gate.weight")
    return not any(s in name for s in skip)


def to_fp8(w, scale):
    """w / scale (scale broadcast to w's shape) as e4m3, and its dequantized float32."""
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, q.float() * scale


def quantize(w, scheme):
    """(tensors to store for this weight, its dequantized float32 weight)."""
    m, k = w.shape
    if scheme == "tensor":
        scale = (w.abs().max() / FP8_MAX).clamp(min=1e-12)
        q, deq = to_fp8(w, scale)
        return {"weight": q, "weight_scale": scale.reshape([]).float(),
                "input_scale": torch.tensor(0.02, dtype=torch.float32)}, deq
    if scheme == "ct_channel":
        scale = (w.abs().amax(1, keepdim=True) / FP8_MAX).clamp(min=1e-12).bfloat16().float()
        q, deq = to_fp8(w, scale)
        return {"weight": q, "weight_scale": scale.bfloat16()}, deq
    b = 128
    rows, cols = -(-m // b), -(-k // b)
    scale = torch.empty(rows, cols)
    for i in range(rows):
        for j in range(cols):
            scale[i, j] = (w[i * b:(i + 1) * b, j * b:(j + 1) * b].abs().max() / FP8_MAX).clamp(min=1e-12)
    full = scale.repeat_interleave(b, 0)[:m].repeat_interleave(b, 1)[:, :k]
    q, deq = to_fp8(w, full)
    return {"weight": q, "weight_scale_inv": scale}, deq


def quant_config(scheme):
    if scheme == "tensor":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "static"}
    if scheme == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128]}
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                            "strategy": "channel", "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "symmetric": True,
                                      "strategy": "token", "dynamic": True}}}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/golden")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    for name, (model_type, arch, overrides, scheme) in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        folder = os.path.join(args.out, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        classic = classic_config(model_type, arch, dict(QBASE, **overrides))
        state = random_state(classic, name, torch.bfloat16)
        stored, dequant = {}, {}
        for n, w in state.items():
            if not quantized(n, w.shape):
                stored[n] = w
                dequant[n] = w.float()
                continue
            prefix = n[: -len(".weight")]
            parts, deq = quantize(w.float(), scheme)
            for part, v in parts.items():
                stored[f"{prefix}.{part}"] = v.contiguous()
            dequant[n] = deq
        classic["quantization_config"] = quant_config(scheme)
        classic["torch_dtype"] = "bfloat16"
        m = write_quantized_fixture(folder, name, arch, classic, stored, dequant,
                                    f"fp8 e4m3 ({scheme})",
                                    {"quantization": {"format": "fp8", "scales": scheme}})
        print(f"{name}: {arch} fp8 {scheme}, min greedy margin {m:.4f}")


if __name__ == "__main__":
    main()
