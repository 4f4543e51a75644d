#!/usr/bin/env python3
"""Random blocks of GGUF's 5-bit and k-quant types and their dequantization by the `gguf` package
(llama.cpp's own Python reader), for tests/unit/core/kquants_test.cpp. Every byte is random
except the f16 (Q8_K: f32) super-scales, set to finite values so the reference is finite too.

    python tests/unit/core/make_kquant_reference.py --out tests/data/kquants

writes <type>.blocks (the raw blocks) and <type>.f32 (the values, little-endian f32) per type.
Needs numpy and gguf (0.19.0). The outputs are committed.
"""
import argparse
import os

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, quants

# type -> byte offsets of its f16 scales within a block
F16_FIELDS = {T.Q5_0: [0], T.Q5_1: [0, 2], T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2],
              T.Q5_K: [0, 2], T.Q6_K: [208]}
BLOCKS = 6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/kquants")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(2026)
    for t in [T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K]:
        elems, size = GGML_QUANT_SIZES[t]
        raw = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
        if t == T.Q8_K:
            d = rng.uniform(-0.05, 0.05, BLOCKS).astype(np.float32)
            raw[:, 0:4] = d.view(np.uint8).reshape(BLOCKS, 4)
            q = raw[:, 4:4 + 256].view(np.int8).astype(np.float32)
            values = (d[:, None] * q).reshape(-1)  # gguf does not dequantize Q8_K: d * q
        else:
            for off in F16_FIELDS[t]:
                h = rng.uniform(-0.1, 0.1, BLOCKS).astype(np.float16)
                raw[:, off:off + 2] = h.view(np.uint8).reshape(BLOCKS, 2)
            values = quants.dequantize(raw.reshape(-1), t).astype(np.float32).reshape(-1)
        assert values.size == BLOCKS * elems and np.isfinite(values).all()
        name = t.name.lower().replace("_k", "_K")
        raw.tofile(os.path.join(args.out, f"{name}.blocks"))
        values.astype("<f4").tofile(os.path.join(args.out, f"{name}.f32"))
        print(f"{name}: {BLOCKS} blocks")


if __name__ == "__main__":
    main()
