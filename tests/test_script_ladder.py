"""Script mode, issue #10 item 4: the simplify-ladder through the user's own script (probes/script_ladder.py).
Each rung is a rerun of the real script with one piece replaced while it runs (wizard/script_replace.py).
Tiny scripts written in tmp_path: a broken model, a broken hand-written loss, a broken optimizer setup
(each must point at its piece), a healthy one (quiet), and torch left exactly as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nnwizard.probes.api import could_not_run
from tests.test_script_interventions import BASE, run, target_of

HEALTHY = BASE.format(LR="1e-2", OPT="Adam", LOSS="F.cross_entropy(out, yb)", SEED="torch.manual_seed(0)")
# the model's forward throws the sign of every feature away: the labels are x[0] > 0, x[1] > 0
BROKEN_MODEL = HEALTHY.replace(
    "model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))",
    "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))\n"
    "    def forward(self, x):\n        return self.net(x.abs())\nmodel = Net()")
# a hand-written cross-entropy that forgot to pick the target's log-probability
BROKEN_LOSS = BASE.format(LR="1e-2", OPT="Adam", LOSS="-out.log_softmax(1).mean()", SEED="torch.manual_seed(0)")
# an optimizer imported by name, at a learning rate that cannot move anything in a few hundred steps
BROKEN_OPT = BASE.format(LR="1e-7", OPT="Adam", LOSS="F.cross_entropy(out, yb)", SEED="torch.manual_seed(0)").replace(
    "optimizer = torch.optim.Adam(", "from torch.optim import Adam\noptimizer = Adam(")


def ladder(tmp_path: Path, text: str, **params):
    path = tmp_path / "train.py"
    path.write_text(text, encoding="utf-8")
    target = target_of(path, 40)
    return target, run(target, "script-ladder", steps=40, **params)


def rungs(result) -> dict:
    return result.data["rungs"]


def test_ladder_stays_quiet_on_a_healthy_script(tmp_path):
    target, result = ladder(tmp_path, HEALTHY)
    assert result.status == "passed" and result.outcome == "ok", result.summary
    assert rungs(result) == {"your setup": "learns"} and len(target.reruns) == 1
    assert target.reruns[0].what.startswith("simplify-ladder: your setup")


def test_ladder_points_at_a_model_that_cannot_learn(tmp_path):
    target, result = ladder(tmp_path, BROKEN_MODEL)
    assert result.outcome == "model", result.summary
    assert rungs(result)["your setup"] == "does not learn" and rungs(result)["one-hidden-layer MLP"] == "learns"
    mlp = result.data["measured"]["model"]
    assert mlp["accuracy"] >= 0.9 and mlp["after"] < 0.5 * mlp["before"]   # measured in the rerun
    table = result.artifacts[0]
    assert table.columns[:3] == ["rung", "replaces", "result"] and len(table.rows) == 5


def test_ladder_points_at_a_broken_hand_written_loss(tmp_path):
    target, result = ladder(tmp_path, BROKEN_LOSS)
    assert target.recording.label_inputs == {}   # no loss function is called, but the labels never feed the model
    assert result.outcome == "loss", result.summary
    assert rungs(result)["cross-entropy loss"] == "learns"
    assert rungs(result)["your setup"] == "does not learn" and rungs(result)["one-hidden-layer MLP"] == "does not learn"


def test_ladder_points_at_the_optimizer_setup(tmp_path):
    target, result = ladder(tmp_path, BROKEN_OPT)
    assert result.outcome == "optimizer", result.summary
    assert rungs(result)["SGD(lr=0.01, momentum=0.9)"] == "learns"
    assert result.data["user_optimizer"] == "Adam" and result.data["user_lr"] == pytest.approx(1e-7)
    # the script's loss is one plain F.cross_entropy: the loss rung would change nothing
    assert rungs(result)["standard loss"] == "not run"


def test_rungs_that_cannot_run_say_why(tmp_path):
    # token ids into an embedding: no MLP can stand in without guessing how to read them
    text = HEALTHY.replace("x = torch.randn(256, 8, generator=g)", "x = torch.randint(0, 50, (256, 8), generator=g)") \
        .replace("y = (x[:, :2] > 0).long() @ torch.tensor([1, 2])", "y = (x[:, 0] % 4)") \
        .replace("nn.Sequential(nn.Linear(8, 64)", "nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(64, 64)") \
        .replace("lr=1e-2", "lr=1e-9")
    target, result = ladder(tmp_path, text)
    assert rungs(result)["one-hidden-layer MLP"] == "not run"
    row = next(r for r in result.artifacts[0].rows if r[0] == "one-hidden-layer MLP")
    assert "not one float tensor" in row[3]
    assert rungs(result)["synthetic y = x[0] > 0"] == "not run"   # integer inputs: no synthetic rule
    assert "model" not in result.data["measured"] and "data" not in result.data["measured"]


def test_ladder_skips_module_targets():
    from nnwizard.target import load_target

    assert run(load_target("examples.healthy_mlp"), "script-ladder").status == "skipped"


def test_ladder_that_does_not_fit_the_budget_is_skipped_with_the_reason(tmp_path):
    from nnwizard.budget import Budget
    from nnwizard.probes.api import ProbeContext
    from nnwizard.probes.api import load_all

    path = tmp_path / "train.py"
    path.write_text(BROKEN_OPT, encoding="utf-8")
    target = target_of(path, 40)
    ctx = ProbeContext(target, params={"steps": 40}, budget=Budget(total_s=0.5, step_s=0.05), allowance_s=0.1)
    result = load_all()["script-ladder"](ctx)
    assert could_not_run(result) and result.data["cannot_run"] == "budget", result.summary
    assert not target.reruns


def _torch_state():
    from torch.nn.modules import module
    from torch.optim import optimizer

    import sys
    optim = {(name, attr): value for name, m in list(sys.modules.items()) if name == "torch.optim" or name.startswith("torch.optim.")
             for attr, value in vars(m).items() if isinstance(value, type) and issubclass(value, torch.optim.Optimizer)}
    return dict(optim=optim, backward=(torch.Tensor.backward, torch.autograd.backward),
                hooks=(dict(module._global_forward_hooks), dict(module._global_forward_pre_hooks),
                       dict(optimizer._global_optimizer_pre_hooks), dict(optimizer._global_optimizer_post_hooks)),
                grad=torch.is_grad_enabled(), rng=torch.get_rng_state().clone(), ce=torch.nn.functional.cross_entropy)


def test_every_rung_leaves_torch_as_it_was(tmp_path):
    from nnwizard.probes.script_ladder import _mlp_for
    from nnwizard.script_replace import Meter, Subset, SwapLoss, SwapModel, SwapOptimizer

    path = tmp_path / "train.py"
    path.write_text(BROKEN_OPT, encoding="utf-8")
    target = target_of(path, 12)
    info = target.model_info
    before = _torch_state()
    made, why = _mlp_for(target, info, 0)
    assert why is None
    assert torch.equal(torch.get_rng_state(), before["rng"])   # the MLP is built from its own seed
    meter = Meter(info.index, info.name, target.task)
    model, loss, opt = SwapModel(info.index, info.name, *made), SwapLoss(meter), SwapOptimizer(0.01, 0.9)
    run = target.rerun(max_steps=12, replace_batch=Subset(4, target.task, 0, synthetic=True),
                       listeners=[model, meter], patches=[model, loss, opt, meter], what="all rungs at once")
    assert run.exit in ("stopped", "finished") and len(run.recording.steps) == 12
    assert model.replaced and model.steps == 12 and loss.used == {"cross-entropy": 12} and opt.replaced == ["Adam"]
    assert [o.name for o in run.recording.optimizers] == ["SGD"]
    after = _torch_state()
    assert after["optim"] == before["optim"] and after["backward"] == before["backward"]
    assert after["hooks"] == before["hooks"] and after["grad"] == before["grad"] and after["ce"] is before["ce"]
    assert torch.equal(after["rng"], before["rng"])
    assert not model.module._forward_hooks and not meter.module._forward_hooks


def test_standard_loss_for_the_observed_output_and_target():
    from nnwizard.script_replace import standard_loss

    logits = torch.randn(6, 3)
    assert standard_loss(logits, torch.tensor([0, 1, 2, 0, 1, 2]))[1] == "cross-entropy"
    assert standard_loss(torch.randn(6, 1), torch.randn(6))[1] == "MSE"
    assert standard_loss(logits, torch.tensor([0, 1, 5, 0, 1, 2])) is None   # labels outside the classes
    assert standard_loss(logits, torch.randn(4)) is None


def test_learn_rule_is_shared_with_module_mode():
    import nnwizard.probes.script_ladder as script
    from nnwizard.probes import ladder

    assert script.rung_learns is ladder.rung_learns and script.ladder_outcome is ladder.ladder_outcome
    assert ladder.rung_learns(1.4, 0.1, 1.0, 0.25) and not ladder.rung_learns(1.4, 1.3, 0.3, 0.25)
    assert not ladder.rung_learns(-0.1, -5.0, None, None)   # a loss that goes negative gives no ratio
    assert ladder.ladder_outcome({"setup": False, "model": True}) == "model"
    assert ladder.ladder_outcome({"setup": False, "loss": True}) == "loss"
    assert ladder.ladder_outcome({"setup": False, "optimizer": True}) == "optimizer"
    assert ladder.ladder_outcome({"setup": True}) == "ok"


@pytest.mark.slow
@pytest.mark.parametrize("text, outcome, top, rerun", [
    (BROKEN_LOSS, "loss", "loss-output-mismatch", "simplify-ladder: standard loss"),
    # the sweep's x100 of 1e-7 is still far below any working rate: it does not count against lr-too-low
    (BROKEN_OPT, "optimizer", "lr-too-low", "simplify-ladder: SGD(lr=0.01, momentum=0.9)"),
])
def test_cli_runs_the_ladder_when_the_cheaper_reruns_find_nothing(tmp_path, text, outcome, top, rerun):
    import json
    import subprocess
    import sys

    path = tmp_path / "train.py"
    path.write_text(text, encoding="utf-8")
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    done = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--script", str(path), "--non-interactive",
                           "--symptom", "flat", "--budget", "120", "--json", str(out), "--report", str(md)],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    ladder = next(p for p in report["probes"] if p["id"] == "script-ladder")
    assert ladder["outcome"] == outcome, ladder["summary"]
    assert report["hypotheses"][0]["id"] == top and report["verdict"] == "problems-found"
    # the evidence quotes the ladder's own numbers (no field left unfilled)
    assert all("(?)" not in e and "learns" in e for e in report["hypotheses"][0]["evidence"] if e.startswith("script-ladder"))
    assert any(r["what"].startswith(rerun) for r in report["script"]["reruns"])
    assert "| rung | replaces | result | loss (accuracy) | what that rules out |" in md.read_text()


@pytest.mark.slow
def test_cli_model_rung_is_weak_evidence_with_the_ladders_numbers(tmp_path):
    """A model that learns slower than a plain MLP in 40 steps looks like one that cannot learn: the model rung
    names model-cannot-fit below the finding line (as module mode's ladder names none), quoting its numbers."""
    import json
    import subprocess
    import sys

    path = tmp_path / "train.py"
    path.write_text(BROKEN_MODEL, encoding="utf-8")
    out = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--script", str(path), "--non-interactive",
                           "--symptom", "flat", "--budget", "120", "--json", str(out)],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    report = json.loads(out.read_text())
    top = report["hypotheses"][0]
    assert top["id"] == "model-cannot-fit" and top["confidence"] < 0.5
    assert all("(?)" not in e for e in top["evidence"]) and "one-hidden-layer MLP: learns" in top["evidence"][0]


# Forward-forward style (written for this test): no loss function at all. Each stage is trained on its own
# objective (high "goodness" for the input carrying its true label, low for a wrong one), and the label
# is part of the model's INPUT (written one-hot over the first K features), never a target. Stage 0 takes
# 48 steps, so a 40-step recording sees one model and one optimizer.
FORWARD_FORWARD = '''
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
K = 4
centers = 2 * torch.randn(K, 24)
labels = torch.randint(0, K, (512,))
images = centers[labels] + 0.5 * torch.randn(512, 24)
loader = DataLoader(TensorDataset(images, labels), batch_size=64, shuffle=True)


def with_label(x, y):
    out = x.clone()
    out[:, :K] = 0.0
    out[torch.arange(len(x)), y] = 3.0
    return out


class Stage(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)
        self.opt = torch.optim.Adam(self.parameters(), lr=0.01)

    def forward(self, x):
        return torch.relu(self.fc(F.normalize(x, dim=1)))

    def goodness(self, x):
        return self(x).pow(2).mean(1)


stages = [Stage(24, 64), Stage(64, 64)]
for i, stage in enumerate(stages):
    for epoch in range(6):
        for x, y in loader:
            wrong = (y + torch.randint(1, K, y.shape)) % K
            pos, neg = with_label(x, y), with_label(x, wrong)
            for earlier in stages[:i]:
                pos, neg = earlier(pos).detach(), earlier(neg).detach()
            objective = F.softplus(torch.cat([2.0 - stage.goodness(pos), stage.goodness(neg) - 2.0])).mean()
            stage.opt.zero_grad()
            objective.backward()
            stage.opt.step()
'''


def test_ladder_skips_an_objective_whose_labels_are_the_models_input(tmp_path):
    """Paired with the batch's labels, cross-entropy on the stage's 64 ReLU outputs "learns" where the script's
    own objective does not look like it does: with Recording.label_inputs erased, this very recording gives
    outcome "loss" (loss-output-mismatch on a healthy program). The labels went into the input: no target."""
    target, result = ladder(tmp_path, FORWARD_FORWARD)
    rec = target.recording
    assert [m.name for m in rec.models] == ["Stage"] and not any(s.loss_calls for s in rec.steps)
    line = FORWARD_FORWARD.splitlines().index("        return self(x).pow(2).mean(1)") + 1   # the model's call
    assert rec.label_inputs == {0: f"train.py:{line} in goodness"}
    assert result.status == "skipped" and result.outcome != "loss", result.summary
    assert "no target" in result.summary and f"train.py:{line}" in result.summary
    assert not target.reruns   # nothing was rerun to measure against the labels


def test_the_meter_pairs_no_output_with_labels_that_fed_the_input():
    from nnwizard.script_replace import Meter

    for fed, paired in ((False, True), (True, False)):
        meter = Meter(0, "Net", "classification", labels_fed=fed)
        meter.output, meter.label = torch.randn(8, 4), torch.randint(0, 4, (8,))
        assert (meter.pair() is not None) == paired
        meter.call = (torch.randn(8, 4), torch.randint(0, 4, (8,)), "cross_entropy")
        x, y = meter.pair()   # a loss call's target is paired either way
        assert x is meter.call[0] and y is meter.call[1]


@pytest.mark.parametrize("edits, fed", [
    ([], []),   # the labels reach only the loss
    # a label leaked into the features: concatenated one-hot
    ([("nn.Linear(8, 64)", "nn.Linear(12, 64)"), ("out = model(xb)", "out = model(torch.cat([xb, F.one_hot(yb, 4).float()], 1))")],
     ["Sequential"]),
    # a model conditioned on its label through another model (an embedding): both are fed with it
    ([("model = nn.Sequential(nn.Linear(8, 64)", "embed = nn.Embedding(4, 4)\nmodel = nn.Sequential(nn.Linear(12, 64)"),
      ("out = model(xb)", "out = model(torch.cat([xb, embed(yb)], 1))")], ["Sequential", "Embedding"]),
    # labels written in place into a copy of the input, through a reshape and a cast
    ([("out = model(xb)", "xin = xb.clone()\n        xin[:, 0] += yb.view(-1).float()\n        out = model(xin)")],
     ["Sequential"]),
])
def test_the_recording_follows_the_batchs_labels_into_a_models_input(tmp_path, edits, fed):
    text = HEALTHY
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "train.py"
    path.write_text(text, encoding="utf-8")
    rec = target_of(path, 12).recording
    assert sorted(rec.models[i].name for i in rec.label_inputs) == sorted(fed)
    assert all(where.startswith("train.py:") for where in rec.label_inputs.values())
