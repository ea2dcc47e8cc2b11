"""A character-level GPT trained for a few steps, in plain PyTorch style:
tied embeddings, causal SDPA, AdamW with weight-decay groups, a warmup +
cosine schedule, gradient clipping, torch.randint batches."""
import torch
import torch.nn as nn
from torch.nn import functional as F

torch.manual_seed(0)
text = "the quick brown fox jumps over the lazy dog. " * 40
vocab = sorted(set(text))
data = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
V, T, C, H, B = len(vocab), 16, 32, 4, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(V, C)
        self.pos = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.ln = nn.LayerNorm(C)
        self.head = nn.Linear(C, V, bias=False)
        self.tok.weight = self.head.weight
        self.apply(self._init)

    def _init(self, m):
        if isinstance(m, nn.Linear):
            torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                torch.nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


model = GPT()
decay = [p for p in model.parameters() if p.dim() >= 2]
no_decay = [p for p in model.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": no_decay, "weight_decay": 0.0}], lr=3e-3,
                        betas=(0.9, 0.95))
sched = torch.optim.lr_scheduler.SequentialLR(opt, [
    torch.optim.lr_scheduler.LinearLR(opt, 0.1, total_iters=3),
    torch.optim.lr_scheduler.CosineAnnealingLR(opt, 12)], milestones=[3])
LOSSES = []
for step in range(15):
    ix = torch.randint(len(data) - T - 1, (B,))
    x = torch.stack([data[i:i + T] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
with torch.no_grad():
    model.eval()
    LOSSES.append(model(x, y).item())
