"""Script mode: the recorder, the runner (bounds, exits, sandbox) and each trace audit in both
directions, on tiny scripts written into tmp_path."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

from nnwizard.errors import UsageError
from nnwizard.probes.api import ProbeContext, get
from nnwizard.record import Recorder
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

BASE = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
X = torch.randn(256, 8)
Y = (X[:, 0] > 0).long()
loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
crit = nn.CrossEntropyLoss()


def evaluate():
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += crit(model(x), y).item()
    model.train()
    return total / len(loader)


def main():
    for epoch in range(3):
        model.train()
        running = 0.0
        for x, y in loader:
            opt.zero_grad()
            out = model(x)
            loss = crit(out, y)
            loss.backward()
            opt.step()
            running += loss.item()
        print(f"epoch {epoch} train {running / len(loader):.4f} val {evaluate():.4f}")


if __name__ == "__main__":
    main()
'''


def write(tmp_path: Path, *edits: tuple[str, str], name: str = "train.py", text: str = BASE) -> Path:
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def record(path: Path, args=(), **opts) -> ScriptTarget:
    return ScriptTarget(run_script(load_script(str(path)), list(args), RunOptions(**{"max_steps": 30, **opts})))


def outcome(target, probe_id: str) -> str:
    result = get(probe_id)(ProbeContext(target))
    return result.outcome


# ------------------------------------------------------------------------------------ recorder
def test_recorder_sees_models_optimizers_steps_and_restores_everything():
    before = (torch.Tensor.backward, torch.optim.Optimizer.zero_grad, nn.Module.zero_grad,
              torch.utils.data.DataLoader.__iter__, torch.nn.functional.cross_entropy, torch.autograd.backward)
    model = nn.Sequential(nn.Linear(4, 3))
    opt = torch.optim.Adam([{"params": model[0].weight}, {"params": model[0].bias, "lr": 0.1}], lr=1e-3)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    with Recorder(mode="full") as rec:
        for _ in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x).view(-1, 3), y)
            loss.backward()
            opt.step()
        with torch.no_grad():
            model(x)
    r = rec.recording
    assert [m.name for m in r.models] == ["Sequential"] and r.models[0].params == 15
    assert len(r.optimizers) == 1 and len(r.optimizers[0].groups) == 2
    assert len(r.steps) == 3 and r.steps[0].lrs == [1e-3, 0.1] and all(s.zero_grad for s in r.steps)
    assert r.steps[0].grad_norm > 0 and r.steps[0].loss == pytest.approx(r.loss_calls[0].value)
    assert [c.eval for c in r.loss_calls] == [False, False, False]
    assert [f.trained for f in r.forwards] == [True, True, True, False]
    after = (torch.Tensor.backward, torch.optim.Optimizer.zero_grad, nn.Module.zero_grad,
             torch.utils.data.DataLoader.__iter__, torch.nn.functional.cross_entropy, torch.autograd.backward)
    assert before == after
    assert not torch.nn.modules.module._global_forward_hooks


def test_recorder_restores_on_exception_and_listeners_are_called():
    calls = []

    class Listener:
        def on_step_post(self, rec, optimizer, step):
            calls.append(step.step)

    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    original = torch.Tensor.backward
    with pytest.raises(RuntimeError):
        with Recorder(mode="light", listeners=[Listener()]):
            (p * 2).sum().backward()
            opt.step()
            raise RuntimeError("boom")
    assert calls == [1] and torch.Tensor.backward is original


# ------------------------------------------------------------------------------------ runner
def test_runner_runs_as_main_with_argv_and_bounds_the_steps(tmp_path):
    path = write(tmp_path, ("for epoch in range(3):", "import sys\n    assert sys.argv[1:] == ['--lr', '1']\n    for epoch in range(3):"))
    target = record(path, ["--lr", "1"], max_steps=10)
    assert target.run.exit == "stopped" and len(target.recording.steps) == 10
    assert "10 optimizer steps" in target.recording.stopped


def test_runner_caps_batches_per_epoch(tmp_path):
    target = record(write(tmp_path), max_steps=100, limit_batches=3)
    assert target.run.exit == "finished"
    assert len(target.recording.steps) == 9  # 3 epochs x 3 batches
    assert "epoch 2" in target.run.output[-1]
    assert target.recording.capped_training == 3   # each training pass ended by the cap, not by the script
    uncapped = record(write(tmp_path, name="uncapped.py"), max_steps=100, limit_batches=None)
    assert uncapped.run.exit == "finished" and uncapped.recording.capped_training == 0


def test_sandbox_keeps_existing_files_byte_identical(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "log.csv").write_text("old,content\n")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.pt").write_bytes(b"original")
    digest = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.rglob("*") if p.is_file()}
    path = write(tmp_path, ("    main()\n", """    main()
    import os, csv
    from pathlib import Path
    torch.save(model.state_dict(), "ckpt/model.pt")
    assert torch.load("ckpt/model.pt")  # reads what it wrote
    with open("log.csv", "a") as f:
        csv.writer(f).writerow([1, 2])
    os.makedirs("out/plots", exist_ok=True)
    Path("out/plots/loss.txt").write_text("x")
    open("train.py", "w").write("overwritten")
"""))
    digest[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    target = record(path, max_steps=1000)
    assert target.run.exit == "finished", target.recording.error
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == digest  # byte-identical, and nothing new in the user's folder
    written = dict(target.run.written)
    assert {"ckpt/model.pt", "log.csv", "out/plots/loss.txt", "train.py"} <= set(written)
    assert Path(written["log.csv"]).read_text().startswith("old,content\n1,2")


def test_sys_exit_raise_and_syntax_errors(tmp_path):
    ok = record(write(tmp_path, ("    main()\n", "    main()\n    raise SystemExit(0)\n")), max_steps=1000)
    assert ok.run.exit == "finished"
    code = record(write(tmp_path, ("    main()\n", "    import sys; sys.exit(3)\n"), name="exit.py"))
    assert code.run.exit == "exited" and code.run.exit_code == 3
    raised = record(write(tmp_path, ("loss.backward()", "loss.backward(); raise ValueError('bad batch')"), name="raise.py"))
    assert raised.run.exit == "raised" and raised.crashed
    assert raised.recording.error.type == "ValueError" and raised.recording.error.where.startswith("raise.py:")
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(UsageError, match="syntax error at line 1"):
        load_script(str(tmp_path / "broken.py"))
    with pytest.raises(UsageError, match="no such file"):
        load_script(str(tmp_path / "missing.py"))


def test_script_without_an_optimizer_step_or_update_is_never_healthy(tmp_path):
    from nnwizard.script_view import untrained_note

    target = record(write(tmp_path, ("opt.step()", "pass")))
    assert target.untrained and "never changed" in untrained_note(target)
    assert get("trace-backward-step")(ProbeContext(target)).outcome == "no-step"


@pytest.mark.parametrize("update", [
    "[p.data.add_(p.grad, alpha=-0.1) for p in model.parameters()]",   # through .data
    "with torch.no_grad():\n                [p.sub_(0.1 * p.grad) for p in model.parameters()]",
])
def test_hand_written_updates_of_an_optimizers_parameters_are_steps(tmp_path, update):
    """The script builds an optimizer and only calls its zero_grad(); it updates the parameters itself."""
    from nnwizard.script_view import _steps_text, observed

    target = record(write(tmp_path, ("opt.step()", update)))
    rec = target.recording
    assert not target.untrained and len(rec.steps) == 24 and all(s.manual for s in rec.steps)  # 3 epochs of 8 batches
    assert abs(rec.steps[0].lrs[0] - 0.1) < 1e-3 and rec.optimizers[0].steps == 0
    result = get("trace-backward-step")(ProbeContext(target))
    assert result.outcome == "manual-update" and "SGD is built but never stepped" in result.summary
    assert outcome(target, "trace-zero-grad") == "ok" and outcome(target, "trace-optimizer") == "ok"
    assert "SGD built but never stepped" in _steps_text(observed(target))
    nozero = record(write(tmp_path, ("opt.step()", update), ("            opt.zero_grad()\n", ""), name="t2.py"))
    assert outcome(nozero, "trace-zero-grad") == "carry-over"


def test_gradients_never_cleared_stay_carried_once_they_are_nan(tmp_path):
    """Without zero_grad a run may diverge; from then on every gradient is NaN. A NaN gradient was not cleared
    (its norm is not > 0, but it is not 0 either): the audit must not count those steps as cleared."""
    text = BASE.replace("            opt.zero_grad()\n", "").replace(
        "            loss = crit(out, y)\n", "            loss = crit(out, y) * (float('nan') if epoch == 1 else 1.0)\n")
    target = record(write(tmp_path, text=text))
    rec = target.recording
    assert any(not math.isfinite(s.loss) for s in rec.steps)
    result = get("trace-zero-grad")(ProbeContext(target))
    assert result.outcome == "carry-over", result.summary

def test_an_edit_of_the_parameters_before_optimizer_step_is_part_of_that_step(tmp_path):
    clamp = "with torch.no_grad():\n                model[0].weight.clamp_(-1, 1)\n            opt.step()"
    target = record(write(tmp_path, ("opt.step()", clamp)))
    rec = target.recording
    assert len(rec.steps) == 24 and not any(s.manual for s in rec.steps) and rec.optimizers[0].steps == 24
    assert outcome(target, "trace-backward-step") == "ok"


def test_script_without_a_model_says_so(tmp_path):
    from nnwizard.script_view import script_problem

    target = record(write(tmp_path, text="print('hello')\n"))
    assert target.run.output == ["hello"]
    assert "without ever calling a torch.nn.Module" in script_problem(target)
    assert not target.capturable


# ------------------------------------------------------------------------------------ capture
def test_captured_model_batch_and_loss_follow_the_users_reshaping(tmp_path):
    path = write(tmp_path, ("nn.Linear(16, 2))", "nn.Linear(16, 2), nn.Unflatten(1, (1, 2)))"),
                 ("loss = crit(out, y)", "loss = crit(out.view(-1, 2), y)"))
    target = record(path)
    assert target.capturable and target.task == "classification" and target.num_classes == 2
    model = target.fresh_model()
    x, y = target.batch()
    assert model(x).shape == (32, 1, 2)
    loss = target.loss_fn(model(x), y)
    assert loss.shape == () and float(loss) > 0
    first = target.recording.models[0].initial
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), first.parameters()))
    opt = target.make_optimizer(model)
    assert type(opt).__name__ == "SGD" and opt.param_groups[0]["lr"] == 0.1
    assert target.measured_step_s > 0


def test_rerun_under_interventions(tmp_path):
    target = record(write(tmp_path), max_steps=8)
    same = target.rerun(same_batch=True, max_steps=6)
    batches = same.recording.batches
    assert len(batches) >= 2 and all(torch.equal(b[0], batches[0][0]) for b in batches)
    losses = same.recording.loss_curve
    assert losses[-1] < losses[0]  # one batch, through the script's own loop, is learnt
    scaled = target.rerun(lr_scale=10.0, max_steps=3)
    assert scaled.recording.steps[0].lrs == [pytest.approx(1.0)]
    assert target.recording.optimizers[0].optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


# ------------------------------------------------------------------------------------ audits
@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return record(write(tmp_path_factory.mktemp("healthy")))


AUDITS = ["trace-zero-grad", "trace-backward-step", "trace-optimizer", "trace-disconnected", "trace-eval-mode",
          "trace-eval-grad", "trace-train-mode", "trace-scheduler", "trace-loss-scale", "trace-loss-target",
          "trace-graph", "trace-nan", "trace-crash", "trace-loss-input", "trace-loss-sign"]


@pytest.mark.parametrize("probe_id", AUDITS)
def test_audits_stay_quiet_on_a_healthy_script(healthy, probe_id):
    result = get(probe_id)(ProbeContext(healthy))
    assert result.status == "passed", result.summary


@pytest.mark.parametrize("probe_id", AUDITS + ["trace-run"])
def test_audits_skip_module_targets(probe_id):
    class Plain:
        pass

    assert get(probe_id)(ProbeContext(Plain())).status == "skipped"


FAULTS = {
    "missing-zero-grad": ([("opt.zero_grad()\n", "\n")], "trace-zero-grad", "carry-over"),
    "missing-backward": ([("loss.backward()", "pass")], "trace-backward-step", "no-backward"),
    "missing-step": ([("opt.step()", "pass")], "trace-backward-step", "no-step"),
    "optimizer-partial": ([("SGD(model.parameters()", "SGD(model[3].parameters()")], "trace-optimizer", "missing"),
    "optimizer-foreign": ([("opt = torch.optim.SGD(model.parameters()", "other = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))\nopt = torch.optim.SGD(other.parameters()")],
                          "trace-optimizer", "foreign"),
    "disconnected": ([("nn.Linear(16, 2))", "nn.Linear(16, 2), nn.Linear(3, 3))"),
                      ("out = model(x)", "out = model[3](model[2](model[1](model[0](x))))")], "trace-disconnected", "disconnected"),
    "eval-mode": ([("    model.eval()\n", "")], "trace-eval-mode", "train-mode-in-eval"),
    "no-grad": ([("with torch.no_grad():", "if True:")], "trace-eval-grad", "grad-in-eval"),
    "train-mode": ([("        model.train()\n        running", "        running"), ("    model.train()\n    return", "    return")],
                   "trace-train-mode", "stays-eval"),
    "scheduler-per-batch": ([("crit = nn", "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)\ncrit = nn"),
                             ("opt.step()", "opt.step(); sched.step()")], "trace-scheduler", "per-step-for-per-epoch"),
    "scheduler-never": ([("crit = nn", "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)\ncrit = nn")],
                        "trace-scheduler", "never-stepped"),
    "accumulation": ([("            opt.zero_grad()\n", ""), ("            opt.step()\n", "            if i % 4 == 3:\n                opt.step(); opt.zero_grad()\n"),
                      ("for x, y in loader:\n            ", "for i, (x, y) in enumerate(loader):\n            ")], "trace-loss-scale", "accumulated-sum"),
    "sum-reduction": ([("crit = nn.CrossEntropyLoss()", "crit = nn.CrossEntropyLoss(reduction='sum')")], "trace-loss-scale", "sum-reduction"),
    "wrong-target": ([("loss = crit(out, y)", "loss = crit(out, out.argmax(1))")], "trace-loss-target", "target-from-output"),
    # a loss module (nn.CrossEntropyLoss) scoring a tensor the model never made: its own top-level call is not a model's
    "foreign-input": ([("loss = crit(out, y)", "loss = crit(prior.expand(len(y), 2), y)"),
                       ("crit = nn.CrossEntropyLoss()", "crit = nn.CrossEntropyLoss()\nprior = torch.zeros(2, requires_grad=True)")],
                      "trace-loss-target", "not-from-model"),
    "graph-kept": ([("running += loss.item()", "running += loss")], "trace-graph", "kept"),
    "graph-stored": ([("running += loss.item()", "losses.append(loss)"), ("running = 0.0", "running = 0.0\n        losses = []"),
                      ("{running / len(loader):.4f}", "{sum(l.item() for l in losses):.4f}")], "trace-graph", "stored"),
    "nan-input": ([("Y = (X[:, 0] > 0).long()", "Y = (X[:, 0] > 0).long()\nX[7, 3] = float('nan')")], "trace-nan", "nan-input"),
    "nan-growth": ([("lr=0.1", "lr=40.0"), ("nn.Linear(8, 16)", "nn.Linear(8, 256)"), ("nn.Linear(16, 2)", "nn.Linear(256, 2)"),
                    ("X = torch.randn(256, 8)", "X = torch.randn(256, 8) * 30")], "trace-nan", None),
    "idle-optimizer": ([("opt = torch.optim.SGD(model.parameters(), lr=0.1)", "opt = torch.optim.SGD(model[3].parameters(), lr=0.1)\nenc = torch.optim.SGD(model[0].parameters(), lr=0.1)"),
                        ("opt.zero_grad()", "opt.zero_grad(); enc.zero_grad()")], "trace-backward-step", "optimizer-never-steps"),
    "double-softmax": ([("nn.Linear(16, 2))", "nn.Linear(16, 2), nn.Softmax(dim=1))")], "trace-loss-input", "double-softmax"),
    # a ReLU after the logits layer (pytorch/tutorials' quickstart once shipped it) / a sigmoid there
    # log_softmax over the batch, not the classes (pytorch/examples' GAT with dim=0)
    "log-softmax-dim0": ([("nn.Linear(16, 2))", "nn.Linear(16, 2), nn.LogSoftmax(dim=0))"),
                          ("crit = nn.CrossEntropyLoss()", "crit = nn.NLLLoss()")], "trace-loss-input", "other-dim"),
    "clamped-logits": ([("nn.Linear(16, 2))", "nn.Linear(16, 2), nn.ReLU())")], "trace-loss-input", "clamped-logits"),
    "squashed-logits": ([("nn.Linear(16, 2))", "nn.Linear(16, 2), nn.Sigmoid())")], "trace-loss-input", "squashed-logits"),
    "negated-loss": ([("loss = crit(out, y)", "loss = -crit(out, y)")], "trace-loss-sign", "negated"),
    "crash-label-dtype": ([("loss = crit(out, y)", "loss = crit(out, y.float())")], "trace-crash", "labels-wrong-dtype"),
    "lr-spike": ([("opt = torch.optim.SGD(model.parameters(), lr=0.1)", "opt = torch.optim.Adam(model.parameters(), lr=5.0)")],
                 "trace-nan", "spike"),
    "crash-shape": ([("nn.Linear(8, 16)", "nn.Linear(9, 16)")], "trace-crash", "layer-shape-mismatch"),
    "crash-range": ([("nn.Linear(16, 2))", "nn.Linear(16, 2))\nY[3] = 5")], "trace-crash", "labels-out-of-range"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_audit_fires_on_its_fault(tmp_path, fault):
    edits, probe_id, expected = FAULTS[fault]
    target = record(write(tmp_path, *edits))
    result = get(probe_id)(ProbeContext(target))
    if expected is None:  # any non-finite outcome
        assert result.status == "failed", result.summary
    else:
        assert result.outcome == expected, result.summary


def test_a_script_that_raises_before_its_first_backward_is_not_said_to_lack_one(tmp_path):
    """An old idiom that raises between the loss and backward() (``loss.data[0]``): backward() is written and was
    never reached, so the audit cannot say it is missing (the crash is trace-crash's finding)."""
    target = record(write(tmp_path, ("loss.backward()", "loss.data[0]; loss.backward()")))
    result = get("trace-backward-step")(ProbeContext(target))
    assert result.outcome != "no-backward" and result.data.get("cannot_run") == "raised", result.summary


SEGMENTATION = """
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
x = torch.randn(64, 3, 8, 8)
masks = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()      # 3 classes per pixel
net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 1))
opt = torch.optim.Adam(net.parameters(), lr=1e-2)
for i in range(0, 64, 8):
    opt.zero_grad()
    pred = net(x[i:i + 8])
    loss = F.cross_entropy(PRED, masks[i:i + 8])
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize("pred, expected", [("F.softmax(pred, 1)", "double-softmax"), ("pred", "ok")])
def test_loss_input_reads_a_segmentation_maps_classes_along_dimension_1(tmp_path, pred, expected):
    """(N, C, H, W) scores into cross_entropy: one row per pixel holds its C class scores (reshape(-1, C) would
    mix pixels and classes; milesial/Pytorch-UNet with a softmax before its loss read squashed-logits)."""
    target = record(write(tmp_path, ("PRED", pred), text=SEGMENTATION))
    assert outcome(target, "trace-loss-input") == expected


def test_a_crash_inside_the_projects_own_module_is_read_where_it_raised(tmp_path):
    """The script imports its metric from its project's folder and that raises (milesial/Pytorch-UNet's dice score
    asserts equal shapes): the crash is read at the module's line, with its operands, not at the script's call."""
    (tmp_path / "metrics.py").write_text("import torch\n\ndef score(pred, y):\n    return (pred.argmax(1) == y.view(-1, 1)).float().mean()\n\n"
                                         "def checked(pred, y):\n    assert pred.shape == y.shape, 'shapes differ'\n    return 0.0\n")
    path = write(tmp_path, ("    model.train()\n    return", "    import metrics\n    metrics.checked(model(X[:8]), Y[:8])\n    model.train()\n    return"))
    result = get("trace-crash")(ProbeContext(record(path)))
    assert result.status == "failed" and result.data["where"].startswith("metrics.py:7"), result.data
    assert "was given pred float32[8, 2], y int64[8]" in result.summary, result.summary


def test_a_module_run_only_under_no_grad_is_not_a_model_the_optimizer_misses(tmp_path):
    """An augmentation with weights of its own (SimCLR's Gaussian blur is a Conv2d run under no_grad) and a crash at
    the first loss (a label past the classes): no step says which models train, and the blur's weights, in no
    optimizer, are not "trainable values the optimizer misses"."""
    path = write(tmp_path, ("crit = nn.CrossEntropyLoss()", "crit = nn.CrossEntropyLoss()\nblur = nn.Linear(8, 8)\nY[:] = 5"),
                 ("            out = model(x)\n", "            with torch.no_grad():\n                x = blur(x)\n            out = model(x)\n"))
    target = record(path)
    assert target.recording.error is not None and not target.recording.steps
    assert outcome(target, "trace-optimizer") == "ok"
    assert outcome(record(write(tmp_path, ("SGD(model.parameters()", "SGD(model[3].parameters()"), ("Y = (X[:, 0] > 0).long()", "Y = (X[:, 0] > 0).long()\nY[:] = 5"),
                                name="partial.py")), "trace-optimizer") == "missing"


@pytest.mark.parametrize("fault", ["wrong-target", "graph-kept", "eval-mode", "no-grad"])
def test_audits_that_need_the_graph_mode_fire_over_a_long_run_whose_steps_it_mostly_skips(tmp_path, fault):
    """After its first steps the graph mode watches two steps in every eight and any evaluation: a fault it
    sees recurs at every step, and the audits count only the loss calls it watched (a target taken from the
    output looks like a real one on the others)."""
    edits, probe_id, expected = FAULTS[fault]
    text = BASE.replace("range(3)", "range(12)")
    target = record(write(tmp_path, *edits, text=text), max_steps=90)
    assert target.recording.total_steps == 90
    result = get(probe_id)(ProbeContext(target))
    assert result.outcome == expected, result.summary
    if fault == "wrong-target":   # counted among the calls the mode watched, and the report says so
        assert f"training loss calls whose target was followed ({result.data['calls']} in all)" in result.summary
        assert result.data["followed"] < result.data["calls"] == 90
    healthy = record(write(tmp_path, text=text, name="healthy.py"), max_steps=90)
    assert get(probe_id)(ProbeContext(healthy)).status == "passed"


HEALTHY_VARIANTS = {
    # a sum of two backpropagated losses kept for the printout within the step (pytorch/examples DCGAN)
    "sum-for-print": ([("running += loss.item()", "both = loss + loss.detach() * 0\n            running += both.item()")], "trace-graph"),
    # labels equal to the predictions by value (an accurate model) are still the real labels
    "accurate": ([("Y = (X[:, 0] > 0).long()", "Y = torch.zeros(256, dtype=torch.long)")], "trace-loss-target"),
    # LBFGS: zero_grad, forward, loss and backward run inside step(closure)
    "closure": ([("opt = torch.optim.SGD(model.parameters(), lr=0.1)", "opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)"),
                 ("            opt.zero_grad()\n            out = model(x)\n            loss = crit(out, y)\n            loss.backward()\n            opt.step()\n",
                  "            def closure():\n                opt.zero_grad()\n                l = crit(model(x), y)\n                l.backward()\n                return l\n            loss = opt.step(closure)\n")],
                "trace-zero-grad trace-backward-step trace-loss-scale"),
    # log-probabilities over the classes into nll_loss
    "log-softmax-nll": ([("nn.Linear(16, 2))", "nn.Linear(16, 2), nn.LogSoftmax(dim=1))"),
                         ("crit = nn.CrossEntropyLoss()", "crit = nn.NLLLoss()")], "trace-loss-input"),
    # one prediction shown after training (pytorch/tutorials' CIFAR-10 lesson), beside a no_grad evaluation loop
    "lone-prediction": ([('    main()\n', '    main()\n    model.eval()\n    print(model(X[:4]).argmax(1))\n')], "trace-eval-grad"),
    # a loss that legitimately goes below zero: a Gaussian negative log-likelihood with a learned scale
    "gaussian-nll": ([("model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))",
                       "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))\n"
                       "log_scale = nn.Parameter(torch.zeros(1))"),
                      ("opt = torch.optim.SGD(model.parameters(), lr=0.1)", "opt = torch.optim.SGD(list(model.parameters()) + [log_scale], lr=0.1)"),
                      ("loss = crit(out, y)", "loss = (0.5 * ((out[:, 0] - X[:len(y), 1] * 0.0 - y.float()) / log_scale.exp()) ** 2 + log_scale).mean()")],
                     "trace-loss-sign"),
    # a scheduler stepped only after a warm-up longer than the observed run (sthalles/SimCLR: `if epoch_counter >= 10`)
    "scheduler-after-warmup": ([("crit = nn", "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)\ncrit = nn"),
                                ('        print(f"epoch', '        if epoch >= 10:\n            sched.step()\n        print(f"epoch')],
                               "trace-scheduler"),
    # a crash in the first forward is not an evaluation without no_grad
    "crash-first-forward": ([("nn.Linear(8, 16)", "nn.Linear(9, 16)")], "trace-eval-grad trace-eval-mode"),
}


@pytest.mark.parametrize("variant", sorted(HEALTHY_VARIANTS))
def test_audits_quiet_on_correct_variants(tmp_path, variant):
    edits, probes = HEALTHY_VARIANTS[variant]
    target = record(write(tmp_path, *edits))
    for probe_id in probes.split():
        result = get(probe_id)(ProbeContext(target))
        assert result.status in ("passed", "skipped"), (probe_id, result.summary)


# ------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_cli_script_mode_end_to_end(tmp_path):
    path = write(tmp_path, ("opt.zero_grad()\n", "\n"))
    report = tmp_path / "r.json"
    md = tmp_path / "r.md"
    proc = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--script", str(path), "--non-interactive",
                           "--symptom", "flat", "--json", str(report), "--report", str(md), "--max-steps", "20"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    data = json.loads(report.read_text())
    assert data["mode"] == "script" and data["module"] == str(path)
    assert data["hypotheses"][0]["id"] == "missing-zero-grad" and data["verdict"] == "problems-found"
    assert data["script"]["steps"] == 20 and data["script"]["models"][0]["name"] == "Sequential"
    assert data["script"]["models"][0]["device"] == "cpu"   # where its parameters live (cuda:0 on a GPU: test_gpu.py)
    assert "Per-step trace" in md.read_text()
    assert "trace-run-curves.png" in md.read_text()  # the script's loss curve with a declared symptom too
    bad = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--script", str(tmp_path / "nope.py"),
                          "--non-interactive"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


GAN = '''
import torch
from torch import nn
torch.manual_seed(0)
G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 8))
D = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Dropout(0.1), nn.Linear(16, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
bce = nn.BCEWithLogitsLoss()
real = torch.randn(64, 8) + 2
for it in range(20):
    D.zero_grad()
    err_real = bce(D(real), torch.ones(64, 1))
    err_real.backward()
    fake = G(torch.randn(64, 4))
    err_fake = bce(D(fake.detach()), torch.zeros(64, 1))
    err_fake.backward()
    err_d = err_real + err_fake
    opt_d.step()
    G.zero_grad()
    err_g = bce(D(fake), torch.ones(64, 1))
    err_g.backward()
    opt_g.step()
    if it % 5 == 0:  # a picture from fixed noise, in train mode with grad on (as pytorch/examples DCGAN does)
        sample = G(torch.randn(4, 4)).detach()
    print(it, err_d.item(), err_g.item())
'''


def test_gan_loop_is_not_evaluation_or_accumulation(tmp_path):
    target = record(write(tmp_path, text=GAN), max_steps=40)
    assert len(target.recording.models) == 2 and len(target.recording.steps) == 40
    for probe_id in ("trace-eval-mode", "trace-eval-grad", "trace-loss-scale", "trace-graph", "trace-backward-step",
                     "trace-zero-grad", "trace-optimizer"):
        result = get(probe_id)(ProbeContext(target))
        assert result.status in ("passed", "skipped"), (probe_id, result.summary)


INNER_LOSS = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)

class WithLoss(nn.Module):  # computes its own loss, as Hugging Face models do
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x, labels):
        logits = self.body(x)
        return F.cross_entropy(logits, labels), logits

model = WithLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 6), torch.randint(0, 3, (64,))
for step in range(10):
    opt.zero_grad()
    loss, _ = model(x, y)
    loss.backward()
    opt.step()
'''

CONV_TOO_SMALL = '''
import torch
from torch import nn
model = nn.Sequential(nn.Conv2d(1, 4, 5), nn.ReLU(), nn.Conv2d(4, 4, 5))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 1, 6, 6)
opt.zero_grad()
model(x).mean().backward()
opt.step()
'''


def test_loss_inside_the_models_forward_counts_as_from_the_model(tmp_path):
    target = record(write(tmp_path, text=INNER_LOSS))
    assert get("trace-loss-target")(ProbeContext(target)).status == "passed"


def test_a_layer_rejecting_its_input_size_is_a_layer_shape_mismatch(tmp_path):
    target = record(write(tmp_path, text=CONV_TOO_SMALL))
    assert target.crashed
    assert get("trace-crash")(ProbeContext(target)).outcome == "layer-shape-mismatch"


ACCURACY_ONLY_EVAL = [("    model.eval()\n", ""), ("            total += crit(model(x), y).item()",
                                                      "            total += (model(x).argmax(1) == y).float().mean().item()")]


def test_evaluation_without_a_loss_outside_the_training_loader_is_still_evaluation(tmp_path):
    target = record(write(tmp_path, *ACCURACY_ONLY_EVAL))
    assert outcome(target, "trace-eval-mode") == "train-mode-in-eval"


RNN = '''
import torch
from torch import nn
torch.manual_seed(0)

class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(4, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x, hidden):
        o, hidden = self.rnn(x, hidden)
        return self.out(o).view(-1, 3), hidden

model = Tagger()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
hidden = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
for i in range(12):
    x, y = torch.randn(5, 2, 4), torch.randint(0, 3, (10,))
    hidden = tuple(h.detach() for h in hidden)
    opt.zero_grad()
    out, hidden = model(x, hidden)
    loss = nn.functional.cross_entropy(out, y)
    loss.backward()
    opt.step()
'''
NOT_DETACHED = ("    hidden = tuple(h.detach() for h in hidden)\n", "")


@pytest.mark.parametrize("edits, retain, expected", [
    ((), False, "ok"),                                    # truncated BPTT done right: the hidden state is detached
    ((NOT_DETACHED,), False, "spans"),                    # raises "backward through the graph a second time"
    ((NOT_DETACHED, ("loss.backward()", "loss.backward(retain_graph=True)")), True, "spans"),  # then the update breaks it
])
def test_graph_carried_across_steps(tmp_path, edits, retain, expected):
    target = record(write(tmp_path, *edits, text=RNN))
    if not retain:
        assert (target.recording.error is not None) == (expected == "spans")
    result = get("trace-graph")(ProbeContext(target))
    assert result.outcome == expected, result.summary


MANUAL = '''
import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(128, 5)
Y = X @ torch.randn(5, 1) + 0.1
model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
lr = 0.05
for step in range(40):
    loss = nn.functional.mse_loss(model(X), Y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
            p.grad = None
'''


@pytest.mark.parametrize("edits, probe_id, expected", [
    ((), "trace-backward-step", "manual-update"),
    ((), "trace-zero-grad", "ok"),
    ((), "trace-optimizer", "ok"),
    (((("            p.grad = None\n", "")),), "trace-zero-grad", "carry-over"),
    ((("for p in model.parameters():", "for p in model[0].parameters():"),), "trace-optimizer", "missing"),
    ((("            p -= lr * p.grad\n", "            p.data.add_(p.grad, alpha=-lr)\n"),), "trace-backward-step", "manual-update"),
])
def test_hand_written_updates_are_audited_as_steps(tmp_path, edits, probe_id, expected):
    target = record(write(tmp_path, *edits, text=MANUAL))
    rec = target.recording
    assert len(rec.steps) == 30 and all(s.manual for s in rec.steps) and not target.untrained
    assert abs(rec.steps[0].lrs[0] - 0.05) < 1e-3  # |update| / |gradient| of plain SGD is its learning rate
    result = get(probe_id)(ProbeContext(target))
    assert result.outcome == expected, result.summary


@pytest.mark.parametrize("reload", [
    "best = torch.load('model.pt', weights_only=False)",                                     # the whole module
    "best = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))\n"
    "    best.load_state_dict(torch.load('weights.pt'))",                                    # a state dict into a new instance
])
def test_a_model_loaded_from_a_checkpoint_is_a_copy_not_a_second_model(tmp_path, reload):
    from nnwizard.script_view import _models_line, observed

    tail = ("    main()\n    torch.save(model, 'model.pt'); torch.save(model.state_dict(), 'weights.pt')\n"
            f"    {reload}\n    best.eval()\n    with torch.no_grad():\n        print(crit(best(X), Y).item())\n")
    target = record(write(tmp_path, ("    main()\n", tail)), max_steps=100)
    models = target.recording.models
    assert len(models) == 2 and models[0].copy_of is None and models[1].copy_of == 0
    assert "a copy of model 0" in _models_line(observed(target))
    other = record(write(tmp_path, ("    main()\n", "    main()\n    fresh = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))\n    fresh(X)\n"), name="t2.py"), max_steps=100)
    assert [m.copy_of for m in other.recording.models] == [None, None]  # a new, untrained instance is a second model


def test_batch_cap_fits_slow_steps_to_the_time_limit():
    from types import SimpleNamespace as NS

    from nnwizard.script_run import BatchCap

    def rec(step_s):
        steps = [NS(step=i + 1, duration_s=step_s) for i in range(3)]
        return NS(limit_batches=20, recording=NS(steps=steps, notes=[], loaders=[object()]))   # (a DataLoader to cap)
    slow, fast = rec(1.5), rec(0.01)
    for r in (slow, fast):
        BatchCap(20, 30.0).on_step_post(r, None, r.recording.steps[2])
    assert slow.limit_batches == 8 and "capped at 8" in slow.recording.notes[0]  # 30 s / (2.5 passes x 1.5 s)
    assert fast.limit_batches == 20 and not fast.recording.notes                  # small models keep the default


def test_a_curve_cut_short_by_the_budget_is_a_missing_measurement(tmp_path):
    cut = get("trace-run")(ProbeContext(record(write(tmp_path), max_steps=3)))
    assert cut.status == "skipped" and cut.data.get("cannot_run") == "budget"
    short = write(tmp_path, ("for epoch in range(3):", "for epoch in range(1):"), ("batch_size=32", "batch_size=128"), name="short.py")
    ended = get("trace-run")(ProbeContext(record(short)))  # the script itself took only 2 steps
    assert ended.status == "skipped" and "cannot_run" not in ended.data


SPARSE_GRAPH = '''
import os
import numpy as np
import torch
from torch import nn
os.makedirs("graph", exist_ok=True)
with open("graph/feats.txt", "w") as f:          # written by the script, then read back with numpy
    for i in range(40):
        f.write(" ".join(str((i * k) % 3) for k in range(6)) + f" {i % 2}\\n")
table = np.genfromtxt("graph/feats.txt")
x, y = torch.tensor(table[:, :-1], dtype=torch.float32), torch.tensor(table[:, -1], dtype=torch.long)
adj = (torch.eye(40) + torch.diag(torch.ones(39), 1)).to_sparse()   # a sparse adjacency matrix as model input

class GraphNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 2)

    def forward(self, x, adj):
        return torch.sparse.mm(adj, self.lin(x))

model = GraphNet()
opt = torch.optim.Adam(model.parameters(), lr=0.05)
for step in range(8):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x, adj), y)
    loss.backward()
    opt.step()
'''


def test_sparse_inputs_and_files_read_back_with_numpy_run_as_in_plain_python(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = record(write(tmp_path, text=SPARSE_GRAPH))
    assert target.recording.error is None and len(target.recording.steps) == 8
    assert not (tmp_path / "graph").exists()  # the script's folder and file went to the scratch folder


ARCHIVE_THEN_TABLE = '''
import io, tarfile
import numpy as np
import torch

# a data set shipped as a .tar.gz (as a download would hand it over), unpacked into the working folder, then read back
rows = "\\n".join(f"{i % 5} {(i * 7) % 11} {i % 3}" for i in range(60)).encode()
packed = io.BytesIO()
with tarfile.open(fileobj=packed, mode="w:gz") as tar:
    info = tarfile.TarInfo("shipped/rows.txt")
    info.size = len(rows)
    tar.addfile(info, io.BytesIO(rows))
packed.seek(0)
with tarfile.open(fileobj=packed, mode="r:gz") as tar:
    tar.extractall()
table = torch.from_numpy(np.loadtxt("shipped/rows.txt", dtype=np.float32))
features, labels = table[:, :2], table[:, 2].long()
weights = torch.zeros(2, 3, requires_grad=True)
sgd = torch.optim.SGD([weights], lr=0.01)
for _ in range(6):
    sgd.zero_grad()
    torch.nn.functional.cross_entropy(features @ weights, labels).backward()
    sgd.step()
'''


def test_an_archive_extracted_by_the_script_is_read_back_from_the_scratch_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = record(write(tmp_path, text=ARCHIVE_THEN_TABLE))
    assert target.recording.error is None and len(target.recording.steps) == 6
    assert not (tmp_path / "shipped").exists()  # tarfile's folder and its file both went to the scratch folder


ACTOR_CRITIC = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)

class Policy(nn.Module):  # two heads: action probabilities and a state value
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 32)
        self.action, self.value = nn.Linear(32, 2), nn.Linear(32, 1)

    def forward(self, x):
        h = F.relu(self.body(x))
        return F.softmax(self.action(h), dim=-1), self.value(h)

model = Policy()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for episode in range(12):
    saved = []
    for t in range(8):  # one forward per time step, one backward per episode
        probs, value = model(torch.randn(1, 4))
        a = torch.distributions.Categorical(probs).sample()
        saved.append((torch.log(probs[0, a]), value, float(torch.rand(()))))
    policy_losses = [-lp * (r - v.item()) for lp, v, r in saved]
    value_losses = [F.smooth_l1_loss(v, torch.tensor([[r]])) for _, v, r in saved]
    opt.zero_grad()
    loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
    loss.backward()
    opt.step()
'''


def test_an_episode_of_summed_loss_terms_is_one_objective_from_the_model(tmp_path):
    target = record(write(tmp_path, text=ACTOR_CRITIC))
    for probe_id in ("trace-loss-scale", "trace-loss-target"):
        result = get(probe_id)(ProbeContext(target))
        assert result.status in ("passed", "skipped"), (probe_id, result.summary)


def test_gradients_of_parameters_in_no_optimizer_are_not_carry_over(tmp_path):
    # only the head is optimized: the body's gradients pile up, but nothing updates them (that is the optimizer's finding)
    target = record(write(tmp_path, ("SGD(model.parameters()", "SGD(model[3].parameters()")))
    assert outcome(target, "trace-zero-grad") == "ok" and outcome(target, "trace-optimizer") == "missing"


FORWARD_CALLED_DIRECTLY = '''
import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(64, 6)


class Layer(nn.Linear):
    def __init__(self, d_in, d_out):
        super().__init__(d_in, d_out)
        self.act = nn.ReLU()
        self.opt = torch.optim.Adam(self.parameters(), lr=0.01)

    def forward(self, x):
        return self.act(x @ self.weight.T + self.bias)

    def fit(self, x):
        for _ in range(5):
            loss = self.forward(x).pow(2).mean()   # forward() called directly: only the ReLU passes __call__
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return self.forward(x).detach()


h = X
for layer in [Layer(6, 5), Layer(5, 4)]:
    h = layer.fit(h)
'''


def test_a_forward_called_directly_shows_the_module_that_owns_the_parameters(tmp_path):
    from nnwizard.script_view import _models_line, observed

    target = record(write(tmp_path, text=FORWARD_CALLED_DIRECTLY))
    rec = target.recording
    assert len(rec.models) == 2 and [type(m.owner).__name__ for m in rec.models] == ["Layer", "Layer"]
    assert [o.models for o in rec.optimizers] == [[0], [1]] and not any(o.foreign for o in rec.optimizers)
    line = _models_line(observed(target))
    assert line.startswith("Layer (35 parameters, 35 trainable") and "Layer (24 parameters" in line
    assert "seen through its ReLU" in line and "0 parameters" not in line
    plain = record(write(tmp_path, name="t2.py"))   # a model called as model(x): no owner
    assert [m.owner for m in plain.recording.models] == [None]
    assert "seen through" not in _models_line(observed(plain))


def test_output_capture_keeps_a_progress_bars_last_state(tmp_path):
    """A line redrawn with carriage returns (tqdm) is one line in the captured output: its last state."""
    path = tmp_path / "bar.py"
    path.write_text("import sys\n"
                    "for i in range(1, 4):\n"
                    "    sys.stderr.write(f'\\repoch 0: {i}/3')\n"
                    "    sys.stderr.flush()\n"
                    "sys.stderr.write('\\n')\n"
                    "print('done', end='\\r\\n')\n"
                    "sys.stdout.write('\\rstill drawing 1/2\\r')\n")
    run = run_script(load_script(str(path)), [], RunOptions(max_steps=1))
    assert run.output == ["epoch 0: 3/3", "done", "still drawing 1/2"]


def test_a_recording_note_made_for_each_dataloader_is_shown_once_with_its_count():
    from nnwizard.script_view import _counted
    assert _counted(["a", "b", "a"]) == ["a (2 times)", "b"]


def test_trace_epochs_count_the_training_passes_of_the_loader_not_its_evaluation_passes(tmp_path):
    """BASE evaluates on its training loader after every epoch: the steps of the second training pass are
    epoch 2, not 3."""
    target = record(write(tmp_path), max_steps=100, limit_batches=3)
    assert [s.epoch for s in target.recording.steps] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [s.batch for s in target.recording.steps] == [0, 1, 2] * 3


def test_probes_get_the_eager_module_behind_a_torch_compile_wrapper():
    """A compiled model's backward refuses retain_graph (batch-independence errored on a healthy compiled
    script); the probes get the module it wraps, whose parameters are the same tensors in the same order."""
    from nnwizard.record import inner_model
    inner = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    compiled = torch.compile(inner)   # compiles lazily: nothing is compiled until it is called
    assert inner_model(compiled) is inner and inner_model(inner) is inner
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in inner.parameters()]


def test_per_step_trace_marks_left_out_steps_and_unmeasured_norms(tmp_path):
    from nnwizard.probes.trace import trace_run
    from nnwizard.script_view import TRACE_COLUMNS, UNMEASURED, _trace_rows, markdown_lines, observed

    target = record(write(tmp_path), max_steps=30)   # 3 epochs of 8 batches: 24 steps, more than the table shows
    obs = observed(target)
    rows = _trace_rows(obs["trace"])
    steps = [r[0] for r in rows]
    assert steps[:9] == list(range(1, 10)) and steps[9] == "…" and steps[10:] == [22, 23, 24]
    assert all(len(r) == len(TRACE_COLUMNS) for r in rows)
    assert any(s["grad_norm"] is None for s in obs["trace"])   # a step between the sampled ones
    assert UNMEASURED in "\n".join(markdown_lines(obs))
    assert rows[0][-1] != "-" and rows[0][TRACE_COLUMNS.index("mode")] == "train"   # the first step's largest change
    run = trace_run(ProbeContext(target))
    assert not [a for a in run.artifacts if getattr(a, "rows", None)]   # the one per-step trace is the observed one

    short = observed(record(write(tmp_path, name="short.py"), max_steps=5))
    assert "…" not in [r[0] for r in _trace_rows(short["trace"])]


@pytest.mark.parametrize("train_sum", [False, True])
def test_an_evaluation_that_sums_its_loss_is_read_on_the_training_losss_scale(tmp_path, train_sum):
    from nnwizard.probes._recording import eval_curve
    from nnwizard.probes.trace import trace_run

    summed = ("total += crit(model(x), y).item()", "total += nn.functional.cross_entropy(model(x), y, reduction='sum').item()")
    edits = [summed] + ([("crit = nn.CrossEntropyLoss()", "crit = nn.CrossEntropyLoss(reduction='sum')")] if train_sum else [])
    mean_val, mean_steps = eval_curve(record(write(tmp_path), max_steps=20).recording)
    sum_val, sum_steps = eval_curve(record(write(tmp_path, *edits, name="summed.py"), max_steps=20).recording)
    assert sum_steps == mean_steps == [8, 16]
    if train_sum:   # both curves sum: left as they are (32 samples a batch)
        assert sum_val[0] > 10 * mean_val[0]
    else:
        assert sum_val == pytest.approx(mean_val, rel=1e-5)
        plot = trace_run(ProbeContext(record(write(tmp_path, *edits, name="summed.py"), max_steps=20))).artifacts[0]
        assert plot.xs["evaluation"] == [8, 16] and plot.x[0] == 1


STAGED = '''
import torch
from torch import nn

torch.manual_seed(1)
data = torch.randn(96, 5)
stages = [nn.Linear(5, 12), nn.Linear(12, 12)]                    # trained one after the other, each by its own Adam
optimizers = [torch.optim.Adam(stage.parameters(), lr=0.01) for stage in stages]

features = data
for stage, opt in zip(stages, optimizers):
    for _ in range(STAGE_STEPS):
        opt.zero_grad()
        out = torch.tanh(stage(features))
        score = (out.pow(2).mean(1) - 1.0).pow(2).mean()         # a local objective per stage, no labels
        score.backward()
        opt.step()
    features = torch.tanh(stage(features)).detach()
'''


def test_a_later_stage_the_cut_run_never_reached_is_no_idle_optimizer(tmp_path):
    # 30 steps per stage, the run cut at 20: the second stage's Adam has not been reached, nothing says it never steps
    early = record(write(tmp_path, text=STAGED.replace("STAGE_STEPS", "30")), max_steps=20)
    assert early.recording.stopped and outcome(early, "trace-backward-step") != "optimizer-never-steps"
    # cut again, now inside the second stage: its Adam is zeroed and its stage backpropagated, yet only the first
    # optimizer ever steps (a copy-paste slip): gradients reached it, so the cut run is no excuse
    starved = STAGED.replace("STAGE_STEPS", "30").replace("        opt.step()\n", "        optimizers[0].step()\n")
    late = record(write(tmp_path, text=starved, name="starved.py"), max_steps=40)
    assert late.recording.stopped and outcome(late, "trace-backward-step") == "optimizer-never-steps"


LONG_EPISODE = '''
import torch
from torch import nn

torch.manual_seed(4)
policy = nn.Sequential(nn.Linear(3, 32), nn.Dropout(0.3), nn.Tanh(), nn.Linear(32, 2))
policy.eval()        # the planted slip: left in eval mode, so its dropout never acts while it learns
adam = torch.optim.Adam(policy.parameters(), lr=1e-2)
for episode in range(3):
    position, picks, gains = torch.zeros(1, 3), [], []
    while len(picks) < 450:                                # one policy call per time step of a long episode
        dist = torch.distributions.Categorical(probs=torch.softmax(policy(position), dim=1))
        move = dist.sample()
        picks.append(dist.log_prob(move))
        position = position + (0.1 if move.item() else -0.1)
        gains.append(float(-position.abs().sum()))
    gain = torch.tensor(gains)
    terms = [-pick * g for pick, g in zip(picks, gain - gain.mean())]
    loss = torch.cat(terms).sum()
    adam.zero_grad()
    loss.backward()
    adam.step()
'''


def test_every_forward_of_a_long_episode_is_reached_by_its_backward(tmp_path):
    target = record(write(tmp_path, text=LONG_EPISODE))
    assert len(target.recording.steps) == 3 and all(f.trained for f in target.recording.forwards)
    assert outcome(target, "trace-eval-grad") == "no-eval"       # no forward is an evaluation without no_grad
    assert outcome(target, "trace-train-mode") != "ok"           # the eval mode it trains in is the finding


DIRECT_FORWARD = '''
import torch
from torch import nn
import torch.nn.functional as F

class TwoLayer(nn.Module):               # its own weights, used through F.linear; only the activation is a module
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(16, 6) * 0.3)
        self.w2 = nn.Parameter(torch.randn(1, 16) * 0.3)
        self.act = nn.Softplus()

    def forward(self, x):
        return F.linear(self.act(F.linear(x, self.w1)), self.w2)

torch.manual_seed(2)
net = TwoLayer()
rms = torch.optim.RMSprop([net.w1], lr=1e-3)          # w2 left out of the optimizer
xs = torch.randn(200, 6)
ys = xs.sum(1, keepdim=True)
for i in range(0, 200, 20):
    rms.zero_grad()
    err = (net.forward(xs[i:i + 20]) - ys[i:i + 20]).pow(2).mean()   # forward() called directly, not net(...)
    err.backward()
    rms.step()
'''


def test_parameters_left_out_of_the_optimizer_count_when_forward_is_called_directly(tmp_path):
    target = record(write(tmp_path, text=DIRECT_FORWARD))
    result = get("trace-optimizer")(ProbeContext(target))
    assert result.outcome == "missing" and result.data["missing_params"] == 16, result.summary


def test_trace_mode_column_names_each_model_only_when_their_modes_differ():
    from nnwizard.script_view import _mode
    assert _mode({"modes": {"Enc": True, "Head": True}, "training": True}) == "train"
    assert _mode({"modes": {"Enc": True, "Head": False}, "training": False}) == "Enc:train, Head:eval"
    assert _mode({"modes": {}, "training": None}) == "-" and _mode({"modes": {"M": False}, "training": False}) == "eval"


def test_a_capped_evaluation_loader_whose_predictions_meet_all_labels_runs_again_uncapped(tmp_path):
    """sklearn-style accuracy over the whole validation set after a DataLoader pass: the cap made the crash."""
    gathered = write(tmp_path, ("""    with torch.no_grad():
        for x, y in loader:
            total += crit(model(x), y).item()
    model.train()
    return total / len(loader)""", """    with torch.no_grad():
        preds = torch.cat([model(x).argmax(1) for x, _ in loader])
    model.train()
    return (preds == Y).float().mean().item()   # all 256 labels: fails when the pass was capped"""))
    target = record(gathered, max_steps=12, limit_batches=4)
    assert target.recording.error is None and target.run.exit in ("finished", "stopped"), target.run.output
    assert any("evaluation passes uncapped, did not raise" in n for n in target.recording.notes), target.recording.notes
    assert len(target.recording.steps) == 12   # training passes stay capped: 3 epochs x 4 batches


# a dataset whose __getitem__ applies a parameterless module of the user's own (a transform), an nn.Flatten
# and an nn.Identity called on the batch by the loop, and a lazy model (its parameters uninitialised when
# first called: still a model); "Net" has no parameters at all (its layers kept in a plain list) and is
# called by the loop: a model, the broken one (no-parameters)
TRANSFORMS = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Jitter(nn.Module):
    def forward(self, x):
        return x + 0.01 * torch.randn_like(x)


class Images(Dataset):
    def __init__(self):
        self.x, self.y, self.jitter = torch.randn(64, 2, 4), torch.randint(0, 2, (64,)), Jitter()

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.jitter(self.x[i]), self.y[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(8, 2)]   # a plain list: no registered parameters

    def forward(self, x):
        return self.layers[0](x)


torch.manual_seed(0)
flatten, identity = nn.Flatten(), nn.Identity()
model = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, 2))
net = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in DataLoader(Images(), batch_size=16):
        opt.zero_grad()
        h = identity(flatten(x))
        loss = nn.functional.cross_entropy(model(h), y) + 0.0 * net(h).sum()
        loss.backward()
        opt.step()
'''


@pytest.mark.parametrize("mode", ["full", "light"])
def test_parameterless_transforms_are_not_models_but_lazy_and_the_users_own_are(tmp_path, mode):
    """Normalize in a torchvision dataset, an nn.Flatten called on its own: no parameters to train, not models."""
    from nnwizard.script_view import observed

    run = run_script(load_script(str(write(tmp_path, text=TRANSFORMS))), [], RunOptions(max_steps=30, mode=mode))
    rec = run.recording
    assert rec.error is None and rec.total_steps == 8, rec.error
    assert [(m.name, m.params) for m in rec.models] == [("Sequential", 16 * 8 + 16 + 16 * 2 + 2), ("Net", 0)]
    if mode == "full":
        assert [m["name"] for m in observed(ScriptTarget(run))["models"]] == ["Sequential", "Net"]


# ------------------------------------------------------------------------- the observed run's length
REINFORCE = '''
import torch
from torch import nn
from torch.distributions import Categorical

torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
for episode in range(400):
    log_probs, rewards = [], []
    state = torch.randn(4)
    for t in range(5):
        dist = Categorical(logits=policy(state))
        action = dist.sample()
        log_probs.append(dist.log_prob(action))
        rewards.append(float(action == (state[0] > 0)))
        state = torch.randn(4)
    returns = torch.tensor([sum(rewards[i:]) for i in range(5)])
    loss = -(torch.stack(log_probs) * returns).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():   # an evaluation rollout: sampled under no_grad, not part of any objective
        Categorical(logits=policy(torch.randn(4))).sample()
'''


def test_a_fast_script_is_watched_for_about_three_seconds_not_sixty_steps(tmp_path):
    from nnwizard.script_run import StepFit

    text = BASE.replace("for epoch in range(3):", "for epoch in range(200):")
    fit = StepFit(extend=True)
    fit.OBSERVE_S, fit.OBSERVE_MAX = 60.0, 120   # (a loaded CPU can make this MLP's step 70 ms: not the thing tested)
    run = run_script(load_script(str(write(tmp_path, text=text))), [], RunOptions(listeners=[fit]))
    steps = len(run.recording.steps)
    assert steps == 120 and any("run lengthened from 60 to 120" in n for n in run.recording.notes), (steps, run.recording.notes)
    assert run.recording.distributions == 0
    given = run_script(load_script(str(write(tmp_path, text=text))), [], RunOptions(listeners=[StepFit(extend=False)]))
    assert len(given.recording.steps) == 60   # --max-steps given: as asked
    slow = BASE.replace("for epoch in range(3):", "for epoch in range(200):").replace(
        "            opt.step()\n", "            opt.step()\n            __import__('time').sleep(0.06)\n")
    fit = StepFit(extend=True)
    fit.OBSERVE_S = 2.0    # 60 steps of at least 60 ms already fill it
    kept = run_script(load_script(str(write(tmp_path, text=slow))), [], RunOptions(listeners=[fit]))
    assert len(kept.recording.steps) == 60 and any("run kept at 60" in n for n in kept.recording.notes)


def test_a_policy_gradient_script_keeps_the_sixty_step_run(tmp_path):
    """A REINFORCE loss grows with the returns as the policy improves: lengthened, its curve read as a
    blow-up (session 11). The policy's Categorical built from the model's output in grad mode is seen."""
    from nnwizard.script_run import StepFit

    fit = StepFit(extend=True)
    fit.OBSERVE_S = 60.0   # however fast or slow this machine is now, only the distributions keep it at 60
    run = run_script(load_script(str(write(tmp_path, text=REINFORCE))), [], RunOptions(listeners=[fit]))
    assert len(run.recording.steps) == 60, run.recording.notes
    assert run.recording.distributions == 5 * 60   # five an episode from the model's output; the no_grad ones not
    assert any("not lengthened" in n for n in run.recording.notes)


def test_a_script_whose_one_epoch_the_batch_cap_ended_is_observed_again_with_one_long_pass(tmp_path, monkeypatch):
    # a fine-tuning script of one epoch (Hugging Face's run_clm_no_trainer with --num_train_epochs 1): the cap of 20
    # batches a pass, there to see an evaluation and the next epoch, ended its whole training at step 20
    from nnwizard.session import Options, _load_script_target

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))   # where the runs' scratch folders go
    one = write(tmp_path, ("batch_size=32, shuffle=True", "batch_size=4, shuffle=True"), ("range(3)", "range(1)"), name="one.py")
    target = _load_script_target(Options(script=str(one), max_steps=60), None)
    rec = target.recording
    assert len(rec.steps) == 48 and target.run.exit == "finished"   # 64 batches in its epoch, 48 of them before its
    assert any(c.eval for c in rec.loss_calls)                         # evaluation, which is recorded too
    assert rec.notes[0].startswith("a first run took 20 optimizer steps in 1 training pass(es) ended by the batch cap")
    # the first run's folder for what it wrote is gone: only the second run's remains
    assert [p for p in temp.iterdir() if p.name.startswith("nnwizard-script-")] == [target.run.scratch]
    three = write(tmp_path, ("batch_size=32, shuffle=True", "batch_size=4, shuffle=True"), name="three.py")
    again = _load_script_target(Options(script=str(three), max_steps=60), None)   # three epochs: one run, as before
    assert len(again.recording.steps) == 60 and not any("a first run" in n for n in again.recording.notes)
    assert any(c.eval for c in again.recording.loss_calls)
    short = write(tmp_path, ("range(3)", "range(1)"), name="short.py")   # 8 batches: never capped, never rerun
    once = _load_script_target(Options(script=str(short), max_steps=60), None)
    assert len(once.recording.steps) == 8 and not any("a first run" in n for n in once.recording.notes)


def test_a_rerun_takes_the_observed_runs_pass_cap_unless_told_otherwise(tmp_path):
    # a fast script's observed run lengthens its passes, a one-epoch script's gets one long pass: a rerun as long as the
    # observed run (the lr sweep's long arm) must get the same passes, not the default 20 batches (it ended early)
    path = write(tmp_path, ("batch_size=32, shuffle=True", "batch_size=4, shuffle=True"))   # 64 batches an epoch
    target = record(path, max_steps=60, limit_batches=30)
    assert target.recording.pass_cap == 30 and [s.epoch for s in target.recording.steps][::30] == [1, 2]
    again = target.rerun(max_steps=60)
    assert [s.epoch for s in again.recording.steps][::30] == [1, 2] and again.recording.pass_cap == 30
    told = target.rerun(max_steps=60, limit_batches=20)
    assert [s.epoch for s in told.recording.steps][::20] == [1, 2, 3]


def test_a_second_run_keeps_what_the_scripts_logging_writes(tmp_path, monkeypatch):
    # logging.basicConfig binds its handler to the stderr of the first run (nnwizard's capture of it) and is a no-op
    # after that: the second observed run of a one-epoch script, and every rerun, logged into a capture long closed
    import logging

    monkeypatch.setattr(logging.root, "handlers", [])   # as in a fresh process (pytest's capture handlers aside)
    path = tmp_path / "logs.py"
    path.write_text("import logging\nlogging.basicConfig(level=logging.INFO)\nlogging.getLogger('mine').info('epoch 0: perplexity 42')\n")
    script = load_script(str(path))
    first = run_script(script, [], RunOptions(max_steps=5))
    second = run_script(script, [], RunOptions(max_steps=5))
    assert any("perplexity 42" in line for line in first.output)
    assert any("perplexity 42" in line for line in second.output)
    assert sum("perplexity 42" in line for line in first.output) == 1   # not written into the ended run's lines


def test_a_loader_pass_left_unfinished_does_not_take_the_next_loaders_steps(tmp_path):
    # Lightning's sanity check takes two validation batches and leaves that pass unfinished; the training pass after
    # it was counted as the validation loader's (its backwards, its forwards), so the cap ending the training pass
    # looked like the end of an evaluation, and a one-epoch Lightning script was never observed in one long pass
    path = write(tmp_path, ("def main():\n", "def main():\n    batches = iter(loader)   # built before the sanity check, as Lightning does\n"
                                              "    for i, _ in enumerate(val_loader):\n        if i == 1:\n            break\n"),
                 ("        for x, y in loader:\n            opt.zero_grad()", "        for x, y in batches:\n            opt.zero_grad()"),
                 ("loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)",
                  "loader = DataLoader(TensorDataset(X, Y), batch_size=4, shuffle=True)\nval_loader = DataLoader(TensorDataset(X, Y), batch_size=64)"),
                 ("range(3)", "range(1)"))
    target = record(path, max_steps=60, limit_batches=20)
    rec = target.recording
    val, train = sorted(rec.loaders, key=lambda info: info.length)   # 4 and 64 batches
    assert train.length == 64 and train.backwards[0] == 20 and val.backwards == [0]
    assert rec.capped_training == 1
    assert all(e.loader == train.index for e in rec.forwards if e.grad_enabled and e.training)


def test_the_task_says_where_it_came_from_and_that_it_is_unknown_without_a_loss_call(tmp_path):
    target = record(write(tmp_path))
    assert target.task == "classification" and target.task_source == "from cross_entropy, the loss the script called"
    crashed = record(write(tmp_path, ("    for epoch in range(3):", "    raise ConnectionError('no network')\n    for epoch in range(3):"),
                           name="crash.py"))
    assert crashed.loss_call is None and "not known" in crashed.task_source
