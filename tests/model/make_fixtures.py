#!/usr/bin/env python3
"""Builds tiny random Hugging Face checkpoints for every architecture and RoPE variant pagellm
supports, and records what transformers computes for them: the log-probability of every prompt
position, a greedy continuation with each step's log-probability and top-2 margin, and the
teacher-forced log-probabilities of prompt + continuation in one forward pass.

Needs torch + transformers (run it where they are installed; the outputs are committed):
    python tests/model/make_fixtures.py --out tests/data/golden

Each fixture folder holds config.json (classic keys: rope_theta / rope_scaling),
config_v5.json (the same model in transformers 5's rope_parameters style), model.safetensors
and reference.json. Weights are stored in bf16, f16 or f32 (per variant) and the reference runs
in float32, so a correct fp32 engine matches to ~1e-5.
"""
import argparse
import json
import os
import shutil
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    hidden_act="silu",
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    initializer_range=0.25,  # large on purpose: peaked distributions, clear greedy margins
)

# Shared shape of the DeepSeek (MLA + DeepSeekMoE) fixtures, small enough for < 300 KB.
MLA = dict(num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
           v_head_dim=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
           moe_intermediate_size=32, first_k_dense_replace=1, moe_layer_freq=1,
           norm_topk_prob=False, scoring_func="softmax")

# name -> (model_type, architecture, overrides, weight dtype)
VARIANTS = {
    "llama": ("llama", "LlamaForCausalLM", {}, torch.bfloat16),
    "llama_linear": ("llama", "LlamaForCausalLM",
                     {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, torch.bfloat16),
    "llama_dynamic": ("llama", "LlamaForCausalLM",
                      {"max_position_embeddings": 32,
                       "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, torch.bfloat16),
    "llama3_rope": ("llama", "LlamaForCausalLM",
                    {"rope_theta": 500000.0,
                     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 16}}, torch.bfloat16),
    "llama_yarn": ("llama", "LlamaForCausalLM",
                   {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 16}}, torch.bfloat16),
    "llama_mqa_bias": ("llama", "LlamaForCausalLM",
                       {"num_key_value_heads": 1, "attention_bias": True, "mlp_bias": True},
                       torch.float16),
    # Llama's head size (128): the CUDA backend's one-token decode runs attention inside its
    # streamed projection chain only at that size (src/backend/cuda/stream_attention.cuh).
    "llama_hd128": ("llama", "LlamaForCausalLM",
                    {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
                     "head_dim": 128}, torch.bfloat16),
    "mistral": ("mistral", "MistralForCausalLM",
                {"sliding_window": 8, "head_dim": 16}, torch.float16),
    "qwen2": ("qwen2", "Qwen2ForCausalLM",
              {"tie_word_embeddings": True, "use_sliding_window": False}, torch.float32),
    "qwen3": ("qwen3", "Qwen3ForCausalLM",
              {"head_dim": 32, "tie_word_embeddings": True, "attention_bias": False,
               "use_sliding_window": False}, torch.bfloat16),
    # MLA without a query LoRA, softmax router, greedy top-k; layer 0 dense, layer 1 MoE.
    "deepseek_v2": ("deepseek_v2", "DeepseekV2ForCausalLM",
                    dict(MLA, q_lora_rank=None, topk_method="greedy", n_group=None,
                         topk_group=None, routed_scaling_factor=1.5), torch.bfloat16),
    # MLA with a query LoRA, group-limited greedy routing over 4 groups of 2 experts.
    "deepseek_v2_qlora": ("deepseek_v2", "DeepseekV2ForCausalLM",
                          dict(MLA, q_lora_rank=24, topk_method="group_limited_greedy", n_group=4,
                               topk_group=2, n_shared_experts=2), torch.bfloat16),
    # V3: sigmoid scores, noaux_tc with a (randomized) e_score_correction_bias, normalized top-k,
    # yarn RoPE whose mscale and mscale_all_dim differ (both the cos/sin and the softmax scale).
    "deepseek_v3": ("deepseek_v3", "DeepseekV3ForCausalLM",
                    dict(MLA, q_lora_rank=24, topk_method="noaux_tc", scoring_func="sigmoid",
                         n_group=4, topk_group=2, num_experts_per_tok=3, norm_topk_prob=True,
                         routed_scaling_factor=2.5,
                         rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                       "original_max_position_embeddings": 16, "beta_fast": 32,
                                       "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}),
                    torch.bfloat16),
    "mixtral": ("mixtral", "MixtralForCausalLM",
                {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48,
                 "sliding_window": None}, torch.bfloat16),
}

PROMPT_LENS = (7, 40)
NEW_TOKENS = 24


def classic_config(model_type, arch, overrides):
    cfg = dict(BASE)
    cfg.update(overrides)
    cfg["model_type"] = model_type
    cfg["architectures"] = [arch]
    return cfg


def v5_config(classic):
    """The same model in transformers 5's style: rope parameters in one dict."""
    cfg = dict(classic)
    rope = {"rope_type": "default", "rope_theta": cfg.pop("rope_theta")}
    scaling = cfg.pop("rope_scaling", None)
    if scaling:
        rope.update(scaling)
    cfg["rope_parameters"] = rope
    return cfg


def reference(model, prompt):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        prompt_lp = [None] + [lp[i - 1, prompt[i]].item() for i in range(1, len(prompt))]
        out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=None, pad_token_id=0,
                             min_new_tokens=NEW_TOKENS)
        greedy = out.sequences[0, len(prompt):].tolist()
        greedy_lp, margins = [], []
        for step, lg in enumerate(out.logits):
            l = torch.log_softmax(lg[0].float(), dim=-1)
            greedy_lp.append(l[greedy[step]].item())
            top2 = torch.topk(l, 2).values
            margins.append((top2[0] - top2[1]).item())
        full = prompt + greedy
        full_logits = model(torch.tensor([full])).logits[0].float()
        flp = torch.log_softmax(full_logits, dim=-1)
        full_lp = [None] + [flp[i - 1, full[i]].item() for i in range(1, len(full))]
    return {"prompt": prompt, "prompt_logprobs": prompt_lp, "greedy": greedy,
            "greedy_logprobs": greedy_lp, "greedy_margins": margins,
            "full_logprobs": full_lp}


def random_model(config_dir, name):
    """The fixture's model in float32: transformers' initialisation seeded by the name, norm
    weights and biases random too, so a missing or misapplied norm or bias cannot go unnoticed."""
    config = AutoConfig.from_pretrained(config_dir)
    torch.manual_seed(sum(map(ord, name)))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                # Large enough to change which experts win against sigmoid scores in (0, 1).
                b.copy_(0.3 * torch.randn_like(b))
    return model


def write_reference(folder, name, arch, weight_dtype, vocab_size, load, extra=None):
    """Runs the fixture's prompts through transformers (load(dtype) gives the model in float32 or
    bfloat16) and writes folder/reference.json: the cases, and transformers' own bf16 error
    against its float32 reference on the same sequences, the yardstick for engines that compute
    in bf16 (the CUDA golden tests allow a multiple of it). `extra` adds keys after weight_dtype.
    Returns the smallest greedy top-2 margin."""
    model = load(torch.float32)
    gen = torch.Generator().manual_seed(1234 + len(name))
    cases = []
    for n in PROMPT_LENS:
        prompt = torch.randint(3, vocab_size, (n,), generator=gen).tolist()
        cases.append(reference(model, prompt))
    model16 = load(torch.bfloat16)
    errs = []
    for c in cases:
        full = c["prompt"] + c["greedy"]
        with torch.no_grad():
            lp16 = torch.log_softmax(model16(torch.tensor([full])).logits[0].float(), dim=-1)
        errs += [abs(lp16[i - 1, full[i]].item() - c["full_logprobs"][i]) for i in range(1, len(full))]
    meta = {"name": name, "architecture": arch, "weight_dtype": weight_dtype, **(extra or {}),
            "transformers_bf16_noise": {"max_abs_err": max(errs), "mean_abs_err": sum(errs) / len(errs)},
            "torch": torch.__version__, "transformers": transformers.__version__,
            "cases": cases}
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(meta, f)
    return min(min(c["greedy_margins"]) for c in cases)


def random_state(classic, name, dtype):
    """The fixture's random model (random_model) as the state dict save_pretrained writes in
    `dtype`: the float weights a quantized fixture starts from."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(classic, f)
        random_model(tmp, name).to(dtype).save_pretrained(tmp)
        return load_file(os.path.join(tmp, "model.safetensors"))


def write_quantized_fixture(folder, name, arch, classic, stored, dequant, weight_dtype, extra):
    """A quantized fixture: folder/config.json (with its quantization_config), config_v5.json and
    model.safetensors holding `stored` as the quantized format writes it, and the reference:
    transformers in float32 on `dequant`, the exact dequantized weights (the math the engine
    does). Returns write_reference's smallest greedy margin."""
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(classic, f, indent=1)
    with open(os.path.join(folder, "config_v5.json"), "w") as f:
        json.dump(v5_config(classic), f, indent=1)
    save_file(stored, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with tempfile.TemporaryDirectory() as tmp:
        plain = {k: v for k, v in classic.items() if k != "quantization_config"}
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(plain, f)
        save_file({k: v.contiguous() for k, v in dequant.items()},
                  os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        return write_reference(
            folder, name, arch, weight_dtype, classic["vocab_size"],
            lambda dt: AutoModelForCausalLM.from_pretrained(tmp, dtype=dt).eval(), extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/golden")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    torch.manual_seed(0)
    for name, (model_type, arch, overrides, dtype) in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        folder = os.path.join(args.out, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        classic = classic_config(model_type, arch, overrides)

        def write_configs():
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(classic, f, indent=1)
            with open(os.path.join(folder, "config_v5.json"), "w") as f:
                json.dump(v5_config(classic), f, indent=1)

        write_configs()
        model = random_model(folder, name)
        model = model.to(dtype)
        model.save_pretrained(folder, safe_serialization=True)
        for extra in ("generation_config.json",):
            p = os.path.join(folder, extra)
            if os.path.exists(p):
                os.remove(p)
        write_configs()  # save_pretrained rewrote config.json in its own style
        # The reference runs in float32 on the stored (rounded) weights.
        wdt = str(dtype).split(".")[-1]
        m = write_reference(folder, name, arch, wdt, BASE["vocab_size"],
                            lambda dt: AutoModelForCausalLM.from_pretrained(folder, dtype=dt).eval())
        print(f"{name}: {arch} {wdt}, min greedy margin {m:.4f}")


if __name__ == "__main__":
    main()
