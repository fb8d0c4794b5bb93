"""Hand-written DDP in the style of a small character-level GPT trainer (module level, torchrun)."""
import os

import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

batch_size, block_size, max_iters, eval_interval = 8, 16, 200, 50
ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend="gloo")
    ddp_rank = int(os.environ["RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    master_process = ddp_rank == 0
    seed_offset = ddp_rank
else:
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
if master_process:
    os.makedirs("out", exist_ok=True)
torch.manual_seed(1337 + seed_offset)

data = torch.randint(0, 65, (20000,))
train_data, val_data = data[:18000], data[18000:]


def get_batch(split):
    source = train_data if split == "train" else val_data
    ix = torch.randint(len(source) - block_size, (batch_size,))
    x = torch.stack([source[i : i + block_size] for i in ix])
    y = torch.stack([source[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


model = nn.Sequential(nn.Embedding(65, 32), nn.Linear(32, 65))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(10)
        for k in range(10):
            X, Y = get_batch(split)
            losses[k] = nn.functional.cross_entropy(model(X).view(-1, 65), Y.view(-1)).item()
        out[split] = losses.mean()
    model.train()
    return out


X, Y = get_batch("train")
for iter_num in range(max_iters):
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        checkpoint = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num}
        torch.save(checkpoint, os.path.join("out", "ckpt.pt"))
    logits = model(X)
    loss = nn.functional.cross_entropy(logits.view(-1, 65), Y.view(-1))
    X, Y = get_batch("train")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
if ddp:
    destroy_process_group()
