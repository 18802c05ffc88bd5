#!/usr/bin/python3
"""An app's export_model output, run by Python PyTorch (Debian's python3-torch) without dtrain.

torchscript_check.py MODEL.pt VERIFY_DIR
Loads the TorchScript file with torch.jit.load, reads preprocessing.json from it, runs the batch
export_model traced (VERIFY_DIR/input.f32) and compares with the C++ model's output
(VERIFY_DIR/output.f32); a smaller batch runs too (the batch size is not frozen).
"""
import json
import sys

import numpy as np
import torch


def main():
    model_path, verify = sys.argv[1], sys.argv[2]
    extra = {"preprocessing.json": ""}
    model = torch.jit.load(model_path, _extra_files=extra)
    pre = json.loads(extra["preprocessing.json"])
    with open(f"{verify}/shapes.txt") as f:
        in_shape, out_shape = [[int(v) for v in line.split()] for line in f if line.strip()]
    x = torch.from_numpy(np.fromfile(f"{verify}/input.f32", dtype=np.float32).reshape(in_shape))
    want = torch.from_numpy(np.fromfile(f"{verify}/output.f32", dtype=np.float32).reshape(out_shape))
    with torch.no_grad():
        got = model(x)
        small = model(x[:3])
    if list(got.shape) != out_shape:
        sys.exit(f"FAIL: output shape {list(got.shape)}, export_model's {out_shape}")
    diff = (got - want).abs().max().item()
    if diff > 1e-4:
        sys.exit(f"FAIL: Python's output differs from dtrain's by {diff}")
    axis = 1 if pre.get("app") == "ocr" else 0  # the OCR's logits are [T, N, classes]
    if small.shape[axis] != 3 or (small - want.narrow(axis, 0, 3)).abs().max().item() > 1e-4:
        sys.exit("FAIL: a batch of 3 does not give the first 3 outputs")
    print(f"python torch {torch.__version__}: {list(x.shape)} -> {list(got.shape)}, max |diff| {diff:.2e}; "
          f"preprocessing: {pre}")


if __name__ == "__main__":
    main()
