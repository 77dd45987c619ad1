"""Broken: NLLLoss on raw logits (the log_softmax was forgotten): the loss runs off below zero."""

from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["nan"], "hypotheses": ["loss-output-mismatch"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))   # no LogSoftmax


def build_data():
    return split(*blobs())


loss_fn = nn.NLLLoss()   # meant: nn.CrossEntropyLoss(), or add nn.LogSoftmax(dim=1) to the model
