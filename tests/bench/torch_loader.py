"""Baseline for make bench: the usual PyTorch loader over memmapped token windows.

A torch DataLoader with DistributedSampler (num_workers=0) over a uint16 token file, windows of
seq_len+1 tokens returned as int64 tensors, as nanoGPT-style training scripts do. Run with Debian's
/usr/bin/python3 (python3-torch). Prints tokens_per_s=... first_batch_ms=...
"""
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class TokenWindows(Dataset):
    def __init__(self, path, seq_len):
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        self.seq_len = seq_len

    def __len__(self):
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i):
        start = i * self.seq_len
        return torch.from_numpy(self.tokens[start : start + self.seq_len + 1].astype(np.int64))


def main(path, rank, world, seq_len, batch, want_tokens):
    t0 = time.perf_counter()
    windows = TokenWindows(path, seq_len)
    sampler = DistributedSampler(windows, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(windows, batch_size=batch, sampler=sampler, num_workers=0)
    delivered, epoch, first = 0, 0, None
    while delivered < want_tokens:
        sampler.set_epoch(epoch)
        for x in loader:
            if first is None:
                first = time.perf_counter() - t0
                start = time.perf_counter()
            delivered += x.numel()
            if delivered >= want_tokens:
                break
        epoch += 1
    elapsed = time.perf_counter() - start
    print(f"tokens_per_s={delivered / elapsed:.0f} first_batch_ms={first * 1e3:.3f}")


if __name__ == "__main__":
    path, rank, world, seq_len, batch, tokens = sys.argv[1:7]
    main(path, int(rank), int(world), int(seq_len), int(batch), int(float(tokens)))
