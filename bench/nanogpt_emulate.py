"""nanoGPT's own train.py under ``fpemu emulate``: the training loss per recipe.

Usage::

    python bench/nanogpt_emulate.py --nanogpt PATH/TO/nanoGPT [--iters 20]
        [--recipes fp32,bf16,mxfp8,nvfp4]

PATH/TO/nanoGPT is a checkout of https://github.com/karpathy/nanoGPT (this
repository holds none of its code). The script copies ``model.py``,
``train.py`` and ``configurator.py`` unchanged into a temporary folder, builds
the small character-level dataset of ``nanogpt_parity.py`` (from this
repository's README), and runs ``fpemu emulate --recipe R train.py ...`` for
each recipe (``fp32``: plain ``python train.py``) from scratch with the same
seed: a 2-layer, width-128 GPT, context 64, batch 8, one micro-step per
iteration, on the CPU. Each run's training losses (nanoGPT's own log lines,
every iteration) are printed side by side. The exit status is 1 if a run fails
or a loss is not finite.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from nanogpt_parity import make_dataset  # noqa: E402

_ITER = re.compile(r"^iter (\d+): loss ([0-9.naninf]+)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nanogpt", required=True, help="a checkout of karpathy/nanoGPT")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--recipes", default="fp32,bf16,mxfp8,nvfp4")
    a = p.parse_args(argv)
    for name in ("model.py", "train.py", "configurator.py"):
        if not os.path.exists(os.path.join(a.nanogpt, name)):
            p.error(f"{a.nanogpt!r} has no {name}: expected a checkout of karpathy/nanoGPT "
                    f"(git clone https://github.com/karpathy/nanoGPT)")
    work = tempfile.mkdtemp(prefix="nanogpt_emulate_")
    for name in ("model.py", "train.py", "configurator.py"):
        shutil.copy(os.path.join(a.nanogpt, name), work)
    make_dataset(os.path.join(work, "data", "tiny"))
    args = ["--device=cpu", "--dtype=float32", "--compile=False", "--dataset=tiny",
            f"--max_iters={a.iters}", "--eval_interval=1000000", "--eval_iters=1",
            "--batch_size=8", "--block_size=64", "--n_layer=2", "--n_head=4", "--n_embd=128",
            "--dropout=0.0", "--gradient_accumulation_steps=1", "--log_interval=1",
            "--always_save_checkpoint=False", "--warmup_iters=2", "--learning_rate=1e-3",
            f"--lr_decay_iters={a.iters}", "--min_lr=1e-4", f"--out_dir={work}/out"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    losses, ok = {}, True
    for recipe in [r for r in a.recipes.split(",") if r]:
        cmd = ([sys.executable, "train.py"] if recipe == "fp32" else
               [sys.executable, "-m", "fpemu.cli", "emulate", "--recipe", recipe, "train.py"])
        proc = subprocess.run(cmd + args, cwd=work, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{recipe}: exit status {proc.returncode}\n{proc.stderr[-3000:]}")
            ok = False
            continue
        losses[recipe] = [float(m.group(2)) for m in map(_ITER.match, proc.stdout.splitlines())
                          if m]
        tail = [ln for ln in proc.stderr.splitlines() if ln.startswith("fpemu emulate")]
        print(f"{recipe}: {len(losses[recipe])} iterations" + (f"; {tail[-1]}" if tail else ""))
    names = list(losses)
    print("iter " + " ".join(f"{n:>9s}" for n in names))
    for i in range(max((len(v) for v in losses.values()), default=0)):
        print(f"{i:4d} " + " ".join(f"{losses[n][i]:9.4f}" if i < len(losses[n]) else " " * 9
                                    for n in names))
    ok = ok and all(math.isfinite(x) for v in losses.values() for x in v)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
