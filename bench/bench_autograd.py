"""One training step of fpemu.autograd against torch on the CPU.

Step = forward, backward, AdamW, GradScaler (scale / step / update).
fpemu runs under bf16 autocast (emulated CUDA); torch runs the same model in
fp32 on the CPU, in the same process. Printed: median ms per step and the
ratio fpemu / torch, against the target of at most 2x (threads equal) for
every model, a tiny nanoGPT (2 layers of 64, 8 x 32 tokens) included: there
torch's step takes a few ms, so the emulator's per-op overhead shows. Issue
51 adds torch's own ``nn.TransformerEncoder`` and a GPT-2-style model
written as tutorials write it (module per block, SDPA, gradient clipping,
AdamW with fused=False), same target.

    python bench/bench_autograd.py [--repeats 20] [--matmul-model sequential]

``--matmul-model``: fpemu's matmul model (``auto``, the default: the CUDA
profile's tensor-core models, the GPU's bits; ``sequential``: float32 products
added in index order, the speed of the engine before issue 67, not the GPU's
bits), to tell the engine's own cost from its products'.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench_quantize import timed  # the same timing rule as the other benches


def mlp(lib):
    return lib.nn.Sequential(lib.nn.Linear(784, 512), lib.nn.ReLU(), lib.nn.Linear(512, 10))


def block(lib):
    if lib.__name__ == "torch":
        return lib.nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, activation="gelu",
                                              batch_first=True, norm_first=True)
    return lib.nn.TransformerBlock(64, 4, causal=False)


def gpt(lib, vocab=65, n_layer=4, n_embd=128, n_head=4, block_size=64):
    """A GPT in nanoGPT's shape (pre-norm blocks, fused qkv, SDPA with a causal
    mask, GELU MLP, tied embedding), written once in plain PyTorch style and
    built with either library: 0.8 M parameters at the defaults."""
    nn, F = lib.nn, lib.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
            self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
            self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
            self.mlp_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(self.ln_1(x)).split(n_embd, dim=2)
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, n_embd)
            self.wpe = nn.Embedding(block_size, n_embd)
            self.h = nn.ModuleList([Block() for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab, bias=False)
            self.wte.weight = self.lm_head.weight

        def forward(self, idx):
            pos = lib.arange(0, idx.size(1), dtype=lib.long)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.h:
                x = b(x)
            return self.lm_head(self.ln_f(x))

    return GPT()


def encoder(lib):
    """torch's own nn.TransformerEncoder: 2 layers of d 64, 4 heads."""
    nn = lib.nn
    layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False),
                         nn.Linear(64, 64))


def gpt2_tutorial(lib, vocab=96, n_layer=2, d=64, n_head=4, block_size=32):
    """A GPT-2-style model written the way training tutorials write it: a
    module per block with its own attention and MLP modules, separate q / k /
    v projections, ``F.scaled_dot_product_attention``, dropout modules (p=0),
    learned positions, an untied head."""
    nn, F = lib.nn, lib.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(d, d) for _ in range(3))
            self.out = nn.Linear(d, d)
            self.drop = nn.Dropout(0.0)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (p(x).view(B, T, n_head, C // n_head).transpose(1, 2)
                       for p in (self.q, self.k, self.v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.drop(self.out(y.transpose(1, 2).reshape(B, T, C)))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.act, self.drop = nn.GELU(approximate="tanh"), nn.Dropout(0.0)

        def forward(self, x):
            return self.drop(self.proj(self.act(self.fc(x))))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(d), Attention(), \
                nn.LayerNorm(d), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block_size, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
            self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            pos = lib.arange(idx.shape[1])
            return self.head(self.ln_f(self.blocks(self.tok(idx) + self.pos(pos))))

    return GPT2()


def make_step(lib, model, x, y, autocast, clip=None):
    opt = lib.optim.AdamW(model.parameters(), lr=1e-3, fused=False)
    scaler = lib.amp.GradScaler("cuda" if autocast else "cpu")

    def step():
        if autocast:
            with lib.autocast(device_type="cuda", dtype=lib.bfloat16):
                out = model(x)
                loss = lib.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        else:
            out = model(x)
            loss = lib.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        if clip is not None:
            scaler.unscale_(opt)
            lib.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(opt)
        scaler.update()
    return step


def cases(rng):
    """The bench's models: name -> (build(lib), inputs, targets), drawn from
    ``rng`` in this order (``profile_step.py`` profiles one of them)."""
    return {
        "MLP 784-512-10, batch 256": (mlp, rng.standard_normal((256, 784)),
                                      rng.integers(0, 10, 256)),
        "transformer block d=64 h=4, 8x32 tokens": (
            block, rng.standard_normal((8, 32, 64)), rng.integers(0, 64, 256)),
        "nanoGPT shape 0.8M (4x128, 8x64 tokens)": (gpt, rng.integers(0, 65, (8, 64)),
                                                    rng.integers(0, 65, 512)),
        "tiny nanoGPT (2x64, 8x32 tokens)": (
            lambda lib: gpt(lib, n_layer=2, n_embd=64, block_size=32),
            rng.integers(0, 65, (8, 32)), rng.integers(0, 65, 256)),
        "nn.TransformerEncoder 2x64, 8x32 tokens": (
            encoder, rng.standard_normal((8, 32, 64)), rng.integers(0, 64, 256)),
        "GPT-2 tutorial style 2x64, clip 1.0": (
            gpt2_tutorial, rng.integers(0, 96, (8, 32)), rng.integers(0, 96, 256)),
    }


def step_pair(ft, torch, name, build, xs, ys):
    """``(fpemu's step under bf16 autocast, torch's fp32 step)`` of the
    bench's model ``name`` (an entry of :func:`cases`), both libraries seeded
    0; a model whose name says "clip" clips its gradients to norm 1."""
    ft.manual_seed(0)
    torch.manual_seed(0)
    xdt = np.int64 if xs.dtype.kind == "i" else np.float32
    clip = 1.0 if "clip" in name else None
    ours = make_step(ft, build(ft), ft.tensor(xs.astype(xdt)), ft.tensor(ys), True, clip)
    theirs = make_step(torch, build(torch), torch.tensor(xs.astype(xdt)), torch.tensor(ys),
                       False, clip)
    return ours, theirs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--matmul-model", default="auto",
                        help="fpemu's matmul model (set_matmul_model): auto or sequential")
    args = parser.parse_args()
    import torch
    import fpemu.autograd as ft
    ft.set_matmul_model(args.matmul_model)
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    models = cases(rng)
    print(f"{'one training step':44s} {'torch fp32 ms':>14s} {'fpemu bf16 ms':>14s} "
          f"{'ratio':>7s}  target <= 2x")
    for name, (build, xs, ys) in models.items():
        ours, theirs = step_pair(ft, torch, name, build, xs, ys)
        t_torch = timed(theirs, args.repeats)
        t_ours = timed(ours, args.repeats)
        r = t_ours / t_torch
        print(f"{name:44s} {t_torch * 1e3:14.2f} {t_ours * 1e3:14.2f} "
              f"{r:6.1f}x  {'met' if r <= 2.0 else 'MISSED'}")


if __name__ == "__main__":
    main()
