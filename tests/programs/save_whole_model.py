"""Saving a whole model object and loading it back under torch 2.6+'s
weights-only default: the classes are allowlisted by their module paths
in torch.serialization.safe_globals, then training goes on from the loaded
copy. The model mixes an Embedding, an LSTM, a TransformerEncoderLayer and
a ModuleList of Linears."""
import os
import tempfile

import torch
import torch.nn as nn

torch.manual_seed(21)
V, D = 16, 8
data = torch.randint(0, V, (12, 6))


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.rnn = nn.LSTM(D, D, batch_first=True)
        self.enc = nn.TransformerEncoderLayer(D, 2, 16, dropout=0.0, batch_first=True)
        self.heads = nn.ModuleList([nn.Linear(D, V), nn.Linear(D, V)])

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        h = self.enc(h)
        return self.heads[0](h) + self.heads[1](h)


def train(model, steps, losses):
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(steps):
        logits = model(data[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, V), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())


LOSSES = []
model = Tagger()
train(model, 5, LOSSES)
path = os.path.join(tempfile.mkdtemp(), "tagger.pt")
torch.save(model, path)
allowed = [
    Tagger,
    torch.nn.modules.sparse.Embedding,
    torch.nn.modules.rnn.LSTM,
    torch.nn.modules.transformer.TransformerEncoderLayer,
    torch.nn.modules.activation.MultiheadAttention,
    torch.nn.modules.linear.NonDynamicallyQuantizableLinear,
    torch.nn.modules.linear.Linear,
    torch.nn.modules.normalization.LayerNorm,
    torch.nn.modules.dropout.Dropout,
    torch.nn.modules.container.ModuleList,
    torch.nn.functional.relu,
]
with torch.serialization.safe_globals(allowed):
    loaded = torch.load(path)
os.remove(path)
assert type(loaded).__name__ == "Tagger" and Tagger not in torch.serialization.get_safe_globals()
LOSSES.append(float(all(torch.equal(a, b) for a, b in
                        zip(model.state_dict().values(), loaded.state_dict().values()))))
train(loaded, 5, LOSSES)
