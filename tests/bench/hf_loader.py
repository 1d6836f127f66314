"""Baseline for make bench: Hugging Face `datasets` streaming of the corpus JSONL, as a user would.

  build/bench/venv/bin/python tests/bench/hf_loader.py CORPUS.jsonl RANK WORLD SEQ_LEN MICRO_BATCH TOKENS

load_dataset("json", streaming=True), shuffled with HF's default buffer (1000 documents, seed 0),
split_dataset_by_node for this rank (one JSONL file is one shard, so each rank reads the whole file
and keeps every WORLD-th document, which is what HF does with it); each document becomes its UTF-8
bytes plus EOS 256 (the bytes tokenizer of the Wick datasets made from the same JSONL), and the
stream is packed into consecutive seq_len+1 windows handed out as int64 [MICRO_BATCH, seq_len+1]
arrays (torch.from_numpy of one is free). Streams TOKENS tokens (epochs restart with set_epoch),
timed from the first batch on, and prints one line of key=value results in the fields of
tests/bench/lib/data_rank.lua. Runs in the bench venv (PyPI datasets, third_party/bench-python.txt).
"""
import resource
import sys
import time

import numpy as np
from datasets import load_dataset
from datasets.distributed import split_dataset_by_node

EOS = 256
SHUFFLE_BUFFER = 1000  # documents: the default of IterableDataset.shuffle
SEED = 0


def batches(stream, seq_len, micro_batch):
    """Packs documents into micro-batches of consecutive seq_len+1 token windows."""
    need = micro_batch * (seq_len + 1)
    eos = np.array([EOS], dtype=np.int64)
    pieces, held = [], 0
    for example in stream:
        tokens = np.frombuffer(example["text"].encode("utf-8"), dtype=np.uint8)
        pieces += [tokens, eos]
        held += len(tokens) + 1
        if held >= need:
            flat = np.concatenate(pieces, dtype=np.int64)
            full = held // need
            for k in range(full):
                yield flat[k * need : (k + 1) * need].reshape(micro_batch, seq_len + 1)
            pieces = [flat[full * need :]]
            held -= full * need


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(path, rank, world, seq_len, micro_batch, want_tokens):
    t0 = time.perf_counter()
    stream = load_dataset("json", data_files=path, split="train", streaming=True)
    stream = split_dataset_by_node(stream.shuffle(seed=SEED, buffer_size=SHUFFLE_BUFFER), rank=rank, world_size=world)
    delivered, epoch, first = 0, 0, None
    while delivered < want_tokens:
        stream.set_epoch(epoch)
        for x in batches(stream, seq_len, micro_batch):
            if first is None:
                first = time.perf_counter() - t0
                start, cpu_start = time.perf_counter(), cpu_seconds()
                continue
            delivered += x.size
            if delivered >= want_tokens:
                break
        epoch += 1
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"tokens_per_s={delivered / elapsed:.0f} delivered={delivered} seconds={elapsed:.6f} "
          f"first_batch_ms={first * 1e3:.3f} cpu_s={cpu:.6f} cpu_ns_per_token={cpu * 1e9 / delivered:.3f} "
          f"peak_rss={peak_rss} token_bytes={x.itemsize}", flush=True)


if __name__ == "__main__":
    path, rank, world, seq_len, micro_batch, tokens = sys.argv[1:7]
    main(path, int(rank), int(world), int(seq_len), int(micro_batch), int(float(tokens)))
