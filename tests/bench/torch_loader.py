"""Baseline for make bench: the usual PyTorch loader over memmapped token windows.

  /usr/bin/python3 tests/bench/torch_loader.py TOKENS.u16 RANK WORLD SEQ_LEN MICRO_BATCH TOKENS

A torch DataLoader with DistributedSampler (shuffle, num_workers=0) over a uint16 token file, windows
of seq_len+1 tokens returned as int64 tensors, as nanoGPT-style training scripts do. Run with
Debian's /usr/bin/python3 (python3-torch). Streams TOKENS tokens (whole epochs are restarted with
set_epoch), timed from the first batch on, and prints one line of key=value results in the fields
of tests/bench/lib/data_rank.lua.
"""
import resource
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


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
                start, cpu_start = time.perf_counter(), cpu_seconds()
                continue
            delivered += x.numel()
            if delivered >= want_tokens:
                break
        epoch += 1
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"tokens_per_s={delivered / elapsed:.0f} delivered={delivered} seconds={elapsed:.6f} "
          f"first_batch_ms={first * 1e3:.3f} cpu_s={cpu:.6f} cpu_ns_per_token={cpu * 1e9 / delivered:.3f} "
          f"peak_rss={peak_rss} token_bytes={x.element_size()}", flush=True)


if __name__ == "__main__":
    path, rank, world, seq_len, batch, tokens = sys.argv[1:7]
    main(path, int(rank), int(world), int(seq_len), int(batch), int(float(tokens)))
