"""record/calls.py: the model calls of a step kept for re-executing it, without a module hook on the class's
path, and nothing of the keeper left in the model (its class forward restored, its instance hooks inert in a copy)."""

from __future__ import annotations

import copy
import io

import torch
from torch import nn

from nnwizard.record.calls import CallKeeper, compiled_inner


class _Owner:
    max_per_step = 3

    def __init__(self):
        self.step_calls = {"calls": [], "rng": None}


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x, scale=1.0):
        return self.lin(x) * scale


def test_a_kept_models_calls_and_the_steps_rng_state_are_kept_and_the_class_restored():
    owner, model, other = _Owner(), _Net(), _Net()
    keeper = CallKeeper(owner)
    original = _Net.forward
    x = torch.randn(5, 4)
    keeper.keep(model, (x,))          # (its first call, about to run: as the recorder's on_forward sees it)
    model(x)
    model(x, scale=2.0)
    other(x)                          # another instance of the class: not kept
    with torch.no_grad():
        model(x)                      # no grad: not kept
    calls = owner.step_calls["calls"]
    assert [c["module"] for c in calls] == [model, model] and calls[1]["kwargs"] == {"scale": 2.0}
    assert all(torch.equal(c["out"], model(x, **c["kwargs"])) for c in calls)
    assert owner.step_calls["rng"] is not None
    for _ in range(4):
        model(x)
    assert len(calls) == owner.max_per_step   # bounded per step
    keeper.close()
    assert _Net.__dict__["forward"] is original


def test_an_instance_forward_gets_hooks_that_a_copy_or_pickle_drops():
    owner, model = _Owner(), _Net()
    model.forward = model.forward     # an instance-level forward: the class's is not called
    keeper = CallKeeper(owner)
    keeper.keep(model, (torch.randn(2, 4),))
    model(torch.randn(2, 4))
    assert len(owner.step_calls["calls"]) == 1
    twin = copy.deepcopy(model)
    owner.step_calls = {"calls": [], "rng": None}
    twin(torch.randn(2, 4))
    assert owner.step_calls["calls"] == []   # the copy's hooks do nothing
    buffer = io.BytesIO()
    removed = keeper.unhook([model])
    torch.save(model, buffer)
    keeper.rehook(removed)
    assert removed == [model] and keeper.keeps(model)
    keeper.close()
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_compiled_inner_unwraps_only_torch_compile():
    net = _Net()
    assert compiled_inner(net) is net
    assert compiled_inner(torch.compile(net)) is net
