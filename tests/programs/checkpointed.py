"""A deep MLP trained with activation checkpointing: blocks wrapped in
torch.utils.checkpoint.checkpoint (non-reentrant) and a tail run through
checkpoint_sequential, GELU and LayerNorm, AdamW with weight decay,
clip_grad_norm_ with foreach=True and error_if_nonfinite, a OneCycleLR
schedule."""
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

torch.manual_seed(3)
X = torch.randn(64, 16)
W = torch.randn(16, 4)
Y = torch.tanh(X @ W) + 0.1 * torch.randn(64, 4)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d=16, depth=3):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(depth)])
        self.tail = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d), nn.GELU(),
                                  nn.Linear(d, 4))

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return checkpoint_sequential(self.tail, 2, x, use_reentrant=False)


model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=12)
LOSSES = []
for step in range(12):
    idx = torch.randperm(64)[:16]
    loss = nn.functional.mse_loss(model(X[idx]), Y[idx])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5, foreach=True,
                                    error_if_nonfinite=True)
    opt.step()
    sched.step()
    LOSSES += [loss.item(), norm.item()]
