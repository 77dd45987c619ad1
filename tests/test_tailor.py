"""The fix in the program's own terms (wizard/tailor.py): the optimizer, the line that built it, the rate the
reruns measured better, the evaluation's line; nothing where the run does not tell it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from nnwizard.probes.api import ProbeResult
from nnwizard.ranking import Ranked
from nnwizard.record import LossCall, OptimizerInfo
from nnwizard.session import Options, diagnose
from nnwizard.tailor import tailor


def _call(where, *, eval_, grad, training):
    call = LossCall(fn="cross_entropy", input_shape=[8, 3], input_dtype="float32", target_shape=[8], target_dtype="int64",
                    value=1.0, reduction="mean", grad_enabled=grad, training=training, step=0, where=where, from_model=True,
                    model_output_shape=[8, 3])
    call.eval = eval_
    return call


def _diagnosis(hid, results=(), optimizers=(), calls=()):
    rec = SimpleNamespace(optimizers=list(optimizers), loss_calls=list(calls))
    ranked = [Ranked(hid, "t", "loop", 0.8)]
    return SimpleNamespace(results=list(results), target=SimpleNamespace(recording=rec), ranked=ranked)


def _sgd(lrs=(0.1,), where="train.py:40 in main"):
    return OptimizerInfo(0, "SGD", None, [{"lr": lr, "params": []} for lr in lrs], where=where)


def _sweep(outcome, lr=0.1, best=0.01, status="failed"):
    return ProbeResult(status, outcome, "s", {"lr": lr, "best_lr": best}, id="script-lr-sweep")


def test_a_rate_the_sweep_measured_names_the_optimizer_its_line_and_the_better_rate():
    d = _diagnosis("lr-too-high", [_sweep("too-high")], [_sgd()])
    tailor(d)
    text = d.ranked[0].fix_here
    assert "`SGD` (built at train.py:40 in main) runs at lr 0.1" in text and "`lr=0.01`" in text and "x0.1" in text
    low = _diagnosis("lr-too-low", [_sweep("too-low", lr=1e-4, best=1e-2)], [_sgd((1e-4,))])
    tailor(low)
    assert "`lr=0.01`" in low.ranked[0].fix_here and "x100" in low.ranked[0].fix_here


def test_without_a_measured_rate_it_says_so_and_without_an_optimizer_or_sweep_nothing():
    d = _diagnosis("lr-too-high", [_sweep("ok", status="passed")], [_sgd()])   # the sweep concluded nothing
    tailor(d)
    assert "measured" not in d.ranked[0].fix_here and "then diagnose again" in d.ranked[0].fix_here
    groups = _diagnosis("lr-too-high", [_sweep("too-high")], [_sgd((0.1, 0.01))])
    tailor(groups)
    assert "scale each group's rate by 0.1" in groups.ranked[0].fix_here
    bare = _diagnosis("lr-too-high")
    tailor(bare)
    assert bare.ranked[0].fix_here == ""


def test_evaluation_fixes_name_the_evaluation_line_only_when_the_recording_has_one():
    calls = [_call("train.py:20 in train", eval_=False, grad=True, training=True),
             _call("train.py:31 in test", eval_=True, grad=True, training=True)]
    for hid, needle in (("no-grad-missing", "torch.no_grad()"), ("eval-mode-missing", "model.eval()")):
        d = _diagnosis(hid, calls=calls)
        tailor(d)
        assert "train.py:31 in test" in d.ranked[0].fix_here and needle in d.ranked[0].fix_here, d.ranked[0].fix_here
    clean = [calls[0], _call("train.py:31 in test", eval_=True, grad=False, training=False)]
    for hid in ("no-grad-missing", "eval-mode-missing", "train-mode-missing"):
        d = _diagnosis(hid, calls=clean)
        tailor(d)
        assert d.ranked[0].fix_here == "", (hid, d.ranked[0].fix_here)


def test_a_diagnosed_script_gets_its_own_lines(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text('''
import torch
from torch import nn

torch.manual_seed(0)
X, Y = torch.randn(256, 8), torch.randint(0, 2, (256,))
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(20):
    for i in range(0, 256, 32):
        loss = nn.functional.cross_entropy(model(X[i:i + 32]), Y[i:i + 32])
        loss.backward()          # the fault: no opt.zero_grad()
        opt.step()
''')
    d = diagnose(Options(script=str(script), symptoms=["auto"], device="cpu"))
    top = d.ranked[0]
    assert top.id == "missing-zero-grad", [h.id for h in d.ranked]
    assert top.fix_here == ("call `zero_grad()` on `SGD` (built at train.py:8 in <module>) before the backward of the "
                            "loss computed at train.py:11 in <module>."), top.fix_here


def test_loop_fixes_name_the_optimizer_and_the_training_loss_and_stay_silent_without_them():
    train = _call("train.py:20 in train", eval_=False, grad=True, training=True)
    stepped, idle = _sgd(), OptimizerInfo(1, "Adam", None, [{"lr": 1e-3, "params": []}], where="train.py:12 in main")
    stepped.steps = 5
    d = _diagnosis("missing-optimizer-step", optimizers=[stepped, idle], calls=[train])
    tailor(d)
    assert d.ranked[0].fix_here.startswith("`Adam` (built at train.py:12 in main) is never stepped") \
        and "train.py:20 in train" in d.ranked[0].fix_here
    idle.steps = 5
    d = _diagnosis("missing-optimizer-step", optimizers=[stepped, idle], calls=[train])
    tailor(d)
    assert d.ranked[0].fix_here == ""

    missing = ProbeResult("failed", "missing", "s", {"missing_modules": "encoder.0, encoder.2"}, id="trace-optimizer")
    d = _diagnosis("optimizer-missing-params", [missing], [_sgd()])
    tailor(d)
    assert "`SGD` (built at train.py:40 in main) does not hold encoder.0, encoder.2" in d.ranked[0].fix_here
    d = _diagnosis("optimizer-missing-params", [ProbeResult("passed", "ok", "s", {}, id="trace-optimizer")], [_sgd()])
    tailor(d)
    assert d.ranked[0].fix_here == ""

    d = _diagnosis("double-softmax", calls=[train])
    tailor(d)
    assert "`cross_entropy` at train.py:20 in train" in d.ranked[0].fix_here
    d = _diagnosis("zero-grad-misplaced", optimizers=[_sgd()], calls=[train])
    tailor(d)
    assert "`zero_grad()` on `SGD`" in d.ranked[0].fix_here and "train.py:20 in train, then `step()`" in d.ranked[0].fix_here
    for hid in ("double-softmax", "zero-grad-misplaced"):   # no training loss call recorded: nothing to point at
        d = _diagnosis(hid, optimizers=[_sgd()], calls=[_call("t.py:3 in test", eval_=True, grad=False, training=False)])
        tailor(d)
        assert d.ranked[0].fix_here == "", hid


def test_scheduler_graph_and_clipping_fixes_name_the_recorded_line_and_nothing_without_it():
    from nnwizard.record import ClipCall

    per_batch = ProbeResult("failed", "per-step-for-per-epoch", "s", {}, id="trace-scheduler")
    d = _diagnosis("scheduler-misplaced", [per_batch])
    d.target.recording.schedulers = [{"name": "StepLR", "where": "train.py:44 in main", "steps": 60}]
    tailor(d)
    assert "`StepLR` is stepped after every batch (at train.py:44 in main)" in d.ranked[0].fix_here
    d = _diagnosis("scheduler-misplaced", [ProbeResult("passed", "ok", "s", {}, id="trace-scheduler")])
    d.target.recording.schedulers = [{"name": "StepLR", "where": "train.py:44 in main", "steps": 60}]
    tailor(d)
    assert d.ranked[0].fix_here == ""

    d = _diagnosis("graph-retained")
    d.target.recording.graph_kept = ["train.py:33 in <module>"]
    tailor(d)
    assert "train.py:33 in <module>" in d.ranked[0].fix_here and "loss.item()" in d.ranked[0].fix_here
    d.target.recording.graph_kept = []
    tailor(d)
    assert d.ranked[0].fix_here == ""

    d = _diagnosis("clip-misplaced")
    d.target.recording.clips = [ClipCall("clip_grad_norm_", "train.py:45 in fit", 3, False, 1.0, 2.0)]
    tailor(d)
    assert d.ranked[0].fix_here.startswith("`clip_grad_norm_` at train.py:45 in fit runs where no fresh gradient")
    d.target.recording.clips = [ClipCall("clip_grad_norm_", "train.py:45 in fit", 3, True, 1.0, 2.0)]   # in place
    tailor(d)
    assert d.ranked[0].fix_here == ""


def test_a_target_not_detached_names_the_loss_line_the_audit_measured_and_nothing_without_it():
    found = ProbeResult("failed", "target-carries-grad", "s", {"fn": "smooth_l1_loss", "where": "dqn.py:190 in optimize_model"},
                        id="trace-loss-target")
    d = _diagnosis("target-not-detached", [found])
    tailor(d)
    assert "`smooth_l1_loss` at dqn.py:190 in optimize_model" in d.ranked[0].fix_here and "no_grad" in d.ranked[0].fix_here
    quiet = _diagnosis("target-not-detached", [ProbeResult("passed", "ok", "s", {"where": "dqn.py:190"}, id="trace-loss-target")])
    tailor(quiet)
    assert quiet.ranked[0].fix_here == ""


def test_a_teacher_run_with_grad_names_the_training_after_its_optimizer_stopped():
    teacher, student = (SimpleNamespace(name=n, index=i) for i, n in enumerate(("DeepNN", "LightNN")))
    opts = [SimpleNamespace(index=0, models=[0], steps=3), SimpleNamespace(index=1, models=[1], steps=3)]
    steps = [SimpleNamespace(optimizer=o) for o in (0, 0, 0, 1, 1, 1)]
    calls = [_call("kd.py:20 in train", eval_=False, grad=True, training=True) for _ in range(3)] + \
        [_call("kd.py:60 in distill", eval_=False, grad=True, training=True) for _ in range(3)]
    for k, c in enumerate(calls):
        c.step = k
    fixed = ProbeResult("failed", "grad-into-fixed-model", "s", {"models": [0]}, id="trace-eval-grad")
    d = _diagnosis("no-grad-missing", [fixed], calls=calls)
    d.target.recording.models, d.target.recording.optimizers, d.target.recording.steps = [teacher, student], opts, steps
    tailor(d)
    assert "DeepNN's forward" in d.ranked[0].fix_here and "kd.py:60 in distill" in d.ranked[0].fix_here
    assert "kd.py:20" not in d.ranked[0].fix_here


def test_a_script_without_an_optimizer_is_not_told_about_build_optimizer():
    """A hand-written update (the char-RNN tutorial's p.data.add_): the rate the sweep measured, in its own words."""
    d = _diagnosis("lr-too-low", [_sweep("too-low", lr=0.005, best=0.05)])
    tailor(d)
    assert "hand-written update runs at lr 0.005" in d.ranked[0].fix_here and "build_optimizer" not in d.ranked[0].fix_here
    module = SimpleNamespace(results=[_sweep("too-low", lr=0.005, best=0.05)], target=SimpleNamespace(),
                             ranked=[Ranked("lr-too-low", "t", "loop", 0.8)])
    tailor(module)
    assert "build_optimizer" in module.ranked[0].fix_here
