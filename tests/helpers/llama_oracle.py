"""The Llama oracle of tests/nn/llama_spec.lua: Hugging Face transformers (build/test/hf-venv, made by
third_party/hf-venv.sh) as the reference for wick.nn.llama and wick.nn.from_pretrained.

  llama_oracle.py make DIR STYLE   builds a small random model of STYLE, saves it to DIR/model with
      transformers' save_pretrained (sharded), and writes DIR/reference.safetensors: the batch
      (inputs, targets), the mean cross-entropy of the model on it (loss) and the gradient of that
      loss for every parameter (grad.NAME), computed in float64 from the saved weights.
  llama_oracle.py logits DIR BATCH OUT   loads the model directory DIR (as Wick saved it) with
      transformers and writes its float64 logits on BATCH's inputs to OUT (as f32).
  llama_oracle.py generate DIR BATCH N OUT   transformers' greedy generate of N new tokens after BATCH's
      inputs (float64, no stop token) -> OUT (ids, int32); DIR may hold any causal LM transformers
      loads (tests/nn/generate_spec.lua gives it a GPT2LMHeadModel).

Styles: llama3 (Llama 3: grouped-query attention, llama3 rope scaling, an untied head, f32 weights in
shards) and qwen2 (Qwen 2: q/k/v biases, a single KV head, tied embeddings, bf16 weights in shards).
"""
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB, BATCH, TIME = 64, 2, 12
SHARD = "20KB"  # small enough that every model has several shards

STYLES = {
    "llama3": (LlamaForCausalLM, LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=128,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2), torch.float32),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=64,
        tie_word_embeddings=True, use_sliding_window=False, bos_token_id=1, eos_token_id=2), torch.bfloat16),
}


def randomize(model, generator):
    """Weights far from the 0.02 init, so that every path carries a gradient well above f32 noise."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_((0.3 if p.dim() == 2 else 0.1) * torch.randn(p.shape, generator=generator))


def loss_and_grads(model, inputs, targets):
    model.zero_grad()
    logits = model(input_ids=inputs.long(), use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.long().reshape(-1))
    loss.backward()
    return loss, {name: p.grad for name, p in model.named_parameters()}


def make(directory, style):
    cls, config, dtype = STYLES[style]
    generator = torch.Generator().manual_seed(1234)
    model = cls(config)
    randomize(model, generator)
    model.to(dtype).save_pretrained(directory + "/model", max_shard_size=SHARD, safe_serialization=True)
    # The reference runs in float64 on exactly the saved values (rounded to bf16 when saved so).
    reference = cls.from_pretrained(directory + "/model", torch_dtype=torch.float64, attn_implementation="eager")
    inputs = torch.randint(0, VOCAB, (BATCH, TIME), generator=generator, dtype=torch.int32)
    targets = torch.randint(0, VOCAB, (BATCH, TIME), generator=generator, dtype=torch.int32)
    loss, grads = loss_and_grads(reference, inputs, targets)
    out = {"inputs": inputs, "targets": targets, "loss": loss.detach().reshape(1).float()}
    for name, g in grads.items():
        out["grad." + name] = g.float().contiguous()
    save_file(out, directory + "/reference.safetensors")


def logits(directory, batch, out):
    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float64, attn_implementation="eager")
    inputs = load_file(batch)["inputs"]
    with torch.no_grad():
        values = model(input_ids=inputs.long(), use_cache=False).logits
    save_file({"logits": values.float().contiguous()}, out)


def generate(directory, batch, n, out):
    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float64, attn_implementation="eager")
    inputs = load_file(batch)["inputs"].long()
    with torch.no_grad():  # min_new_tokens: the eos id of the config must not end a row early
        ids = model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=0)
    save_file({"ids": ids.to(torch.int32).contiguous()}, out)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2], sys.argv[3])
    elif command == "logits":
        logits(sys.argv[2], sys.argv[3], sys.argv[4])
    elif command == "generate":
        generate(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        sys.exit("usage: llama_oracle.py make DIR STYLE | logits DIR BATCH OUT | generate DIR BATCH N OUT")
