#!/usr/bin/env python3
"""Adds llama.cpp's own log-probabilities to the GGUF golden fixtures (those holding model.gguf,
made by make_gguf_kquant_fixtures.py): a second reference beside transformers for the files'
meaning. Each case's teacher-forced prompt + continuation runs through llama-cpp-python, and
`llama_cpp_full_logprobs` (per case) and `llama_cpp` (version, its distance from transformers)
are written into reference.json. llama.cpp multiplies with int8-quantized activations, so it
stands ~1e-2 from transformers; tests/model/golden_test.cpp holds pagellm to that distance.

Needs llama-cpp-python (0.3.36, built from its source distribution) and numpy:
    python tests/model/add_llama_cpp_reference.py --golden tests/data/golden
"""
import argparse
import json
import os

import llama_cpp
import numpy as np


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--golden", default="tests/data/golden")
    args = ap.parse_args()
    for name in sorted(os.listdir(args.golden)):
        folder = os.path.join(args.golden, name)
        gguf_path = os.path.join(folder, "model.gguf")
        if not os.path.exists(gguf_path):
            continue
        ref_path = os.path.join(folder, "reference.json")
        with open(ref_path) as f:
            ref = json.load(f)
        llm = llama_cpp.Llama(model_path=gguf_path, n_ctx=128, logits_all=True, n_threads=2,
                              verbose=False)
        errs = []
        for c in ref["cases"]:
            full = c["prompt"] + c["greedy"]
            llm.reset()
            llm.eval(full)
            lp = log_softmax(np.array(llm.scores[: len(full)], dtype=np.float64))
            mine = [None] + [float(lp[i - 1, full[i]]) for i in range(1, len(full))]
            c["llama_cpp_full_logprobs"] = mine
            errs += [abs(mine[i] - c["full_logprobs"][i]) for i in range(1, len(full))]
        ref["llama_cpp"] = {"version": llama_cpp.__version__,
                            "max_abs_err_vs_transformers": max(errs),
                            "mean_abs_err_vs_transformers": sum(errs) / len(errs)}
        with open(ref_path, "w") as f:
            json.dump(ref, f)
        print(f"{name}: llama.cpp against transformers: max {max(errs):.4f}, "
              f"mean {sum(errs) / len(errs):.5f}")


if __name__ == "__main__":
    main()
