#!/usr/bin/env python3
"""Adds the router's margins to the Mixtral golden fixtures' references: for every position of
each case (prompt + greedy continuation), the smallest gap, over the MoE layers, between the
routing probabilities of the k-th and the (k+1)-th expert in transformers' float32 run. A gap of
a few 1e-4 is a tie that bf16 rounding of the hidden state flips in any bf16 engine (transformers'
own included), routing the token through another expert and moving its log-probability by whole
units on these tiny models; tests/model/golden_test.cpp leaves such positions out of the GPU's
bounds (and says how many). The float fixture loads as it is; the AWQ one on its weights
dequantized as tests/model/make_quant_fixtures.py does (its unpacking, checked there against
AutoAWQ's own).

Needs torch and transformers (the AWQ fixture: also what make_quant_fixtures.py imports):
    python tests/model/add_router_margins.py --golden tests/data/golden
"""
import argparse
import json
import os
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

FIXTURES = ("mixtral", "awq_mixtral")


def load(folder):
    """The fixture as a float32 transformers model (AWQ weights dequantized)."""
    cfg = json.load(open(os.path.join(folder, "config.json")))
    q = cfg.get("quantization_config")
    if q is None:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_quant_fixtures as mq
    state = load_file(os.path.join(folder, "model.safetensors"))
    plain = {}
    for n, v in state.items():
        if n.endswith(".qweight"):
            p = n[: -len(".qweight")]
            t = {k: state[f"{p}.{k}"].numpy() for k in ("qweight", "qzeros", "scales")}
            plain[p + ".weight"] = torch.from_numpy(mq.unpack_awq(t, q["group_size"]))
        elif not n.endswith((".qzeros", ".scales")):
            plain[n] = v.float()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump({k: v for k, v in cfg.items() if k != "quantization_config"}, f)
        save_file({k: v.contiguous() for k, v in plain.items()},
                  os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        return AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden", default="tests/data/golden")
    args = ap.parse_args()
    for name in FIXTURES:
        folder = os.path.join(args.golden, name)
        model = load(folder)
        k = model.config.num_experts_per_tok
        ref_path = os.path.join(folder, "reference.json")
        with open(ref_path) as f:
            text = f.read()
        ref = json.loads(text)
        smallest = 1.0
        for c in ref["cases"]:
            full = c["prompt"] + c["greedy"]
            with torch.no_grad():
                out = model(torch.tensor([full]), output_router_logits=True)
            gaps = []
            for logits in out.router_logits:  # one [positions, experts] per MoE layer
                p = logits.reshape(len(full), -1).softmax(-1).sort(-1, descending=True).values
                gaps.append(p[:, k - 1] - p[:, k])
            margins = torch.stack(gaps).min(0).values
            c["router_margins"] = [round(float(m), 6) for m in margins]
            smallest = min(smallest, float(margins.min()))
        with open(ref_path, "w") as f:  # in the file's own layout (indented or not)
            json.dump(ref, f, indent=2 if text.startswith("{\n") else None)
            if text.endswith("\n"):
                f.write("\n")
        print(f"{name}: smallest router margin {smallest:.6f}")


if __name__ == "__main__":
    main()
