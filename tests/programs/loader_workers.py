"""A DataLoader with worker processes, as training scripts written for a GPU
ask for: num_workers=2, shuffle, pin_memory, persistent workers, a
worker_init_fn that seeds numpy from the worker's torch seed, and a dataset
whose __getitem__ augments its samples with torch, numpy and random numbers.
The batches (and so the losses) depend on torch's worker seeding."""
import random

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, get_worker_info

torch.manual_seed(13)
BASE = torch.randn(40, 6)
LABELS = (BASE.sum(1) > 0).long()


class Noisy(Dataset):
    def __len__(self):
        return len(BASE)

    def __getitem__(self, i):
        info = get_worker_info()
        x = BASE[i] + 0.05 * torch.randn(6)
        x = x * float(np.random.uniform(0.9, 1.1)) + random.random() * 0.01
        return x, LABELS[i], -1 if info is None else info.id


def seed_worker(worker_id):
    np.random.seed(torch.initial_seed() % 2 ** 32 + worker_id)


loader = DataLoader(Noisy(), batch_size=8, shuffle=True, num_workers=2, pin_memory=True,
                    persistent_workers=True, worker_init_fn=seed_worker, timeout=120,
                    generator=torch.Generator().manual_seed(4))
model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 2))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
LOSSES = []
for epoch in range(2):
    for x, y, worker in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        LOSSES += [loss.item(), float(worker.sum())]
