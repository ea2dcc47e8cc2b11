"""The mixed-precision recipe on a small MLP: autocast (bfloat16 on the CPU),
GradScaler with unscale_ and gradient clipping, Adam, a checkpoint saved and
loaded mid-run."""
import io

import torch
import torch.nn as nn

torch.manual_seed(2)
X = torch.randn(128, 20)
W = torch.randn(20, 3)
Y = (X @ W).argmax(dim=1)
model = nn.Sequential(nn.Linear(20, 64), nn.SiLU(), nn.Linear(64, 3))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
LOSSES = []
for step in range(12):
    xb, yb = X[step * 8 % 128:][:32], Y[step * 8 % 128:][:32]
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        logits = model(xb)
        loss = nn.functional.cross_entropy(logits, yb)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    scaler.step(opt)
    scaler.update()
    LOSSES.append(loss.item())
    if step == 5:
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                    "scaler": scaler.state_dict()}, buf)
        buf.seek(0)
        ck = torch.load(buf)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        scaler.load_state_dict(ck["scaler"])
LOSSES.append(scaler.get_scale())
