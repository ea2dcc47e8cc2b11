"""A small CNN on synthetic images, in plain PyTorch style: Conv2d,
ReLU(inplace), MaxPool2d, Flatten, Dropout(0), a DataLoader that shuffles,
SGD with momentum and Nesterov, StepLR."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(1)
X = torch.rand(64, 1, 12, 12)
Y = (X[:, 0, :6].mean(dim=(1, 2)) > X[:, 0, 6:].mean(dim=(1, 2))).long()
loader = DataLoader(TensorDataset(X, Y), batch_size=16, shuffle=True, drop_last=True)
model = nn.Sequential(
    nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
    nn.Conv2d(6, 8, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Dropout(0.0),
    nn.Linear(8 * 2 * 2, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
loss_fn = nn.CrossEntropyLoss(label_smoothing=0.05)
LOSSES = []
for epoch in range(3):
    for xb, yb in loader:
        loss = loss_fn(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        LOSSES.append(loss.item())
    sched.step()
