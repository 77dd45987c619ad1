"""record/models.py: what a top-level module call is, and where train/eval mode matters in a model."""

from __future__ import annotations

import sys

import torch
from torch import nn

from nnwizard.record.models import library_class, mode_layers, not_a_model, owner, reads_training


class _Noisy(nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x) if self.training else x


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.act = nn.Linear(3, 3), nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x))


def test_mode_layers_and_forwards_that_read_training():
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.0), nn.Dropout(0.3), nn.BatchNorm1d(3), _Noisy())
    assert mode_layers(model) == 2   # (a p=0 dropout does nothing)
    assert reads_training(model) == ["_Noisy.forward"] and reads_training(nn.Linear(2, 2)) == []


def test_a_parameterless_library_module_is_no_model_unless_a_models_own_method_calls_it():
    here = sys._getframe(0)
    assert library_class(nn.Flatten) and not library_class(_Noisy)
    assert not_a_model(nn.Flatten(), here)          # a transform called by the loop
    assert not not_a_model(_Noisy(), here)          # the user's own class stays a model
    layer = _Layer()
    seen = []
    layer.act.register_forward_pre_hook(lambda m, a: seen.append((owner(m, sys._getframe(1)), not_a_model(m, sys._getframe(1)))))
    layer(torch.randn(2, 3))                        # (ReLU called by _Layer.forward: owned by that layer)
    assert seen == [(layer, False)]
