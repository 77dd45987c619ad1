"""The full recorder's cheap paths (script-mode diagnosis observes with it): module calls through a
patched ``nn.Module.__call__`` instead of the global hooks, the backward that knows its forward and
loss call without a graph search, and the gradient norm / parameter change sampled after the first
steps."""

from __future__ import annotations

import copy
import io
import math

import torch
from torch import nn

from nnwizard.record import full as recorder_mod
from nnwizard.record import graph as graph_mod
from nnwizard.record import reach as reach_mod
from nnwizard.record import Recorder, StopRun
from nnwizard.record.full import FULL_DETAIL, FULL_EVERY


def _mlp():
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Dropout(0.1), nn.Linear(12, 3))


def _step(model, opt, crit, n=1):
    for _ in range(n):
        loss = crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_full_mode_sees_every_top_level_call_without_global_hooks_and_leaves_models_picklable():
    torch.manual_seed(0)
    model, late = _mlp(), nn.Linear(6, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = nn.CrossEntropyLoss()
    original_call = nn.Module.__call__
    with Recorder("full") as rec:
        assert not torch.nn.modules.module._global_forward_hooks and not torch.nn.modules.module._global_forward_pre_hooks
        assert not model._forward_hooks and not model[0]._forward_pre_hooks
        _step(model, opt, crit, 30)
        model.eval()
        with torch.no_grad():
            late(torch.randn(4, 6))   # a model first run after 30 steps is still seen
            model(torch.randn(4, 6))
        buffer = io.BytesIO()
        torch.save(model, buffer)     # no hook of ours on the instance: it pickles and copies as usual
        twin = copy.deepcopy(model)
        twin(torch.randn(2, 6))
    assert nn.Module.__call__ is original_call
    r = rec.recording
    assert [m.name for m in r.models][:2] == ["Sequential", "Linear"] and r.models[0].forwards == 31
    assert r.models[1].forwards == 1 and r.models[1].first_step == 30
    trained = [f for f in r.forwards if f.trained]
    assert len(trained) == 30 and all(f.training and f.grad_enabled for f in trained)
    assert [(f.model, f.training, f.grad_enabled, f.trained) for f in r.forwards[30:32]] == [(1, True, False, False), (0, False, False, False)]
    assert sum(not c.eval for c in r.loss_calls) == 30


def test_backward_marks_only_what_it_reaches_with_and_without_the_graph_search():
    """One pending forward and loss call whose value is backpropagated: found without a search; an
    evaluation forward in between, or a loss scaled before backward: the graph is searched; both
    mark the same forwards and loss calls as trained."""
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = nn.CrossEntropyLoss()
    with Recorder("full") as rec:
        _step(model, opt, crit, 2)                    # the direct case
        out = model(torch.randn(8, 6))
        with torch.no_grad():
            crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))   # evaluation between forward and backward
        loss = crit(out, torch.randint(0, 3, (8,))) * 0.5               # not the loss call's own value
        opt.zero_grad()
        loss.backward()
        opt.step()
    r = rec.recording
    assert [f.trained for f in r.forwards] == [True, True, True, False]
    assert [c.eval for c in r.loss_calls] == [False, False, True, False]
    assert [s.forwards for s in r.steps] == [{0: 1}, {0: 1}, {0: 1}]



def test_a_loss_one_op_from_its_call_is_linked_without_a_search_and_two_forwards_still_searched(monkeypatch):
    """``loss_fn(...) / k`` (accumulation, per-sample loops) is one op from the loss call's node, whose own value
    is gone: linked without a graph search, marking the same forward and call as a search would; an evaluation
    forward run without grad before it does not send it to the search either. Two pending forwards with a graph
    (a second model's output added) still go through the search."""
    searched = []
    real = reach_mod.reached
    counting = lambda *a, **k: searched.append(1) or real(*a, **k)   # noqa: E731 - every graph search, wherever made
    monkeypatch.setattr(reach_mod, "reached", counting)
    monkeypatch.setattr(recorder_mod, "reached", counting)
    torch.manual_seed(0)
    model, other = _mlp(), nn.Linear(6, 3)
    opt = torch.optim.SGD([*model.parameters(), *other.parameters()], lr=0.01)
    crit = nn.CrossEntropyLoss()
    with Recorder("full") as rec:
        for i in range(12):
            if i == recorder_mod.SPAN_CHECKS + 1:
                searched.clear()   # (the first steps also search for a graph carried over from the step before)
            if i == 8:
                with torch.no_grad():   # an evaluation forward, never reached: the next backward needs no search
                    model(torch.randn(4, 6)).argmax(1)
            loss = crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,))) / 4
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert searched == []
        loss = crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,))) / 4 + other(torch.randn(8, 6)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert len(searched) == 1
    r = rec.recording
    assert [f.trained for f in r.forwards] == [True] * 8 + [False] + [True] * 6
    assert all(not c.eval for c in r.loss_calls) and len(r.loss_calls) == 13
    assert [s.forwards for s in r.steps][-2:] == [{0: 1}, {0: 1, 1: 1}]

def _nan_step(model, opt, crit) -> None:
    """One more training step on a batch with a NaN input."""
    x = torch.randn(8, 6)
    x[0, 0] = math.nan
    loss = crit(model(x), torch.randint(0, 3, (8,)))
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_gradient_norm_and_update_are_measured_on_the_first_steps_then_sampled_and_on_a_nan():
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = nn.CrossEntropyLoss()
    n = FULL_DETAIL + 3 * FULL_EVERY + 1
    with Recorder("full") as rec:
        _step(model, opt, crit, n)
        _nan_step(model, opt, crit)
    steps = rec.recording.steps
    measured = [s.step for s in steps if s.grad_norm is not None]
    assert measured[:FULL_DETAIL] == list(range(1, FULL_DETAIL + 1))
    assert [k for k in measured if FULL_DETAIL < k <= n] == [k for k in range(FULL_DETAIL + 1, n + 1) if k % FULL_EVERY == 0]
    assert steps[-1].step in measured and steps[-1].grads_nonfinite and steps[-1].nonfinite_input  # the NaN step
    assert [s.step for s in steps if s.update is not None] == [k for k in measured if k <= recorder_mod.UPDATE_STEPS]
    assert all(s.update > 0 for s in steps[:FULL_DETAIL])
    between = [s for s in steps if s.grad_norm is None]   # detail only on the measured steps, the signals on every step
    assert between and all(s.grads_total == s.grads_none == 0 and not s.nonfinite_input for s in between)
    assert all(s.grads_total == 4 and s.grads_none == 0 for s in steps if s.grad_norm is not None)
    assert all(s.zero_grad and s.carried == 0.0 and s.lrs == [0.01] and math.isfinite(s.loss) for s in between)


def test_a_large_optimizer_is_measured_on_fewer_first_steps_and_more_sparsely_and_still_on_a_nan():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    big = nn.Parameter(torch.zeros(recorder_mod.FULL_LARGE + 1))   # (values only: the norm's cost, not the model's)
    opt = torch.optim.SGD([*model.parameters(), big], lr=0.01)
    crit = nn.CrossEntropyLoss()
    first, every = recorder_mod.FULL_DETAIL_LARGE, recorder_mod.FULL_EVERY_LARGE
    n = max(FULL_DETAIL, first) + 2 * every
    with Recorder("full") as rec:
        _step(model, opt, crit, n)
        _nan_step(model, opt, crit)
    steps = rec.recording.steps
    measured = [s.step for s in steps if s.grad_norm is not None]
    assert measured[:-1] == [k for k in range(1, n + 1) if k <= first or k % every == 0]
    assert measured[-1] == n + 1 and steps[-1].grads_nonfinite and steps[-1].nonfinite_input   # the NaN step
    assert [s.step for s in steps if s.update is not None] == [k for k in measured if k <= recorder_mod.UPDATE_STEPS]


def test_the_last_steps_of_the_budget_are_measured():
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder("full", max_steps=FULL_DETAIL + 7) as rec:
        try:
            _step(model, opt, nn.CrossEntropyLoss(), 100)
        except StopRun:
            pass
    assert [s.grad_norm is not None for s in rec.recording.steps[-3:]] == [True, True, True]


class _Masked(nn.Module):
    """Replaces NaN inputs before its layers: the loss stays finite whatever the input holds."""

    def __init__(self):
        super().__init__()
        self.net = _mlp()

    def forward(self, x):
        return self.net(torch.nan_to_num(x))


def test_a_nan_input_is_flagged_at_a_measured_step_even_when_the_loss_stays_finite():
    torch.manual_seed(0)
    measured = FULL_DETAIL + FULL_EVERY - FULL_DETAIL % FULL_EVERY   # the first sampled step after the first ones
    for bad in (None, measured - 1):   # healthy, then NaN in the input of a measured step's forward
        model = _Masked()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        crit = nn.CrossEntropyLoss()
        with Recorder("full") as rec:
            for k in range(FULL_DETAIL + 2 * FULL_EVERY):
                x = torch.randn(8, 6)
                if k == bad:
                    x[1, 2] = math.nan
                loss = crit(model(x), torch.randint(0, 3, (8,)))
                opt.zero_grad()
                loss.backward()
                opt.step()
        steps = rec.recording.steps
        assert all(math.isfinite(s.loss) for s in steps)
        assert [s.step for s in steps if s.nonfinite_input] == ([] if bad is None else [bad + 1])


def test_carried_gradients_are_seen_with_and_without_zero_grad_and_per_optimizer():
    torch.manual_seed(0)
    crit = nn.CrossEntropyLoss()
    for clear in ("none", "optimizer", "zeros", "model"):
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with Recorder("full") as rec:
            for _ in range(4):
                if clear == "optimizer":
                    opt.zero_grad()
                elif clear == "zeros":
                    opt.zero_grad(set_to_none=False)
                elif clear == "model":
                    model.zero_grad()
                crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,))).backward()
                opt.step()
        carried = [s.carried for s in rec.recording.steps[1:]]
        assert carried == ([1.0] * 3 if clear == "none" else [0.0] * 3), clear
    # two optimizers, only the first clears its own: the second's share stays 1
    enc, head = nn.Linear(6, 12), nn.Linear(12, 3)
    o1, o2 = torch.optim.SGD(enc.parameters(), lr=0.01), torch.optim.SGD(head.parameters(), lr=0.01)
    with Recorder("full") as rec:
        for _ in range(3):
            o1.zero_grad()
            crit(head(torch.relu(enc(torch.randn(8, 6)))), torch.randint(0, 3, (8,))).backward()
            o1.step()
            o2.step()
    steps = rec.recording.steps
    assert [s.carried for s in steps[2:] if s.optimizer == 0] == [0.0, 0.0]
    assert [s.carried for s in steps[2:] if s.optimizer == 1] == [1.0, 1.0]


class _FocalLoss(nn.modules.loss._Loss):
    """A loss module of the user's own (outside torch): its loss call is placed in its forward."""

    def forward(self, x, y):
        return nn.functional.cross_entropy(x, y)   # (the user's line)


def _loss_of(crit, out, y):
    return crit(out, y)   # (the line that calls the loss module)


def test_a_loss_call_is_placed_at_the_users_line_through_torchs_loss_module_or_the_users_own():
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for crit, place in ((nn.CrossEntropyLoss(), "_loss_of"), (_FocalLoss(), "forward")):
        with Recorder("full", files=[__file__]) as rec:
            for _ in range(3):
                loss = _loss_of(crit, model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
                opt.zero_grad()
                loss.backward()
                opt.step()
        wheres = [c.where for c in rec.recording.loss_calls]
        assert len(wheres) == 3 and all(w.startswith("test_record_full.py:") and w.endswith(f" in {place}")
                                        for w in wheres), wheres


def _mode_on(rec) -> bool:
    from torch.overrides import _get_current_function_mode_stack
    return any(m is rec.policy.graph for m in _get_current_function_mode_stack())


def test_the_graph_mode_watches_the_first_steps_then_two_in_every_eight_and_an_evaluation_after_any_step():
    """Off the stack on the steps between its windows (the ops there cost no Python call), back for two
    consecutive steps in every MODE_EVERY (a graph kept from one step into the next still shows) and
    from an evaluation forward on (its argmax marks it scored); off again after the next step."""
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = nn.CrossEntropyLoss()
    on = []
    with Recorder("full") as rec:
        for _ in range(40):
            on.append(_mode_on(rec))   # before the step numbered len(on)
            _step(model, opt, crit)
        model.eval()
        with torch.no_grad():
            assert not _mode_on(rec)   # (step 41: off)
            model(torch.randn(4, 6)).argmax(1)
            assert _mode_on(rec)
        model.train()
        _step(model, opt, crit)        # step 41 ends: 42 is not in a window
        assert not _mode_on(rec)
        running = 0.0
        for _ in range(8):             # steps 42-49: the window at 47, 48 sees the kept graph
            loss = crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            running = running + loss
    assert not _mode_on(rec)
    due = [n <= graph_mod.MODE_FIRST or n % graph_mod.MODE_EVERY in (0, graph_mod.MODE_EVERY - 1)
           for n in range(1, 41)]
    assert on == due and on[:8] == [True] * 8 and on[8:16] == [False] * 6 + [True] * 2
    r = rec.recording
    assert r.forwards[40].scored and not r.forwards[40].training
    assert r.graph_kept   # seen inside a window, though the mode was off at the steps before


def test_the_graph_mode_stays_on_for_a_hand_written_update_and_leaves_a_scripts_own_mode_in_place():
    """A hand-written update is followed at every step (an lr intervention scales it each time); a mode the
    script entered above ours keeps its place while ours comes and goes, and ours leaves at the end."""
    from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

    class Theirs(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model[3].parameters(), lr=0.01)   # the first layer is updated by hand
    crit = nn.CrossEntropyLoss()
    with Recorder("full") as rec:
        for _ in range(30):
            loss = crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
            opt.zero_grad()
            model[0].zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model[0].parameters():
                    p -= 0.01 * p.grad
            opt.step()
            assert _mode_on(rec)
        assert rec.recording.total_steps >= 30
    assert rec.recording.manual_updated
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = nn.CrossEntropyLoss()
    theirs = Theirs()
    with Recorder("full") as rec:
        _step(model, opt, crit, 3)
        with theirs:              # entered above ours: ours stays under it, on
            _step(model, opt, crit, 20)
            assert _get_current_function_mode_stack() == [rec.policy.graph, theirs]
        _step(model, opt, crit, 10)   # step 34: off
        assert _get_current_function_mode_stack() == []
        with theirs:              # entered while ours is off: ours stays out until it leaves
            _step(model, opt, crit, 20)
            assert _get_current_function_mode_stack() == [theirs]
        _step(model, opt, crit, 12)   # steps 54-65: back on in the window at 55, 56
        assert _get_current_function_mode_stack() == []
        _step(model, opt, crit, 6)    # before step 72
        assert _get_current_function_mode_stack() == [rec.policy.graph]
    assert _get_current_function_mode_stack() == []
    assert rec.recording.total_steps == 71


class _Tracked(nn.Module):
    """An MLP that keeps a weak reference to a tensor its graph saves for the backward (the hidden layer's
    output, saved by the last Linear): alive exactly as long as something holds that forward's graph."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Dropout(0.1)), nn.Linear(12, 3)
        self.saved = []

    def forward(self, x):
        h = self.body(x)
        self.saved.append(__import__("weakref").ref(h))
        return self.head(h)


def _evaluate_without_no_grad(model, batches=5):
    model.eval()
    for _ in range(batches):   # (no torch.no_grad(): each batch builds a graph that no backward reaches)
        out = model(torch.randn(8, 6))
        nn.functional.cross_entropy(out, torch.randint(0, 3, (8,))).item()


def test_an_evaluation_without_no_grad_leaves_its_graphs_to_the_script_and_still_reads_as_one():
    """An evaluation that forgot torch.no_grad() builds a graph per batch that the script drops at once. The
    recorder held each one (waiting for a backward to reach it) up to 64 forwards: a graph-attention model's
    diagnosis ran out of memory. Now at most the newest evaluation graph stays held, until the next backward."""
    torch.manual_seed(0)
    model = _Tracked()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    held = []
    with Recorder("full") as rec:
        for _ in range(4):
            model.train()
            loss = nn.functional.cross_entropy(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            model.saved.clear()
            _evaluate_without_no_grad(model)
            held.append(sum(r() is not None for r in model.saved))
    assert held == [1, 1, 1, 1], held   # (was 5, 5, 5, 5: every batch's graph)
    forwards = rec.recording.forwards
    evaluation = [f for f in forwards if not f.training]
    assert len(evaluation) == 20 and all(f.grad_enabled and not f.trained for f in evaluation)
    assert sum(f.trained for f in forwards if f.training) == 4
    evals = [c for c in rec.recording.loss_calls if c.training is False]
    assert len(evals) == 20 and all(c.eval for c in evals)


def test_samples_run_one_by_one_in_eval_mode_and_backpropagated_together_still_all_trained():
    """The other side: a model left in eval mode that runs a batch one sample at a time and backpropagates the
    summed loss. Its older forwards drop their nodes as the newer ones come (see above); the backward that reaches
    the newest still counts every one of them as trained (it absorbed them), and their loss calls as training ones."""
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder("full") as rec:
        model.eval()   # (the fault: never model.train())
        for _ in range(3):
            opt.zero_grad()
            total = sum(nn.functional.cross_entropy(model(torch.randn(1, 6)), torch.randint(0, 3, (1,))) for _ in range(5))
            total.backward()
            opt.step()
    forwards = rec.recording.forwards
    assert len(forwards) == 15 and all(f.trained and not f.training for f in forwards)
    assert [sum(s.forwards.values()) for s in rec.recording.steps] == [5, 5, 5]
    assert len(rec.recording.loss_calls) == 15 and not any(c.eval for c in rec.recording.loss_calls)


def _loader(n=6):
    data = torch.utils.data.TensorDataset(torch.randn(8 * n, 6), torch.randint(0, 3, (8 * n,)))
    return torch.utils.data.DataLoader(data, batch_size=8)


def test_an_evaluation_pass_in_training_mode_without_no_grad_keeps_one_graph_and_accumulation_still_trains():
    """Both model.eval() and torch.no_grad() forgotten: an evaluation pass over a DataLoader builds a training-mode
    graph per batch. A forward on the next batch of the same loader lets go of the last one's graph; the other
    side: losses summed over three batches of a loader and backpropagated once still train all three forwards."""
    torch.manual_seed(0)
    model = _Tracked()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train, test = _loader(), _loader()
    held = []
    with Recorder("full") as rec:
        for _ in range(2):
            total = 0
            for i, (x, y) in enumerate(train):   # losses of 3 batches, one backward
                total = total + nn.functional.cross_entropy(model(x), y)
                if i % 3 == 2:
                    opt.zero_grad()
                    total.backward()
                    opt.step()
                    total = 0
            model.saved.clear()
            for x, y in test:   # the evaluation: training mode, gradients on
                nn.functional.cross_entropy(model(x), y).item()
            held.append(sum(r() is not None for r in model.saved))
    assert held == [1, 1], held   # (was 6, 6)
    forwards = rec.recording.forwards
    trained = [f for f in forwards if f.loader == 0]
    evaluation = [f for f in forwards if f.loader == 1]
    assert len(trained) == 12 and all(f.trained for f in trained)
    assert len(evaluation) == 12 and not any(f.trained for f in evaluation)
    assert [sum(s.forwards.values()) for s in rec.recording.steps] == [3, 3, 3, 3]
    calls = rec.recording.loss_calls
    assert sum(not c.eval for c in calls) == 12 and sum(c.eval for c in calls) == 12
