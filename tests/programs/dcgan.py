"""A small DCGAN on synthetic 16x16 images, in the style of the PyTorch
DCGAN tutorial: ConvTranspose2d / BatchNorm2d / ReLU generator, Conv2d /
LeakyReLU / BatchNorm2d / Sigmoid discriminator, weights_init through
model.apply, BCELoss, two Adam optimizers with betas (0.5, 0.999), fake
images detached for the discriminator step."""
import torch
import torch.nn as nn
import torch.optim as optim

torch.manual_seed(11)
nz, ngf, ndf, B = 8, 8, 8, 16
yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")


def real_batch(n):
    cx = torch.rand(n, 1, 1) * 8 + 4
    cy = torch.rand(n, 1, 1) * 8 + 4
    blobs = torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 8.0)
    return (blobs * 2 - 1).unsqueeze(1)


def weights_init(m):
    name = m.__class__.__name__
    if name.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif name.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, 1, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


netG, netD = Generator(), Discriminator()
netG.apply(weights_init)
netD.apply(weights_init)
criterion = nn.BCELoss()
optD = optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
optG = optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
fixed_noise = torch.randn(4, nz, 1, 1)
LOSSES = []
for step in range(8):
    real = real_batch(B)
    netD.zero_grad()
    label = torch.full((B,), 1.0)
    errD_real = criterion(netD(real), label)
    errD_real.backward()
    noise = torch.randn(B, nz, 1, 1)
    fake = netG(noise)
    label.fill_(0.0)
    errD_fake = criterion(netD(fake.detach()), label)
    errD_fake.backward()
    optD.step()
    netG.zero_grad()
    label.fill_(1.0)
    errG = criterion(netD(fake), label)
    errG.backward()
    optG.step()
    LOSSES += [(errD_real + errD_fake).item(), errG.item()]
netG.eval()
with torch.no_grad():
    LOSSES.append(netG(fixed_noise).abs().mean().item())
