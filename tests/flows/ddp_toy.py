"""A tiny regression trained by the shared Trainer factory: `python ddp_toy.py OUT.json [--devices N]`.

Every step is one full pass over the data (global batch = dataset). With devices=2 and strategy
ddp each rank sees a different half of it (Lightning's DistributedSampler); only DDP's gradient
all-reduce makes the result equal the single-process run on the whole batch (without it each rank
would fit its own half). Only global rank 0 writes OUT.json.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import lightning as L  # noqa: E402

from stages.common.trainer import TrainerConfig, global_rank, make_trainer  # noqa: E402


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        with torch.no_grad():
            self.lin.weight.zero_()
            self.lin.bias.zero_()

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=gen)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(64, 1, generator=gen)
    global_batch = len(x)  # one full-batch step per epoch, whatever order the sampler picks
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), shuffle=False,
                                         batch_size=global_batch // args.devices)
    cfg = TrainerConfig(strategy="ddp" if args.devices > 1 else "auto", devices=args.devices, max_epochs=5,
                        enable_progress_bar=False)
    model = Regression()
    make_trainer(cfg, None).fit(model, loader)
    if global_rank() == 0:
        Path(args.out).write_text(json.dumps({"world_size": args.devices,
                                              "weight": model.lin.weight.flatten().tolist(),
                                              "bias": model.lin.bias.tolist()}))


if __name__ == "__main__":
    main()
