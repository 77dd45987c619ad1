# nnwizard-expect: loss-reduction-mismatch
# nnwizard-symptom: oscillating
"""A Lightning-like module (training_step / validation_step / configure_optimizers) driven by a
small hand-written fit loop with gradient accumulation. Planted fault: the fit loop accumulates
gradients over 4 micro-batches without dividing each loss by 4, so every SGD step is 4x the size
the learning rate was tuned for."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class LitClassifier(nn.Module):
    def __init__(self, n_in=16, n_out=4, lr=0.3):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(n_in, 64), nn.ReLU(), nn.Linear(64, n_out))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        return {"val_loss": F.cross_entropy(logits, y).item(), "val_acc": (logits.argmax(1) == y).float().mean().item()}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def fit(module, train_loader, val_loader, max_epochs=3, accumulate_grad_batches=4):
    optimizer = module.configure_optimizers()
    for epoch in range(max_epochs):
        module.train()
        optimizer.zero_grad()
        for batch_idx, batch in enumerate(train_loader):
            loss = module.training_step(batch, batch_idx)
            loss.backward()
            if (batch_idx + 1) % accumulate_grad_batches == 0:
                optimizer.step()
                optimizer.zero_grad()
        module.eval()
        with torch.no_grad():
            outs = [module.validation_step(b, i) for i, b in enumerate(val_loader)]
        print(f"epoch {epoch}: val_loss {sum(o['val_loss'] for o in outs) / len(outs):.4f} "
              f"val_acc {sum(o['val_acc'] for o in outs) / len(outs):.3f}")


def blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(7)) * 2
    y = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset((centers[y] + torch.randn(n, 16, generator=g)) / 2.2, y)


if __name__ == "__main__":
    torch.manual_seed(0)
    fit(LitClassifier(), DataLoader(blobs(512, 0), batch_size=16, shuffle=True), DataLoader(blobs(256, 1), batch_size=64))
