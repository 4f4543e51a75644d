#!/usr/bin/env python3
"""Builds the DeepSeek-V3 multi-token-prediction fixture: the tiny golden deepseek_v3 model with
one MTP layer appended (model.layers.2.*: a random MoE decoder layer, enorm, hnorm, eh_proj,
shared_head.norm, and copies of the embedding table and LM head as the published checkpoints
carry them), num_nextn_predict_layers = 1, and what the MTP module computes for a prompt:

    x_j   = eh_proj [enorm(embed(token j + 1)) | hnorm(target's final hidden row j)]
    out_j = the MTP decoder layer over x_0 .. x_j (causal), position j
    logits_j = lm_head(shared_head.norm(out_j))            predicts token j + 2

for every j of the prompt, and the greedy chain of guesses from the prompt's end: guess 1 is the
argmax at j = n - 2; guess i + 1 is the argmax at position n - 2 + i, whose input pairs guess i
with shared_head.norm(out) of the position before (the module's own hidden row, normalized as the
target's is). transformers has no MTP module: the reference is its DeepSeek-V3 decoder layer and
plain torch for the rest, in float32 on the stored (bf16) weights.

    python tests/model/make_mtp_fixture.py --out tests/data/mtp/deepseek_v3
"""
import argparse
import json
import os
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "data", "golden", "deepseek_v3")
PROMPT_LEN = 12
CHAIN = 3


def rms_norm(x, w, eps):
    x = x.float()
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/mtp/deepseek_v3")
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(GOLDEN, "config.json")))
    L, D = cfg["num_hidden_layers"], cfg["hidden_size"]
    eps = cfg["rms_norm_eps"]
    state = load_file(os.path.join(GOLDEN, "model.safetensors"))

    # The MTP layer: layer L of the same model made with L + 1 layers, initialised as the golden
    # fixtures are (tests/model/make_fixtures.py: norms and router biases random too).
    torch.manual_seed(4242)
    deeper = AutoConfig.for_model(**{**cfg, "num_hidden_layers": L + 1})
    big = AutoModelForCausalLM.from_config(deeper, dtype=torch.float32)
    with torch.no_grad():
        for n, p in big.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        for n, b in big.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn_like(b))
    prefix = f"model.layers.{L}."
    with tempfile.TemporaryDirectory() as tmp:  # the tensors as a checkpoint names them
        big.save_pretrained(tmp)
        mtp = {k: v for k, v in load_file(os.path.join(tmp, "model.safetensors")).items()
               if k.startswith(prefix)}
    mtp[prefix + "enorm.weight"] = 1.0 + 0.3 * torch.randn(D)
    mtp[prefix + "hnorm.weight"] = 1.0 + 0.3 * torch.randn(D)
    mtp[prefix + "eh_proj.weight"] = 0.25 * torch.randn(D, 2 * D)
    mtp[prefix + "shared_head.norm.weight"] = 1.0 + 0.3 * torch.randn(D)
    mtp[prefix + "shared_head.head.weight"] = state["lm_head.weight"].float()
    mtp[prefix + "embed_tokens.weight"] = state["model.embed_tokens.weight"].float()
    mtp = {k: v.to(torch.bfloat16).contiguous() for k, v in mtp.items()}

    os.makedirs(args.out, exist_ok=True)
    cfg["num_nextn_predict_layers"] = 1
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file({**state, **mtp}, os.path.join(args.out, "model.safetensors"),
              metadata={"format": "pt"})

    # The reference, in float32 on the stored weights.
    model = AutoModelForCausalLM.from_pretrained(GOLDEN, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    config = model.config
    layer = big.model.layers[L].eval()  # its weights rounded as stored
    with torch.no_grad():
        for p in list(layer.parameters()) + list(layer.buffers()):
            p.copy_(p.to(torch.bfloat16).float())
    w = {k[len(prefix):]: v.float() for k, v in mtp.items()}
    embed = model.model.embed_tokens.weight
    head = model.lm_head.weight

    def module(tokens, hidden):
        """The module over a sequence: row j pairs tokens[j] (token j + 1) with hidden[j]."""
        n = len(tokens)
        x = torch.cat([rms_norm(embed[torch.tensor(tokens)], w["enorm.weight"], eps),
                       rms_norm(hidden, w["hnorm.weight"], eps)], dim=-1) @ w["eh_proj.weight"].T
        pos = torch.arange(n)[None]
        mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
        out = layer(x[None], attention_mask=mask, position_ids=pos,
                    position_embeddings=model.model.rotary_emb(x[None], pos))[0]
        normed = rms_norm(out, w["shared_head.norm.weight"], eps)
        return torch.log_softmax(normed @ head.T, dim=-1), normed

    gen = torch.Generator().manual_seed(77)
    prompt = torch.randint(3, cfg["vocab_size"], (PROMPT_LEN,), generator=gen).tolist()
    with torch.no_grad():
        target = model.model(torch.tensor([prompt])).last_hidden_state[0]  # after model.norm
        lp, normed = module(prompt[1:], target[:-1])
        tokens, hidden = prompt[1:], target[:-1]
        chain, chain_lp, margins = [], [], []
        last = lp[-1]
        for i in range(CHAIN):
            g = int(torch.argmax(last))
            top2 = torch.topk(last, 2).values
            chain.append(g)
            chain_lp.append(last.tolist())
            margins.append((top2[0] - top2[1]).item())
            if i + 1 == CHAIN:
                break
            tokens = tokens + [g]
            hidden = torch.cat([hidden, normed[-1:]])
            lp_i, normed = module(tokens, hidden)
            last = lp_i[-1]
    ref = {"prompt": prompt, "mtp_logprobs": lp.tolist(), "chain": chain,
           "chain_logprobs": chain_lp, "chain_margins": margins,
           "torch": torch.__version__, "transformers": transformers.__version__}
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f)
    print(f"chain {chain}, margins {[round(m, 3) for m in margins]}")


if __name__ == "__main__":
    main()
