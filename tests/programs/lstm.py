"""A word-level LSTM language model in plain PyTorch style: Embedding with
padding_idx, a 2-layer batch-first LSTM carried across batches with detach(),
dropout 0, a tied output layer, Adam, gradient clipping."""
import torch
import torch.nn as nn

torch.manual_seed(3)
words = ("a b c d e f g h a b c a b d e a c f g h " * 20).split()
vocab = ["<pad>"] + sorted(set(words))
ids = torch.tensor([vocab.index(w) for w in words])
V, E, T, B = len(vocab), 16, 10, 4


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, E, padding_idx=0)
        self.rnn = nn.LSTM(E, E, num_layers=2, batch_first=True, dropout=0.0)
        self.out = nn.Linear(E, V)
        self.out.weight = self.emb.weight

    def forward(self, x, state=None):
        y, state = self.rnn(self.emb(x), state)
        return self.out(y), state


model = LM()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.CrossEntropyLoss(ignore_index=0)
state = None
LOSSES = []
for step in range(12):
    start = (step * T * B) % (len(ids) - T * B - 1)
    x = ids[start:start + T * B].view(B, T)
    y = ids[start + 1:start + 1 + T * B].view(B, T)
    if state is not None:
        state = tuple(s.detach() for s in state)
    logits, state = model(x, state)
    loss = loss_fn(logits.reshape(-1, V), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    LOSSES.append(loss.item())
