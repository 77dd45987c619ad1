"""Broken: evaluate() switches to eval mode but builds an autograd graph for every validation batch
(no torch.no_grad()); on the real model, validation runs out of memory before training does."""

from torch import nn

from examples.datasets import images, split

EXPECTED = {"symptoms": ["auto"], "hypotheses": ["no-grad-missing"]}


def build_model():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 6 * 6, 4),
    )


def build_data():
    return split(*images())


loss_fn = nn.CrossEntropyLoss()


def evaluate(model, loader, loss_fn):
    model.eval()
    losses, correct, n = [], 0, 0
    for x, y in loader:               # no torch.no_grad(): every batch records a graph
        out = model(x)
        losses.append(loss_fn(out, y).item())
        correct += (out.argmax(1) == y).sum().item()
        n += len(y)
    model.train()
    return {"loss": sum(losses) / len(losses), "accuracy": correct / n}
