"""Parameter sharing without torch.func: one Linear applied three times
(an unrolled recurrence), an embedding tied to the output layer, a
parameter used both through a module and through the functional API, and a
module registered under two names. SGD with Nesterov momentum and weight
decay."""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(9)
V, D = 10, 8
tokens = torch.randint(0, V, (32, 5))
targets = torch.roll(tokens, shifts=-1, dims=1)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.step = nn.Linear(D, D)
        self.mix = nn.Linear(D, D, bias=False)
        self.also_mix = self.mix                  # the same module under two names
        self.gate = nn.Parameter(torch.zeros(D))
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight        # tied weights

    def forward(self, x):
        h = self.emb(x).mean(1)
        for _ in range(3):                        # one Linear, three applications
            h = torch.tanh(self.step(h) + self.also_mix(h))
        h = h * torch.sigmoid(self.gate) + F.linear(h, self.mix.weight) * 0.1
        return self.head(h)


model = Tied()
names = [n for n, _ in model.named_parameters()]
assert len(names) == len(set(id(p) for p in model.parameters()))
opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, nesterov=True,
                      weight_decay=1e-4)
LOSSES = []
for step in range(10):
    logits = model(tokens)
    loss = F.cross_entropy(logits, targets[:, 0])
    opt.zero_grad()
    loss.backward()
    opt.step()
    LOSSES.append(loss.item())
LOSSES.append(float(len(names)))
