"""Predicting sine waves with stacked LSTMCells trained by L-BFGS, in the
style of PyTorch's time-sequence-prediction example: float64 throughout,
a closure that zeroes the gradients and runs backward, a future
prediction under no_grad."""
import math

import torch
import torch.nn as nn
import torch.optim as optim

torch.manual_seed(0)
T, N = 24, 6
phase = torch.rand(N, 1) * 2 * math.pi
t = torch.arange(T + 1, dtype=torch.float64) * 0.4
data = torch.sin(t.unsqueeze(0) + phase.double())
inputs, targets = data[:, :-1], data[:, 1:]


class Sequence(nn.Module):
    def __init__(self, hidden=12):
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, x, future=0):
        outputs = []
        h1 = torch.zeros(x.size(0), self.hidden, dtype=torch.double)
        c1 = torch.zeros(x.size(0), self.hidden, dtype=torch.double)
        h2 = torch.zeros(x.size(0), self.hidden, dtype=torch.double)
        c2 = torch.zeros(x.size(0), self.hidden, dtype=torch.double)
        out = None
        for x_t in x.split(1, dim=1):
            h1, c1 = self.lstm1(x_t, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            out = self.linear(h2)
            outputs.append(out)
        for _ in range(future):
            h1, c1 = self.lstm1(out, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            out = self.linear(h2)
            outputs.append(out)
        return torch.cat(outputs, dim=1)


seq = Sequence().double()
criterion = nn.MSELoss()
optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=6)
LOSSES = []


def closure():
    optimizer.zero_grad()
    loss = criterion(seq(inputs), targets)
    loss.backward()
    LOSSES.append(loss.item())
    return loss


for step in range(2):
    optimizer.step(closure)
with torch.no_grad():
    pred = seq(inputs[:2], future=5)
    LOSSES.append(criterion(pred[:, :-5], targets[:2]).item())
