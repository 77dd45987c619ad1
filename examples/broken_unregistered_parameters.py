"""Broken: a digits classifier (scikit-learn's bundled digits) whose hidden layers are kept in a
plain Python list, so model.parameters() never sees them: they stay at their random initial weights,
are not moved by .to(device) and are missing from the state_dict."""

from torch import nn

from examples._realdata import digits, loaders

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["unregistered-parameters"]}


class DeepMLP(nn.Module):
    def __init__(self, width=64, depth=3):
        super().__init__()
        self.inp = nn.Linear(64, width)
        self.hidden = [nn.Linear(width, width) for _ in range(depth)]   # should be nn.ModuleList
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        x = self.inp(x).relu()
        for layer in self.hidden:
            x = layer(x).relu()
        return self.out(x)


def build_model():
    return DeepMLP()


def build_data():
    return loaders(*digits())


loss_fn = nn.CrossEntropyLoss()
