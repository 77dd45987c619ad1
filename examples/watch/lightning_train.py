"""A Lightning run (``Trainer.fit``) over a table with one corrupt record.

    python examples/watch/lightning_train.py                      # plain
    python examples/watch/lightning_train.py --watch nnwizard-watch  # with nnwizard's Lightning callback
    nnwizard watch --script examples/watch/lightning_train.py     # watched with no code change

Record ``BAD_RECORD`` (row 5 of batch 121 of 32) holds a NaN; ``--clean`` drops the corruption.
"""

import argparse

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

BAD_RECORD = 120 * 32 + 5


class Regressor(pl.LightningModule):
    def __init__(self, features=12, hidden=32, lr=3e-3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.lr = lr

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def make_data(clean=False, n=6400, features=12):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    y = (x[:, :3].sum(1) + 0.1 * torch.randn(n, generator=g))
    if not clean:
        x[BAD_RECORD, 4] = float("nan")
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--clean", action="store_true")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--watch", default=None, help="add nnwizard's WatchCallback writing to this folder")
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    callbacks = []
    if args.watch:
        from nnwizard.integrations.lightning import WatchCallback

        callbacks.append(WatchCallback(out=args.watch))
    trainer = pl.Trainer(max_steps=args.steps, max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
    trainer.fit(Regressor(), DataLoader(make_data(args.clean), batch_size=32, shuffle=False))
    print(f"trained {trainer.global_step} steps, last loss {float(trainer.callback_metrics.get('train_loss', float('nan'))):.4f}")


if __name__ == "__main__":
    main()
