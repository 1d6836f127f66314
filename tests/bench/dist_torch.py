#!/usr/bin/python3
"""PyTorch Gloo baseline for tests/bench/dist.lua: all-reduces f32 tensors of each size on 2 CPU
processes (torch.distributed, backend gloo, TCP rendezvous on loopback) exactly as
tests/bench/lib/dist_rank.lua does (a barrier, then one timed all-reduce; the best of the
repeats), and prints on rank 0 one line per size:
    size <bytes> best <seconds>
Usage: /usr/bin/python3 tests/bench/dist_torch.py <port> <repeat budget bytes> <size bytes>...
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
F32_BYTES, MIN_REPEATS, MAX_REPEATS, WARMUP = 4, 5, 200, 2


def rank_main(rank, port, budget, sizes):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    for size in sizes:
        t = torch.zeros(size // F32_BYTES, dtype=torch.float32)
        repeats = max(MIN_REPEATS, min(MAX_REPEATS, budget // size))
        for _ in range(WARMUP):
            dist.all_reduce(t)
        best = float("inf")
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            best = min(best, time.perf_counter() - start)
        if rank == 0:
            print(f"size {size} best {best:.9f}", flush=True)
    dist.destroy_process_group()


def main():
    port, budget = int(sys.argv[1]), int(sys.argv[2])
    sizes = [int(s) for s in sys.argv[3:]]
    mp.spawn(rank_main, args=(port, budget, sizes), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
