"""transformers baselines for tests/bench/llama.lua, run in build/test/hf-venv (third_party/hf-venv.sh).

  llama_hf.py make DIR CONFIG_JSON        a random LlamaForCausalLM of that config, saved by
                                          save_pretrained into DIR, f32, in shards of SHARD
  llama_hf.py train DIR BATCH T STEPS THREADS
      trains it with AdamW (lr 1e-4, weight decay 0.1, clip 1.0) on a fixed random batch; prints
      "tokens_per_s X", the best step of STEPS after one warm-up step
  llama_hf.py generate DIR PROMPT NEW THREADS
      greedy generate (KV cache) of NEW tokens after a PROMPT-token prompt; prints "tokens_per_s X",
      new tokens per second of the best of REPEATS runs after a warm-up
"""
import json
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHARD = "8MB"  # several shards, as a real checkpoint has
REPEATS = 3


def make(directory, config_json):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**json.loads(config_json)))
    model.save_pretrained(directory, max_shard_size=SHARD, safe_serialization=True)


def batch(vocab, b, t):
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (b, t), generator=generator), torch.randint(0, vocab, (b, t), generator=generator)


def best_seconds(fn, repeats):
    """The best time of `repeats` calls of fn, after one untimed warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def load(directory, threads):
    torch.set_num_threads(threads)
    return LlamaForCausalLM.from_pretrained(directory, torch_dtype=torch.float32)


def train(directory, b, t, steps, threads):
    model = load(directory, threads)
    model.train()
    inputs, targets = batch(model.config.vocab_size, b, t)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)

    def step():
        opt.zero_grad(set_to_none=False)
        logits = model(input_ids=inputs, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    print(f"tokens_per_s {b * t / best_seconds(step, steps):.3f}")


def generate(directory, prompt, new, threads):
    model = load(directory, threads)
    model.eval()
    inputs, _ = batch(model.config.vocab_size, 1, prompt)

    def once():
        with torch.no_grad():
            out = model.generate(inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True,
                                 pad_token_id=0)
        assert out.shape[1] == prompt + new

    print(f"tokens_per_s {new / best_seconds(once, REPEATS):.3f}")


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2], sys.argv[3])
    elif command == "train":
        train(sys.argv[2], *map(int, sys.argv[3:7]))
    elif command == "generate":
        generate(sys.argv[2], *map(int, sys.argv[3:6]))
    else:
        sys.exit(f"unknown command {command}")
