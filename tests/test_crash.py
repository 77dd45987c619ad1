"""Crashes are diagnoses: the exception classifier (probes/_crash.py), the training-crash probe on the
bundled crash examples, and the honest verdict (errored / could-not-run probes add no evidence and
keep a session without findings from being healthy)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnwizard.catalog import load_catalog
from nnwizard.engine import Diagnosis, Engine
from nnwizard.probes import ProbeContext, cannot_run, passed, probe
from nnwizard.probes._crash import classify_exception, shadowed_methods
from nnwizard.prompts import ScriptedPrompter
from nnwizard.report import build, verdict
from nnwizard.tree import load_tree
from tests.conftest import load_example, run_probe_on


def classify(fn, **kw):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - what is classified
        return classify_exception(exc, **kw)
    raise AssertionError("did not raise")


def test_op_shape_names_op_operands_and_line():
    a, b = torch.randn(4, 3), torch.randn(5, 2)
    c = classify(lambda: torch.cat([a, b], dim=1))
    assert c.hypothesis == "op-shape-mismatch" and c.op == "torch.cat"
    assert [4, 3] in c.shapes and [5, 2] in c.shapes and "test_crash.py" in c.where
    assert classify(lambda: torch.dot(a, b)).hypothesis == "op-shape-mismatch"
    assert classify(lambda: a.view(7, 5)).hypothesis == "op-shape-mismatch"


def test_dtype_device_and_labels():
    assert classify(lambda: torch.arange(5).mean()).hypothesis == "dtype-mismatch"
    layer = nn.Linear(3, 2)
    c = classify(lambda: layer(torch.randn(4, 3, dtype=torch.float64)), model=layer)
    assert c.hypothesis == "dtype-mismatch" and c.op.startswith("Linear")
    x, meta = torch.randn(3), torch.zeros(3, device="meta")
    c = classify(lambda: x + meta)
    assert c.hypothesis == "device-mismatch" and c.devices == ["cpu", "meta"]
    ce, logits = nn.CrossEntropyLoss(), torch.randn(4, 3)
    column = torch.randint(0, 3, (4, 1))
    c = classify(lambda: ce(logits, column), loss_fn=ce, targets=column)
    assert c.hypothesis == "target-shape-mismatch" and c.op == "CrossEntropyLoss" and "[4, 1]" in c.sentence
    floats = torch.rand(4)
    assert classify(lambda: ce(logits, floats), loss_fn=ce, targets=floats).hypothesis == "labels-wrong-dtype"
    assert classify(lambda: ce(logits, torch.tensor([0, 1, 7, 2])), loss_fn=ce).hypothesis == "labels-out-of-range"
    assert classify(lambda: nn.BCELoss()(logits * 5, torch.rand(4, 3))).hypothesis == "loss-output-mismatch"


def test_layer_shape_inside_a_layer_is_not_an_op_shape():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(5, 2))
    c = classify(lambda: model(torch.randn(4, 3)), model=model)
    assert c.hypothesis == "layer-shape-mismatch" and c.op == "Linear '2'"


def test_batch_first_data_into_a_time_first_lstm_is_axes_swapped():
    # (batch, time, features) data and a hidden state built for the batch, into an LSTM without batch_first
    lstm = nn.LSTM(28, 16, 2)
    x = torch.randn(100, 28, 28)
    h0 = c0 = torch.zeros(2, x.size(0), 16)
    c = classify(lambda: lstm(x, (h0, c0)))
    assert c.hypothesis == "axes-swapped", c.sentence
    assert "batch_first" in c.sentence and "100" in c.sentence
    # a hidden state of the wrong batch for a batch_first layer is a plain shape mistake, not swapped axes
    first = nn.LSTM(28, 16, 2, batch_first=True)
    assert classify(lambda: first(x, (torch.zeros(2, 7, 16), torch.zeros(2, 7, 16)))).hypothesis == "layer-shape-mismatch"


def test_no_gradient_in_a_hand_written_update_is_disconnected():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    model[1](torch.randn(2, 3)).sum().backward()    # model[0] never reached

    def update():
        for p in model.parameters():
            p.data.add_(p.grad.data, alpha=-0.1)
    assert classify(update).hypothesis == "disconnected-parameters"


def test_unexplained_exception_is_unclassified():
    def boom():
        raise KeyError("config")
    c = classify(boom, model=nn.Linear(2, 2))
    assert c.hypothesis is None and "KeyError" in c.sentence


class _Shadowing(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def train(self, x, y):  # noqa: D401 - the bug under test
        return None


class _Overriding(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def train(self, mode: bool = True):
        return super().train(mode)


class _Misspelt(nn.Module):
    def __int__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)


def test_shadowed_methods_static_and_from_the_exception():
    [s] = shadowed_methods(_Shadowing())
    assert s.name == "train" and s.cls == "_Shadowing" and "x, y" in s.signature
    assert shadowed_methods(_Overriding()) == [] and shadowed_methods(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []
    model = _Shadowing()
    assert classify(lambda: model.eval(), model=model).hypothesis == "module-method-shadowed"


def test_no_parameters():
    model = _Misspelt()
    assert classify(lambda: torch.optim.Adam(model.parameters()), model=model).hypothesis == "no-parameters"
    assert classify(lambda: model(torch.randn(2, 3)), model=model).hypothesis == "no-parameters"


@pytest.mark.parametrize("name, outcome", [
    ("broken_target_shape_mismatch", "target-shape-mismatch"),
    ("broken_no_parameters", "no-parameters"),
    ("broken_module_method_shadowed", "module-method-shadowed"),
    ("broken_op_shape_mismatch", "op-shape-mismatch"),
    ("broken_dtype_mismatch", "dtype-mismatch"),
    ("broken_device_mismatch", "device-mismatch"),
])
def test_training_crash_probe_classifies_the_examples(name, outcome):
    result = run_probe_on("training-crash", load_example(name))
    assert result.status == "failed" and result.outcome == outcome, result.summary
    if outcome != "module-method-shadowed":
        assert result.data["training_raised"] and result.data["exception"]


def test_training_crash_quiet_on_healthy_and_user_functions():
    for name in ("healthy_mlp", "healthy_epoch_scheduler"):
        result = run_probe_on("training-crash", load_example(name))
        assert result.outcome == "ok", result.summary


# ----------------------------------------------------------------------------- honest verdicts
@probe("test-cannot-run", title="test: could not run", outcomes={"ok": "never"})
def _cannot(ctx: ProbeContext):
    return cannot_run("the user's forward raised", reason="raised")


@probe("test-fine", title="test: fine", outcomes={"ok": "quiet"})
def _fine(ctx: ProbeContext):
    return passed("nothing wrong")


TREE = """\
id: honest
title: Honest verdict test tree
symptoms: [flat]
start: first
nodes:
  first:
    probe: test-fine
    next: second
  second:
    probe: test-cannot-run
    next: against
  against:
    conclude:
      - {hypothesis: lr-too-high, weight: -0.8, evidence: "should not count"}
      - {hypothesis: lr-too-low, weight: 0.9, evidence: "should not count either"}
"""


def test_could_not_run_adds_no_evidence_and_is_inconclusive(tmp_path):
    path = tmp_path / "honest.yaml"
    path.write_text(TREE)
    tree = load_tree(path)
    engine = Engine(load_example("healthy_mlp"), {"honest": tree}, load_catalog(), ScriptedPrompter({}))
    diagnosis = engine.run(["flat"], {})
    assert diagnosis.evidence == [] and diagnosis.ranked == []
    report = build(diagnosis)
    assert report.verdict == "inconclusive"
    assert [(n.probe, n.why) for n in report.not_run] == [("test-cannot-run", "raised")]


def test_errored_probe_or_unclassified_crash_is_never_healthy():
    from nnwizard.probes.api import ProbeResult

    target = load_example("healthy_mlp")
    base = Diagnosis(target, 0, ["flat"], ["flat"], results=[ProbeResult("passed", "ok", "fine", id="a")])
    assert verdict(base) == "healthy"
    errored = Diagnosis(target, 0, ["flat"], ["flat"], results=[*base.results, ProbeResult("errored", "errored", "timed out", {"timeout_s": 5}, id="b")])
    assert verdict(errored) == "inconclusive" and build(errored).not_run[0].why == "timed-out"
    crash = Diagnosis(target, 0, ["crash"], ["crash"], results=[
        *base.results, ProbeResult("failed", "unclassified", "train_step raised", {"training_raised": True}, id="training-crash")])
    assert verdict(crash) == "inconclusive" and build(crash).not_run[0].why == "training-raised"



def test_a_loss_that_does_not_move_with_no_hypothesis_explaining_it_is_never_healthy(tmp_path):
    """The run's own curve is flat and no hypothesis reached 0.5: inconclusive, naming the curve (a report
    calling it healthy would contradict the curve it shows). A finding, or a curve of another shape (a stall,
    a spike: healthy runs have those on short runs), leaves the verdict as it was."""
    from nnwizard.probes.api import ProbeResult
    from nnwizard.ranking import Ranked
    from nnwizard.markdown import render_markdown

    target = load_example("healthy_mlp")
    flat = ProbeResult("failed", "flat", "over 127 steps the loss does not move: start 2.391, end 2.367", id="trace-run")
    quiet = Diagnosis(target, 0, ["flat"], ["auto"], results=[flat, ProbeResult("passed", "ok", "fine", id="a")],
                      ranked=[Ranked("lr-too-low", "LR too low", "optimization", 0.33)])
    report = build(quiet)
    assert report.verdict == "inconclusive"
    assert [(n.probe, n.why) for n in report.not_run] == [("trace-run", "loss-unmoved")]
    text = render_markdown(report, tmp_path / "r.md").read_text()
    assert "**Inconclusive**: over 127 steps the loss does not move" in text
    found = Diagnosis(target, 0, ["flat"], ["auto"], results=[flat], ranked=[Ranked("lr-too-low", "LR too low", "optimization", 0.78)])
    assert verdict(found) == "problems-found" and build(found).not_run == []
    stalled = Diagnosis(target, 0, ["stalled-high"], ["auto"], ranked=[Ranked("lr-too-low", "LR too low", "optimization", 0.33)],
                        results=[ProbeResult("failed", "stalled-high", "the loss stalls high", id="trace-run")])
    assert verdict(stalled) == "healthy"

@pytest.mark.gpu
def test_real_cuda_device_mismatch():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    layer = nn.Linear(3, 2).cuda()
    c = classify(lambda: layer(torch.randn(4, 3)), model=layer)  # weights on cuda, the batch on the CPU
    assert c.hypothesis == "device-mismatch"
