"""nanoGPT under fpemu against nanoGPT under torch: the fp32 loss of N steps.

Usage::

    python bench/nanogpt_parity.py --nanogpt PATH/TO/nanoGPT [--steps 20]

PATH/TO/nanoGPT is a checkout of https://github.com/karpathy/nanoGPT (this
repository holds none of its code). The script copies ``model.py`` and
``train.py`` twice into a temporary folder: once as they are, once with only
their ``import torch`` / ``from torch...`` lines pointed at
``fpemu.autograd``. It builds a small character-level dataset (from this
repository's README) and, with torch, a 0.8M-parameter checkpoint (4 layers,
width 128, context 64) with its AdamW state. Both copies then run
``train.py --init_from=resume --device=cpu --dtype=float32`` from that
checkpoint with the same batches (nanoGPT draws them with ``torch.randint``
from a seed, which fpemu reproduces), fpemu under its CPU profile; every
training loss is recorded and the two runs are compared. The exit status is
1 when a loss differs by more than ``--tol`` (default 1e-6).

With ``--dtype bfloat16`` or ``float16`` only the fpemu run is made, with
``--device=cuda`` under the CUDA profile (nanoGPT autocasts on cuda only;
GradScaler for float16): torch on a CPU has no CUDA autocast to compare
with. The losses are printed and must be finite.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_IMPORT = re.compile(r"^(\s*)(import torch\b|from torch\b)(.*)$")

# Runs inside a copy: record every training loss, then run train.py.
_RUNNER = r'''
import json, runpy, sys
backend, out_file = sys.argv[1], sys.argv[2]
if backend == "fpemu":
    import fpemu.autograd as ag
    ag.set_profile(ag.Profile(sys.argv[3]))
import model
losses = []
forward = model.GPT.forward
def recording_forward(self, idx, targets=None):
    out = forward(self, idx, targets)
    if targets is not None and self.training:
        losses.append(float(out[1].item()))
    return out
model.GPT.forward = recording_forward
sys.argv = ["train.py"] + sys.argv[4:]
runpy.run_path("train.py", run_name="__main__")
json.dump(losses, open(out_file, "w"))
'''


def rewrite_imports(src: str) -> tuple[str, int]:
    """Point the ``torch`` import lines of a file at fpemu.autograd; nothing
    else changes. Returns the new text and the number of lines changed."""
    out, n = [], 0
    for line in src.splitlines(keepends=True):
        m = _IMPORT.match(line)
        if m:
            indent, head, rest = m.groups()
            if head.startswith("import"):
                # import torch -> import fpemu.autograd as torch;
                # import torch.nn as nn -> import fpemu.autograd.nn as nn
                mod = "fpemu.autograd" + rest.split(" as ")[0].strip()
                alias = rest.split(" as ")[1].strip() if " as " in rest else "torch"
                line = f"{indent}import {mod} as {alias}\n"
            else:
                line = f"{indent}from fpemu.autograd{rest}\n"
            n += 1
        out.append(line)
    return "".join(out), n


def make_dataset(folder: str) -> int:
    """A character-level dataset from this repository's README (nanoGPT's
    shakespeare_char layout: train.bin, val.bin, meta.pkl)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read() * 4
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], np.uint16)
    cut = int(0.9 * len(ids))
    os.makedirs(folder, exist_ok=True)
    ids[:cut].tofile(os.path.join(folder, "train.bin"))
    ids[cut:].tofile(os.path.join(folder, "val.bin"))
    with open(os.path.join(folder, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                     "stoi": stoi}, f)
    return len(chars)


def make_checkpoint(copy: str, vocab: int, lr: float) -> None:
    """With torch, from seed 0: the model and its AdamW state, as train.py's
    own checkpoints hold them."""
    code = f'''
import sys, torch
sys.path.insert(0, ".")
from model import GPT, GPTConfig
torch.manual_seed(0)
args = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, bias=False, vocab_size={vocab},
            dropout=0.0)
m = GPT(GPTConfig(**args))
opt = m.configure_optimizers(0.1, {lr}, (0.9, 0.95), "cpu")
torch.save(dict(model=m.state_dict(), optimizer=opt.state_dict(), model_args=args,
                iter_num=0, best_val_loss=1e9, config={{}}), "out/ckpt.pt")
'''
    os.makedirs(os.path.join(copy, "out"), exist_ok=True)
    subprocess.run([sys.executable, "-c", code], cwd=copy, check=True)


def train_args(steps: int, dtype: str, lr: float) -> list[str]:
    device = "cpu" if dtype == "float32" else "cuda"    # nanoGPT autocasts on cuda only
    return ["--init_from=resume", f"--device={device}", f"--dtype={dtype}", "--compile=False",
            "--dataset=tiny", f"--max_iters={steps}", "--eval_interval=1000000",
            "--eval_iters=2", "--batch_size=8", "--block_size=64",
            "--gradient_accumulation_steps=1", "--always_save_checkpoint=False",
            "--log_interval=1000000", "--warmup_iters=2", f"--learning_rate={lr}",
            f"--lr_decay_iters={steps}", f"--min_lr={lr / 10}"]


def run(copy: str, backend: str, profile: str, args: list[str]) -> list[float]:
    with open(os.path.join(copy, "_fpemu_runner.py"), "w") as f:
        f.write(_RUNNER)
    out_file = os.path.join(copy, "losses.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, copy]))
    subprocess.run([sys.executable, "_fpemu_runner.py", backend, out_file, profile] + args,
                   cwd=copy, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out_file) as f:
        return json.load(f)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nanogpt", required=True, help="a checkout of karpathy/nanoGPT")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--keep", help="work in this folder and keep it")
    a = p.parse_args(argv)
    for name in ("model.py", "train.py", "configurator.py"):
        if not os.path.exists(os.path.join(a.nanogpt, name)):
            p.error(f"{a.nanogpt!r} has no {name}: expected a checkout of karpathy/nanoGPT "
                    f"(git clone https://github.com/karpathy/nanoGPT)")
    work = a.keep or tempfile.mkdtemp(prefix="nanogpt_parity_")
    lr = 1e-3
    copies = {}
    for backend in ("torch", "fpemu"):
        copy = os.path.join(work, backend)
        os.makedirs(copy, exist_ok=True)
        for name in ("model.py", "train.py", "configurator.py"):
            with open(os.path.join(a.nanogpt, name), encoding="utf-8") as f:
                src = f.read()
            if backend == "fpemu":
                src, n = rewrite_imports(src)
                print(f"{name}: {n} import line(s) changed")
            with open(os.path.join(copy, name), "w", encoding="utf-8") as f:
                f.write(src)
        vocab = make_dataset(os.path.join(copy, "data", "tiny"))
        copies[backend] = copy
    make_checkpoint(copies["torch"], vocab, lr)
    os.makedirs(os.path.join(copies["fpemu"], "out"), exist_ok=True)
    shutil.copy(os.path.join(copies["torch"], "out", "ckpt.pt"),
                os.path.join(copies["fpemu"], "out", "ckpt.pt"))
    args = train_args(a.steps, a.dtype, lr)
    if a.dtype != "float32":
        losses = run(copies["fpemu"], "fpemu", "cuda", args)
        print(f"fpemu (CUDA profile, {a.dtype}): {len(losses)} losses")
        for i, v in enumerate(losses):
            print(f"{i:4d} {v:.7f}")
        ok = len(losses) == a.steps + 1 and all(np.isfinite(losses))
        return 0 if ok else 1
    ref = run(copies["torch"], "torch", "", args)
    got = run(copies["fpemu"], "fpemu", "cpu", args)
    print(f"{'step':>4s} {'torch':>12s} {'fpemu':>12s} {'|diff|':>10s}")
    worst = 0.0
    for i, (r, g) in enumerate(zip(ref, got)):
        worst = max(worst, abs(r - g))
        print(f"{i:4d} {r:12.7f} {g:12.7f} {abs(r - g):10.2e}")
    same_len = len(ref) == len(got)
    print(f"{len(ref)} losses; largest difference {worst:.2e} (tolerance {a.tol:g})"
          + ("" if same_len else f"; torch gave {len(ref)} losses, fpemu {len(got)}"))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if same_len and worst <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
