#!/usr/bin/env python3
"""Where pagellm's CUDA decode steps leave its CPU reference on tiny random Mixtral checkpoints,
and why: bf16 rounding that flips a near-tied router choice, or an error of the batch-1 MoE path.

For each checkpoint (made here with transformers, like tests/model/make_fixtures.py's "mixtral")
and each random prompt, `pagellm generate` runs greedily on the CPU (f32) and, with --against
cuda, on the GPU (bf16); every prompt position and every generated token's log-probability is
compared. Token 0 comes from the prefill's last position, tokens 1, 2, ... from one-token decode
steps. Each position is then explained by the router: transformers' float32 router logits give
each layer's margin between the k-th and the (k+1)-th expert (the tie a rounding can flip), and
transformers run in bf16 on the same tokens says whether its own routing flipped there and how far
its log-probability moved. A flip explains a large error; a large error where no layer flips and
every margin is wide would be an error of the decode path.

    python scripts/moe-decode-margins.py --pagellm build/cuda/tools/pagellm --out /tmp/moe-margins
    python scripts/moe-decode-margins.py --pagellm build/cpu/tools/pagellm --against none ...
        # transformers' bf16 against its f32 alone (no GPU needed)

Needs torch and transformers. Prints the positions over --threshold or with a flip, then a summary
of the errors split by whether transformers' bf16 routing flipped.
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


def forward(model, ids, k):
    """Every position's next-token log-probabilities and, per layer, its top-k experts and the
    margin between the k-th and the (k+1)-th router logit."""
    with torch.no_grad():
        out = model(torch.tensor([ids], device=model.device), output_router_logits=True)
    logprobs = torch.log_softmax(out.logits[0].float(), dim=-1)
    layers = []
    for logits in out.router_logits:  # [seq, E] per layer
        vals, idx = torch.sort(logits.reshape(len(ids), -1).float(), dim=-1, descending=True)
        layers.append({"experts": torch.sort(idx[:, :k], dim=-1).values.tolist(),
                       "margin": (vals[:, k - 1] - vals[:, k]).tolist()})
    return logprobs, layers


def summary(name, errs):
    if not errs:
        return f"{name}: none"
    errs = sorted(errs)
    return (f"{name}: {len(errs)}, mean {sum(errs) / len(errs):.4f}, median "
            f"{errs[len(errs) // 2]:.4f}, max {errs[-1]:.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagellm", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--against", default="cuda", help="the device compared with the CPU; none")
    ap.add_argument("--threshold", type=float, default=0.05, help="|dlogprob| worth a row")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    k = CONFIG["num_experts_per_tok"]
    by_flip = {(path, flip): {"hf": [], "gpu": []} for path in ("prefill", "decode")
               for flip in (False, True)}
    rows = []
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
            gpu = None
            if args.against != "none":
                gpu = generate(args.pagellm, folder, prompt, args.against, args.new_tokens)
            seq = prompt + cpu["token_ids"]
            lp32, r32 = forward(f32, seq, k)
            lp16, r16 = forward(b16, seq, k)
            # Position i predicts seq[i + 1]: prompt positions (prefill on both sides) and the
            # generated tokens (token 0 from the prefill's last position, then decode steps).
            for i in range(len(seq) - 1):
                gen_index = i - (n - 1)  # the generated token this position predicts, or < 0
                path = "decode" if gen_index >= 1 else "prefill"
                flips = [a["experts"][i] != b["experts"][i] for a, b in zip(r32, r16)]
                flip = any(flips)
                hf = abs(lp16[i, seq[i + 1]].item() - lp32[i, seq[i + 1]].item())
                err = None
                if gpu is not None:
                    if gen_index < 0:
                        err = abs(cpu["prompt_logprobs"][i + 1] - gpu["prompt_logprobs"][i + 1])
                    elif gpu["token_ids"][:gen_index + 1] == cpu["token_ids"][:gen_index + 1]:
                        err = abs(cpu["logprobs"][gen_index] - gpu["logprobs"][gen_index])
                    else:
                        err = float("inf")  # the GPU chose another token here or before
                by_flip[(path, flip)]["hf"].append(hf)
                if err is not None and err != float("inf"):
                    by_flip[(path, flip)]["gpu"].append(err)
                if flip or hf > args.threshold or (err is not None and err > args.threshold):
                    rows.append({"seed": seed, "prompt": p, "pos": i, "token": gen_index,
                                 "path": path, "gpu_err": err, "hf_err": hf,
                                 "layers": [(r32[l]["experts"][i], r32[l]["margin"][i],
                                             r16[l]["experts"][i]) for l in range(len(r32))]})
                if err == float("inf"):
                    break  # past a different token the continuations are not comparable
    print(f"{'seed':>4} {'prompt':>6} {'pos':>4} {'token':>5} {'path':>7} {'gpu |dlp|':>9} "
          f"{'hf bf16':>7}  per layer: f32 top-{k} (logit margin) -> bf16 top-{k}")
    for r in rows:
        layers = "; ".join(f"L{l} {a} ({m:.4f}) -> {b}{' FLIP' if a != b else ''}"
                           for l, (a, m, b) in enumerate(r["layers"]))
        g = "-" if r["gpu_err"] is None else ("token" if r["gpu_err"] == float("inf")
                                              else f"{r['gpu_err']:.4f}")
        print(f"{r['seed']:>4} {r['prompt']:>6} {r['pos']:>4} {r['token']:>5} {r['path']:>7} "
              f"{g:>9} {r['hf_err']:7.4f}  {layers}")
    for (path, flip), e in by_flip.items():
        tag = f"{path}, transformers' bf16 routing {'flipped' if flip else 'as f32'}"
        print(summary(f"{tag}: transformers bf16 |dlogprob|", e["hf"]))
        if args.against != "none":
            print(summary(f"{tag}: pagellm {args.against} against cpu |dlogprob|", e["gpu"]))
    with open(os.path.join(args.out, "moe-decode-margins.json"), "w") as f:
        json.dump({"rows": rows, "by_flip": {f"{a}/{b}": v for (a, b), v in by_flip.items()}},
                  f, default=str)


if __name__ == "__main__":
    main()
