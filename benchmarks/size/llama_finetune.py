"""A Llama fine-tune as people launch it: transformers' LlamaForCausalLM from a config, AdamW, batch
4 x 512 tokens. --size 1b: Llama-3.2-1B's shape; --size 8b: Llama-3-8B's."""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True, rope_theta=500000.0),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0),
}

parser = argparse.ArgumentParser()
parser.add_argument("--size", choices=sorted(SHAPES), default="1b")
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--seq-len", type=int, default=512)
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
config = LlamaConfig(max_position_embeddings=8192, **SHAPES[args.size])
model = LlamaForCausalLM(config).to(device)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)

for step in range(args.steps):
    input_ids = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len))
    attention_mask = torch.ones_like(input_ids)
    batch = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
             "labels": input_ids.to(device)}
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step}: loss {loss.item():.4f}")
