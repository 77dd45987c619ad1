# nnwizard-expect: no-grad-missing
# nnwizard-symptom: auto
"""pytorch/examples style (argparse, main(), train(args, model, device, loader, optimizer, epoch)
and test(model, device, loader)) for a small sequence classifier: token ids -> embedding -> GRU ->
linear. Planted fault: test() switches to eval mode but never disables autograd, so every
validation batch records a graph (memory and time spent for nothing)."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

VOCAB, SEQ, CLASSES = 50, 12, 3


def make_sequences(n, seed):
    """Class c sequences are rich in tokens from their own third of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    noise = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    own = torch.randint(0, VOCAB // CLASSES, (n, SEQ), generator=g) + (VOCAB // CLASSES) * y[:, None]
    keep = torch.rand(n, SEQ, generator=g) < 0.5
    return TensorDataset(torch.where(keep, own, noise), y)


class SeqNet(nn.Module):
    def __init__(self, vocab=VOCAB, emb=16, hidden=32, classes=CLASSES):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.rnn = nn.GRU(emb, hidden, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(hidden, classes)

    def forward(self, tokens):
        _, h = self.rnn(self.embed(tokens))
        return self.out(self.drop(h.squeeze(0)))


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (tokens, target) in enumerate(train_loader):
        tokens, target = tokens.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f"epoch {epoch} batch {batch_idx} loss {loss.item():.4f}")


def test(model, device, test_loader):
    model.eval()
    total, correct = 0.0, 0
    for tokens, target in test_loader:
        tokens, target = tokens.to(device), target.to(device)
        output = model(tokens)
        total += F.cross_entropy(output, target, reduction="sum").item()
        correct += output.argmax(1).eq(target).sum().item()
    n = len(test_loader.dataset)
    print(f"test loss {total / n:.4f} accuracy {correct / n:.3f}")
    return correct / n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-interval", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    train_loader = DataLoader(make_sequences(512, 0), batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(make_sequences(256, 1), batch_size=64)
    model = SeqNet().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)


if __name__ == "__main__":
    main()
