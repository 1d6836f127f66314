#!/usr/bin/python3
"""PyTorch CPU baseline for tests/bench/gpt.lua: trains the same GPT-2 (the model of
tests/fixtures/make_gpt_reference.py) on the same batch shape with AdamW, and prints one line:
    tokens_per_s <float>
Usage: /usr/bin/python3 tests/bench/gpt_torch.py '<json config with vocab seq_len layers heads dim batch steps threads>'
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from make_gpt_reference import forward, make_params  # noqa: E402

WARMUP_STEPS = 1


def main():
    cfg = json.loads(sys.argv[1])
    torch.set_num_threads(cfg["threads"])
    gen = torch.Generator().manual_seed(0)
    params = make_params(gen, cfg, dtype=torch.float32, std=0.02)
    B, T = cfg["batch"], cfg["seq_len"]
    idx = torch.randint(0, cfg["vocab"], (B, T), generator=gen, dtype=torch.int32)
    targets = torch.randint(0, cfg["vocab"], (B, T), generator=gen, dtype=torch.int32)
    mask = torch.ones(B, T, dtype=torch.uint8)
    opt = torch.optim.AdamW(params.values(), lr=1e-4, weight_decay=0.1)

    def step():
        opt.zero_grad(set_to_none=False)
        forward(params, idx, targets, mask, B * T, cfg).backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()

    for _ in range(WARMUP_STEPS):
        step()
    best = float("inf")
    for _ in range(cfg["steps"]):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    print(f"tokens_per_s {B * T / best:.3f}")


if __name__ == "__main__":
    main()
