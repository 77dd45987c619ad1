"""A Hugging Face ``Trainer`` fine-tuning a small classifier on a synthetic table (no downloads): the usual
``TrainingArguments`` with evaluation and checkpoints every epoch, keeping the last one.

    python examples/frameworks/hf_trainer.py                     # healthy
    python examples/frameworks/hf_trainer.py --lr 10             # planted: learning rate far too high
    python examples/frameworks/hf_trainer.py --shift-labels      # planted: labels moved one record off their inputs
"""

import argparse
import tempfile

import torch
from torch import nn
from transformers import Trainer, TrainingArguments


class Blobs(torch.utils.data.Dataset):
    """Four clusters in 16 dimensions; ``shift`` pairs each record with the next record's label."""

    def __init__(self, n=1024, seed=0, shift=False):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        centres = 2.0 * torch.randn(4, 16, generator=g)
        self.x = centres[self.labels] + torch.randn(n, 16, generator=g)
        if shift:
            self.labels = torch.roll(self.labels, 1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"features": self.x[i], "labels": self.labels[i]}


class Classifier(nn.Module):
    def __init__(self, hidden=64, classes=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, features, labels=None):
        logits = self.net(features)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--shift-labels", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out,
            learning_rate=args.lr,
            num_train_epochs=args.epochs,
            per_device_train_batch_size=32,
            per_device_eval_batch_size=128,
            eval_strategy="epoch",
            save_strategy="epoch",
            save_total_limit=1,
            logging_steps=10,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = Trainer(model=Classifier(), args=training, train_dataset=Blobs(shift=args.shift_labels),
                          eval_dataset=Blobs(n=256, seed=1, shift=args.shift_labels))
        trainer.train()
        print("eval loss", trainer.evaluate()["eval_loss"])


if __name__ == "__main__":
    main()
