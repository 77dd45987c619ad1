"""record/listeners.py: the listener protocol. Every event reaches every listener once, in both policies; a
listener's error is counted and never breaks the run; StopRun ends it; the inline listener's per-call work is done
by the light hooks themselves."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nnwizard.record import EVENTS, Recorder, StopRun
from nnwizard.record.listeners import Listeners
from nnwizard.record.records import Recording


class Counting:
    def __init__(self):
        self.seen: dict[str, int] = dict.fromkeys(EVENTS, 0)

    def __getattr__(self, name):
        if name not in EVENTS:
            raise AttributeError(name)
        return lambda rec, *args: self.seen.__setitem__(name, self.seen[name] + 1)


def _loop(steps: int = 4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    loader = DataLoader(TensorDataset(torch.randn(4 * steps, 4), torch.randint(0, 2, (4 * steps,))), batch_size=4)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


@pytest.mark.parametrize("mode", ["full", "light"])
def test_every_event_reaches_a_listener_once_per_occurrence(mode):
    listener = Counting()
    with Recorder(mode, listeners=[listener]) as rec:
        _loop(4)
    assert rec.recording.listener_errors == 0
    expected = {"on_batch": 4, "on_loss": 4, "on_loss_args": 4, "on_backward": 4, "on_step_pre": 4, "on_step_post": 4,
                "on_scheduler": 4, "on_forward": 4}
    if mode == "light":
        expected["on_forward"] = 1   # the global module hooks come off once the optimizer's model is known
    assert listener.seen == expected


def test_a_failing_listener_is_counted_and_stop_run_ends_the_run():
    class Broken:
        def on_step_post(self, rec, optimizer, step):
            raise ValueError("listener bug")

    class Stopper:
        def on_step_post(self, rec, optimizer, step):
            if step.step == 2:
                raise StopRun("enough")

    with Recorder("full", listeners=[Broken(), Stopper()]) as rec:
        with pytest.raises(StopRun):
            _loop(4)
    assert rec.recording.total_steps == 2 and rec.recording.listener_errors == 2


def test_combined_calls_each_listener_and_leaves_out_the_inline_ones_work():
    calls = []

    class A:
        def on_backward(self, rec, loss):
            calls.append("a")

    class B:
        def on_backward(self, rec, loss):
            raise RuntimeError("b fails")

    recording = Recording()
    a, b = A(), B()
    assert Listeners([], recording).combined("on_backward") is None
    assert Listeners([a], recording).combined("on_backward") == a.on_backward   # one listener: called directly
    both = Listeners([a, b], recording).combined("on_backward")
    both(None, None)
    assert calls == ["a"] and recording.listener_errors == 1
    assert Listeners([a, b], recording, inline=a).combined("on_backward") == b.on_backward
    assert Listeners([a], recording, inline=a).combined("on_step_pre") is None


def test_the_inline_listener_gets_the_steps_loss_calls_and_backwards_appended():
    class Inline:
        max_per_step = 8

        def __init__(self):
            self.step_calls = {"losses": [], "targets": [], "backward": []}
            self.kept = []
            self.args_calls = 0

        def on_loss_args(self, rec, call, args, kwargs, value):   # (full mode calls it; light mode does its work inline)
            self.args_calls += 1

        def on_backward(self, rec, loss):   # where the hooks do not do it themselves (see listeners.py)
            losses = self.step_calls["losses"]
            self.step_calls["backward"].append({"kind": "loss-call", "loss": len(losses) - 1, "scale": 1.0}
                                               if losses and loss is losses[-1][3] else "related")

        def on_step_post(self, rec, optimizer, step):
            self.kept.append(self.step_calls)
            self.step_calls = {"losses": [], "targets": [], "backward": []}

    inline = Inline()
    with Recorder("light", listeners=[inline], inline=inline):
        _loop(3)
    assert inline.args_calls == 0 and len(inline.kept) == 3
    for step in inline.kept:
        assert [fn for fn, *_ in step["losses"]] == ["cross_entropy"] and len(step["targets"]) == 1
        assert step["backward"] == [{"kind": "loss-call", "loss": 0, "scale": 1.0}]
