#!/usr/bin/env python3
"""Where pagellm's CUDA decode steps leave its CPU reference on tiny random Mixtral checkpoints,
and why: bf16 rounding that flips a near-tied router choice, or an error of the batch-1 MoE path.

For each checkpoint (made here with transformers, like tests/model/make_fixtures.py's "mixtral")
and each random prompt it runs `pagellm generate` greedily on the CPU (f32) and on the GPU (bf16),
and compares every prompt position and every decode step's log-probability. Each decode step is
then explained by the router: at the position that produced it, transformers' float32 router
logits give each layer's margin between the k-th and the (k+1)-th expert (the tie a rounding can
flip), and transformers run in bf16 on the same tokens says whether its own routing flipped there.
A bf16 flip explains a step; a large error where every margin is wide and bf16 routes as f32 does
would be an error in the decode path.

    python scripts/moe-decode-margins.py --pagellm build/cuda/tools/pagellm --out /tmp/moe-margins

Needs torch and transformers (the GPU machine has both; the checkpoints are small, any device).
Prints a table of the decode steps over --threshold and a summary line of the rest.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

# tests/model/make_fixtures.py's BASE and its "mixtral" overrides.
CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, initializer_range=0.25, num_local_experts=4,
              num_experts_per_tok=2, sliding_window=None, model_type="mixtral",
              architectures=["MixtralForCausalLM"])


def make_checkpoint(folder, seed):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    config = AutoConfig.from_pretrained(folder)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(folder, extra)):
            os.remove(os.path.join(folder, extra))


def generate(pagellm, folder, prompt, device, n_new):
    cmd = [pagellm, "generate", "--model", folder, "--device", device, "--prompt-ids",
           ",".join(map(str, prompt)), "--max-tokens", str(n_new), "--temperature", "0",
           "--ignore-eos", "--prompt-logprobs", "--logprobs", "1", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def router_view(model, ids, pos, k):
    """Per layer at position pos: the top-k experts and the margin between the k-th and the
    (k+1)-th router logit (and between their softmax probabilities); and the log-probabilities
    of the next token there."""
    with torch.no_grad():
        out = model(torch.tensor([ids], device=model.device), output_router_logits=True)
    logprobs = torch.log_softmax(out.logits[0, pos].float(), dim=-1)
    layers = []
    for logits in out.router_logits:  # [seq, E] per layer
        row = logits.reshape(len(ids), -1)[pos].float()
        vals, idx = torch.sort(row, descending=True)
        prob = torch.softmax(row, dim=-1)[idx]
        layers.append({"experts": sorted(idx[:k].tolist()),
                       "logit_margin": (vals[k - 1] - vals[k]).item(),
                       "prob_margin": (prob[k - 1] - prob[k]).item()})
    return layers, logprobs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--against", default="cuda", help="the device compared with the CPU")
    ap.add_argument("--threshold", type=float, default=0.05, help="|dlogprob| worth explaining")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    k = CONFIG["num_experts_per_tok"]
    prefill_errs, decode_errs, rows = [], [], []
    for seed in range(args.seeds):
        folder = os.path.join(args.out, f"mixtral-{seed}")
        make_checkpoint(folder, seed)
        f32 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(dev).eval()
        b16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(dev).eval()
        gen = torch.Generator().manual_seed(1000 + seed)
        for p in range(args.prompts):
            n = int(torch.randint(5, 41, (1,), generator=gen))
            prompt = torch.randint(3, CONFIG["vocab_size"], (n,), generator=gen).tolist()
            cpu = generate(args.pagellm, folder, prompt, "cpu", args.new_tokens)
            gpu = generate(args.pagellm, folder, prompt, args.against, args.new_tokens)
            for a, b in zip(cpu["prompt_logprobs"][1:], gpu["prompt_logprobs"][1:]):
                prefill_errs.append(abs(a - b))
            for s, (tc, tg) in enumerate(zip(cpu["token_ids"], gpu["token_ids"])):
                lc, lg = cpu["logprobs"][s], gpu["logprobs"][s]
                # The step's logits came from the last token fed: position n - 1 + s.
                ids = prompt + cpu["token_ids"][:s]
                err = abs(lc - lg) if tc == tg else float("inf")
                decode_errs.append(err)
                if err > args.threshold:
                    ref, lp32 = router_view(f32, ids, len(ids) - 1, k)
                    half, lp16 = router_view(b16, ids, len(ids) - 1, k)
                    rows.append({"seed": seed, "prompt": p, "step": s, "cpu": (tc, lc),
                                 "gpu": (tg, lg), "err": err, "f32": ref, "bf16": half,
                                 "hf_bf16_err": abs(lp16[tc].item() - lp32[tc].item()),
                                 "min_margin": min(l["logit_margin"] for l in ref),
                                 "flipped": [r["experts"] != h["experts"]
                                             for r, h in zip(ref, half)]})
                if tc != tg:
                    break  # past a different token the continuations are not comparable
    over = sum(e > args.threshold for e in prefill_errs)
    print(f"prefill positions: {len(prefill_errs)}, {over} over {args.threshold} "
          f"({100 * over / max(len(prefill_errs), 1):.1f}%), max |dlogprob| {max(prefill_errs):.4f}")
    finite = [e for e in decode_errs if e != float("inf")]
    print(f"decode steps: {len(decode_errs)}, {len(rows)} over {args.threshold} "
          f"({100 * len(rows) / max(len(decode_errs), 1):.1f}%; a different token counts as over); "
          f"max |dlogprob| of the rest {max([e for e in finite if e <= args.threshold] or [0]):.4f}")
    print(f"{'seed':>4} {'prompt':>6} {'step':>4} {'cpu tok/lp':>14} {'gpu tok/lp':>14} "
          f"{'|dlp|':>7} {'hf bf16':>7}  per layer: f32 top-{k} (logit margin, prob margin) | bf16 top-{k}")
    for r in rows:
        layers = "; ".join(
            f"L{i} {f['experts']} ({f['logit_margin']:.4f}, {f['prob_margin']:.4f}) | "
            f"{h['experts']}{' FLIP' if fl else ''}"
            for i, (f, h, fl) in enumerate(zip(r["f32"], r["bf16"], r["flipped"])))
        err = "token" if r["err"] == float("inf") else f"{r['err']:.4f}"
        print(f"{r['seed']:>4} {r['prompt']:>6} {r['step']:>4} {r['cpu'][0]:>5}/{r['cpu'][1]:8.4f} "
              f"{r['gpu'][0]:>5}/{r['gpu'][1]:8.4f} {err:>7} {r['hf_bf16_err']:7.4f}  {layers}")
    with open(os.path.join(args.out, "moe-decode-margins.json"), "w") as f:
        json.dump({"prefill_errs": prefill_errs, "decode_errs": [min(e, 1e9) for e in decode_errs],
                   "explained": rows}, f, default=str)


if __name__ == "__main__":
    main()
