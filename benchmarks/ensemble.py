"""Benchmark (not a test): S solo Lightning runs vs one vectorized ensemble run of the same S seeds.

    python -m benchmarks.ensemble                  # paper-like sizes, S = 5, printed as a table
    python -m benchmarks.ensemble --seeds 3 --steps 20 --json out.json
    python -m benchmarks.ensemble --quick          # a few steps of the smallest size (CI smoke)
    python -m benchmarks.ensemble --size 48,1,4,20,32 --seeds 3   # one size: d_model,n_layers,n_heads,seq_len,batch

Both sides train the shared tiny transformer (``stages.common.tiny_transformer``) on next-token CE
with AdamW through ``lightning.Trainer`` (built by ``stages.common.trainer.make_trainer``), seed k
with its own init and its own shuffled DataLoader: S separate ``Trainer.fit`` calls vs one
``EnsembleModule`` fit over ``seed_loader``. Reported: wall-clock and CPU (process) seconds of each
side and the solo/ensemble ratio (> 1: the ensemble is faster), plus the largest |loss| difference
between member k and solo seed k at the last step (the two must agree to float rounding). Times
include Trainer construction, as a paper's train stage pays it. On a shared machine wall-clock
overstates; the CPU ratio is the steadier number. No assertion is made on any time.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from stages.common.ensemble import EnsembleModule, seed_loader
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.common.trainer import TrainerConfig, make_trainer

# (label, d_model, n_layers, n_heads, seq_len, batch_size): the sizes papers here train at
SIZES = [
    ("small   d=32 L=2 T=16 B=16", 32, 2, 4, 16, 16),
    ("paper   d=64 L=2 T=32 B=32", 64, 2, 4, 32, 32),
    ("larger  d=128 L=2 T=64 B=32", 128, 2, 4, 64, 32),
]
VOCAB, N_SEQ, LR, WD = 128, 512, 3e-3, 0.1


def lm_loss(model, batch):
    (tokens,) = batch
    logits = model(tokens[:, :-1])  # (B, T-1, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


class Solo:
    """A plain single-seed LightningModule (built lazily so importing this file stays cheap)."""

    @staticmethod
    def build(model):
        import lightning as L

        class _Solo(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.model, self.last = model, None

            def training_step(self, batch, batch_idx):
                loss = lm_loss(self.model, batch)
                self.last = loss.detach()
                return loss

            def configure_optimizers(self):
                return torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=WD)

        return _Solo()


class Arm(EnsembleModule):
    def member_loss(self, model, batch):
        return lm_loss(model, batch)


def trainer(steps: int):
    return make_trainer(TrainerConfig(max_steps=steps, enable_progress_bar=False))


def run_size(label, d, layers, heads, T, B, seeds, steps):
    cfg = TinyTransformerConfig(vocab_size=VOCAB, d_model=d, n_layers=layers, n_heads=heads, max_seq_len=T)
    make = lambda seed: TinyTransformer(cfg)  # noqa: E731
    data = (torch.randint(0, VOCAB, (N_SEQ, T), generator=torch.Generator().manual_seed(0)),)

    w0, c0 = time.perf_counter(), time.process_time()
    solo_last = []
    for s in seeds:
        torch.manual_seed(s)
        solo = Solo.build(make(s))
        loader = DataLoader(TensorDataset(*data), batch_size=B, shuffle=True, generator=torch.Generator().manual_seed(s))
        trainer(steps).fit(solo, loader)
        solo_last.append(float(solo.last))
    solo_wall, solo_cpu = time.perf_counter() - w0, time.process_time() - c0

    w0, c0 = time.perf_counter(), time.process_time()
    arm = Arm(make, seeds, optimizer=partial(torch.optim.AdamW, lr=LR, weight_decay=WD))
    trainer(steps).fit(arm, seed_loader(data, B, seeds))
    ens_wall, ens_cpu = time.perf_counter() - w0, time.process_time() - c0

    diff = max(abs(a - float(b)) for a, b in zip(solo_last, arm.last_losses))
    return {"size": label, "seeds": len(seeds), "steps": steps,
            "solo_wall_s": solo_wall, "ensemble_wall_s": ens_wall, "wall_ratio": solo_wall / ens_wall,
            "solo_cpu_s": solo_cpu, "ensemble_cpu_s": ens_cpu, "cpu_ratio": solo_cpu / ens_cpu,
            "last_loss_max_abs_diff": diff}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="S, the number of seeds (members)")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    ap.add_argument("--quick", action="store_true", help="3 steps of the smallest size only")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--size", action="append", default=[], metavar="D,L,H,T,B",
                    help="a size to run instead of the built-in ones (repeatable): d_model,n_layers,n_heads,seq_len,batch")
    args = ap.parse_args(argv)
    custom = []
    for spec in args.size:
        try:
            d, L, H, T, B = (int(x) for x in spec.split(","))
        except ValueError:
            ap.error(f"--size {spec!r}: expected five integers d_model,n_layers,n_heads,seq_len,batch")
        if min(d, L, H, T, B) < 1 or d % H:
            ap.error(f"--size {spec!r}: every value must be positive and d_model divisible by n_heads")
        custom.append((f"d={d} L={L} T={T} B={B}", d, L, H, T, B))
    if args.seeds < 1 or args.steps < 1:
        ap.error("--seeds and --steps must be positive")
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no per-fit banner lines
    warnings.filterwarnings("ignore", module="lightning")
    sizes, steps = (SIZES[:1], 3) if args.quick else (custom or SIZES, args.steps)
    seeds = list(range(args.seeds))
    print(f"S={len(seeds)} seeds, {steps} AdamW steps each, 1 intra-op thread; ratio = solo / ensemble (> 1: ensemble faster)")
    head = f"{'size':<30} {'solo wall s':>11} {'ens wall s':>10} {'wall ratio':>10} {'solo cpu s':>10} {'ens cpu s':>9} {'cpu ratio':>9} {'|Δ loss|':>9}"
    print(head)
    print("-" * len(head))
    rows = []
    for size in sizes:
        r = run_size(*size, seeds, steps)
        rows.append(r)
        print(f"{r['size']:<30} {r['solo_wall_s']:>11.2f} {r['ensemble_wall_s']:>10.2f} {r['wall_ratio']:>10.2f} "
              f"{r['solo_cpu_s']:>10.2f} {r['ensemble_cpu_s']:>9.2f} {r['cpu_ratio']:>9.2f} {r['last_loss_max_abs_diff']:>9.1e}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
