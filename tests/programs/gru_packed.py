"""Classifying variable-length token sequences with recurrent layers over
packed sequences, as in the usual name-classification tutorials:
Embedding(padding_idx=0), pack_padded_sequence(enforce_sorted=False), a
2-layer bidirectional GRU whose final hidden states classify, and an Elman
RNN whose unpacked outputs are mean-pooled (pad_packed_sequence); SGD with
momentum, gradient clipping by value."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

torch.manual_seed(5)
V, E, H, C = 12, 8, 10, 3
seqs, labels = [], []
for i in range(24):
    n = int(torch.randint(2, 9, (1,)))
    label = i % C
    toks = torch.randint(1, V, (n,))
    toks[0] = 1 + label
    seqs.append(toks)
    labels.append(label)
lengths = torch.tensor([len(s) for s in seqs])
padded = pad_sequence(seqs, batch_first=True)
labels = torch.tensor(labels)


class GRUClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E, padding_idx=0)
        self.gru = nn.GRU(E, H, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * H, C)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(self.emb(x), lengths, batch_first=True,
                                      enforce_sorted=False)
        _, h = self.gru(packed)
        return self.out(torch.cat([h[-2], h[-1]], dim=1))


class RNNPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E, padding_idx=0)
        self.rnn = nn.RNN(E, H, nonlinearity="relu")
        self.out = nn.Linear(H, C)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(self.emb(x).transpose(0, 1), lengths,
                                      enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, lens = pad_packed_sequence(out)
        pooled = out.sum(0) / lens.unsqueeze(1).float()
        return self.out(pooled)


LOSSES = []
for model in (GRUClassifier(), RNNPool()):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(6):
        idx = torch.arange(step % 3 * 8, step % 3 * 8 + 8)
        logits = model(padded[idx], lengths[idx])
        loss = F.cross_entropy(logits, labels[idx])
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_value_(model.parameters(), 1.0)
        opt.step()
        LOSSES.append(loss.item())
