"""Broken: an LSTM sequence classifier fed (batch, time, features) tensors, but the LSTM was built
without batch_first=True, so it runs its recurrence across the samples of the batch."""

from torch import nn

from examples._realdata import loaders, sequences

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["axes-swapped"]}


class SequenceClassifier(nn.Module):
    def __init__(self, features=4, hidden=16, classes=4):
        super().__init__()
        self.rnn = nn.LSTM(features, hidden)          # missing batch_first=True
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):                              # x: (batch, time, features)
        out, _ = self.rnn(x)
        return self.head(out[:, -1])                   # "last time step"


def build_model():
    return SequenceClassifier()


def build_data():
    return loaders(*sequences(n=320), standardise=False)


loss_fn = nn.CrossEntropyLoss()
