"""A variational autoencoder on synthetic binary patterns, written as the
usual tutorial VAE: encoder to (mu, logvar), reparametrisation with
randn_like, sigmoid decoder, BCE(sum) + KL divergence, Adam, a shuffled
DataLoader and model.train()/eval() with a no_grad evaluation."""
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(7)
protos = (torch.rand(4, 36) > 0.5).float()
data = protos[torch.randint(0, 4, (96,))]
flips = (torch.rand(96, 36) < 0.05).float()
data = (data + flips) % 2
loader = DataLoader(TensorDataset(data), batch_size=32, shuffle=True)


class VAE(nn.Module):
    def __init__(self, d=36, hidden=24, latent=4):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc_mu = nn.Linear(hidden, latent)
        self.fc_logvar = nn.Linear(hidden, latent)
        self.fc3 = nn.Linear(latent, hidden)
        self.fc4 = nn.Linear(hidden, d)

    def encode(self, x):
        h = F.relu(self.fc1(x))
        return self.fc_mu(h), self.fc_logvar(h)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x)
        return self.decode(self.reparameterize(mu, logvar)), mu, logvar


def loss_function(recon, x, mu, logvar):
    bce = F.binary_cross_entropy(recon, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


model = VAE()
opt = optim.Adam(model.parameters(), lr=1e-2)
LOSSES = []
for epoch in range(4):
    model.train()
    for (x,) in loader:
        opt.zero_grad()
        recon, mu, logvar = model(x)
        loss = loss_function(recon, x, mu, logvar)
        loss.backward()
        opt.step()
        LOSSES.append(loss.item() / len(x))
    model.eval()
    with torch.no_grad():
        mu, _ = model.encode(data)
        LOSSES.append(F.binary_cross_entropy(model.decode(mu), data).item())
