#!/usr/bin/env python3
"""Writes tests/data/safetensors/reference.safetensors with the reference safetensors writer, so the
C++ reader is checked against files that the format's own library produced (tests/unit/io)."""
import pathlib

import numpy as np
from safetensors.numpy import save_file

out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "safetensors"
out.mkdir(parents=True, exist_ok=True)
tensors = {
    "a.f32": (np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1.0),
    "b.f16": np.array([[1.0, -2.0], [0.5, 65504.0]], dtype=np.float16),
    "c.i32": np.array([1, -2, 3], dtype=np.int32),
    "d.i64": np.array([[2**40], [-7]], dtype=np.int64),
    "e.empty": np.zeros((0, 4), dtype=np.float32),
}
save_file(tensors, str(out / "reference.safetensors"), metadata={"format": "pt"})
print("wrote", out / "reference.safetensors")
