"""A LightningModule classifying a synthetic table, fitted by ``lightning.Trainer`` with a validation loop.

    python examples/frameworks/lightning_module.py                        # healthy
    python examples/frameworks/lightning_module.py --lr 10                # planted: learning rate far too high
    python examples/frameworks/lightning_module.py --shift-labels         # planted: labels one record off their inputs
    python examples/frameworks/lightning_module.py --train-in-validation  # planted: validation_step calls self.train()
"""

import argparse

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def blobs(n, seed, shift=False):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    centres = 2.0 * torch.randn(4, 16, generator=g)
    x = centres[labels] + torch.randn(n, 16, generator=g)
    return TensorDataset(x, torch.roll(labels, 1) if shift else labels)


class Classifier(pl.LightningModule):
    def __init__(self, lr=3e-3, train_in_validation=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 4))
        self.lr, self.train_in_validation = lr, train_in_validation

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        if self.train_in_validation:
            self.train()
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--shift-labels", action="store_true")
    parser.add_argument("--train-in-validation", action="store_true")
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    train = DataLoader(blobs(1024, 0, args.shift_labels), batch_size=32, shuffle=True)
    val = DataLoader(blobs(256, 1, args.shift_labels), batch_size=128)
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=10)
    trainer.fit(Classifier(args.lr, args.train_in_validation), train, val)
    print("val loss", float(trainer.callback_metrics["val_loss"]))


if __name__ == "__main__":
    main()
