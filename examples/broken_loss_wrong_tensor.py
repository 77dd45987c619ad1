"""Broken: train_step computes the predicted classes for logging and passes them to the loss in
place of the labels, so the model learns to agree with itself."""

from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["loss-wrong-tensor"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def train_step(model, batch, loss_fn, optimizer):
    model.train()
    x, y = batch
    optimizer.zero_grad()
    logits = model(x)
    y_hat = logits.argmax(dim=1)      # for the running accuracy
    loss = loss_fn(logits, y_hat)     # meant: loss_fn(logits, y)
    loss.backward()
    optimizer.step()
    return loss.item()
