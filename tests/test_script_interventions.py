"""Script mode, issue #10 item 4: counterfactual reruns of the real script (probes/intervene.py) and the
model-level probes on the captured model. Each path: a tiny script with the fault (fires) and a
healthy one (quiet), written in tmp_path and run in this process."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from nnwizard.probes.api import ProbeContext, could_not_run, load_all
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

PROBES = load_all()

# a 4-class problem an MLP memorises in a few dozen steps; {LR}, {OPT}, {LOSS}, {SEED}, {EXTRA} are edited
BASE = '''
import math, time
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

{SEED}
g = torch.Generator().manual_seed(3)
x = torch.randn(256, 8, generator=g)
y = (x[:, :2] > 0).long() @ torch.tensor([1, 2])
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.{OPT}(model.parameters(), lr={LR})
for epoch in range(8):
    for step, (xb, yb) in enumerate(loader):
        optimizer.zero_grad()
        out = model(xb)
        loss = {LOSS}
        loss.backward()
        optimizer.step()
'''


# regression where the loop flattens the targets against the model's (N, 1) prediction
BROADCAST = BASE.format(LR="3e-3", OPT="Adam", SEED="torch.manual_seed(0)",
                        LOSS="F.mse_loss(out, yb.float().view(-1))").replace("nn.Linear(64, 4))", "nn.Linear(64, 1))")


def script(tmp_path: Path, name: str = "train.py", *, lr="1e-2", opt="Adam", loss="F.cross_entropy(out, yb)",
           seed="torch.manual_seed(0)", text: str | None = None) -> Path:
    path = tmp_path / name
    path.write_text(text or BASE.format(LR=lr, OPT=opt, LOSS=loss, SEED=seed), encoding="utf-8")
    return path


def target_of(path: Path, steps: int = 40) -> ScriptTarget:
    return ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=steps)))


def run(target, probe_id: str, **params):
    return PROBES[probe_id](ProbeContext(target, params=params))


# ------------------------------------------------------------------------------------ overfit
def test_a_rerun_that_raises_where_the_script_did_not_is_not_evidence(tmp_path):
    """The script refuses a batch it has seen before (its own check); its run never meets one, the one-batch
    rerun does at its second step. That rerun failing says nothing about the script: cannot_run, not failed."""
    text = BASE.format(LR="1e-2", OPT="Adam", SEED="torch.manual_seed(0)", LOSS="F.cross_entropy(out, yb)").replace(
        "        out = model(xb)\n",
        "        if step and torch.equal(xb, last):\n            raise RuntimeError('the same batch twice')\n"
        "        last = xb\n        out = model(xb)\n")
    result = run(target_of(script(tmp_path, text=text)), "script-overfit")
    assert result.status == "skipped" and result.data.get("cannot_run") == "rerun-raised", result.summary
    assert "the same batch twice" in result.summary


def test_overfit_memorises_one_batch_through_the_script(tmp_path):
    target = target_of(script(tmp_path))
    result = run(target, "script-overfit")
    assert result.outcome == "learns", result.summary
    assert result.data["steps"] == 40 and result.data["final_loss"] < 0.1 * result.data["first_loss"]
    assert "40 rerun steps of the same first batch" in result.summary
    assert target.reruns and target.reruns[-1].what.startswith("the first batch every step")


def test_overfit_repeats_the_random_draws_a_step_makes_after_its_batch(tmp_path):
    """A denoiser draws its target (the noise) inside the step, as a diffusion model does: with fresh noise every
    step one batch cannot be memorised, and a healthy script would read "stuck". The rerun puts the generators
    back where they stood at the first batch, so the step's draws repeat with it."""
    text = BASE.format(LR="1e-2", OPT="Adam", SEED="torch.manual_seed(0)", LOSS="F.mse_loss(out, noise)").replace(
        "nn.Linear(64, 4))", "nn.Linear(64, 8))").replace(
        "        out = model(xb)\n", "        noise = torch.randn_like(xb)\n        out = model(xb + noise)\n")
    target = target_of(script(tmp_path, text=text))
    result = run(target, "script-overfit")
    assert result.outcome == "learns", result.summary
    assert result.data["final_loss"] < 0.1 * result.data["first_loss"]


def test_overfit_measures_no_accuracy_when_the_loss_scores_something_computed_from_the_output(tmp_path):
    """A contrastive loss classifies similarities of the model's features (SimCLR): the argmax of the features is no
    prediction, and an "accuracy 0%" beside a loss that fell 94% contradicted itself."""
    text = BASE.format(LR="1e-2", OPT="Adam", SEED="torch.manual_seed(0)",
                       LOSS="F.cross_entropy((out @ out.t())[:, 1:], torch.zeros(len(out), dtype=torch.long))")
    result = run(target_of(script(tmp_path, text=text)), "script-overfit")
    assert result.data["accuracy"] is None and "accuracy" not in result.summary, result.summary


def test_overfit_measures_how_far_each_step_moves_the_parameters(tmp_path):
    """A batch that is not memorised reports how far a step moved the parameters (Adam at lr 30: a tenth of their
    size and more), so a reader can tell steps too small from steps that jump; a memorised batch adds no sentence."""
    big = run(target_of(script(tmp_path, lr="30.0", opt="Adam")), "script-overfit")
    assert big.outcome != "learns" and big.data["update_rel"] >= 0.1, big.summary
    assert "changed the parameters by" in big.summary
    fine = run(target_of(script(tmp_path, name="fine.py")), "script-overfit")
    assert fine.outcome == "learns" and fine.data["update_rel"] < 0.1, fine.summary
    assert "changed the parameters by" not in fine.summary


def test_same_batch_puts_the_generators_back_at_each_repeat():
    import torch

    from nnwizard.script_target import _SameBatch

    same = _SameBatch()
    first = (torch.zeros(4, 2), torch.zeros(4))
    assert same(first, 0) is first
    a = torch.rand(3)
    assert same((torch.ones(4, 2), torch.ones(4)), 1) is first   # the first batch, and the draws after it again
    assert torch.equal(torch.rand(3), a) and same.repeats == 1


def test_overfit_cannot_memorise_through_a_broadcasting_reshape(tmp_path):
    text = BROADCAST
    target = target_of(script(tmp_path, text=text))
    result = run(target, "script-overfit")
    assert result.outcome in ("stuck", "slow"), result.summary
    assert result.data["broadcast"] is True and result.data["broadcast_shape"] == [32, 32]
    assert "broadcast to [32, 32]" in result.summary


def test_overfit_skips_module_targets_and_repeats_fresh_tensors_without_a_loader(tmp_path):
    from nnwizard.target import load_target

    module = load_target("examples.healthy_mlp")
    assert run(module, "script-overfit").status == "skipped"
    text = ("import torch\nfrom torch import nn\nm = nn.Linear(4, 2)\no = torch.optim.SGD(m.parameters(), lr=0.1)\n"
            "for i in range(30):\n    x = torch.randn(8, 4)\n    o.zero_grad()\n"
            "    nn.functional.cross_entropy(m(x), (x[:, 0] > 0).long()).backward()\n    o.step()\n")
    result = run(target_of(script(tmp_path, text=text)), "script-overfit")   # new tensors every step, no DataLoader:
    assert result.data.get("first_step_repeated") and not could_not_run(result), result.summary   # the first repeated


# ------------------------------------------------------------------------------------ lr sweep
def test_lr_sweep_finds_a_rate_far_too_high(tmp_path):
    target = target_of(script(tmp_path, lr="0.5"))
    result = run(target, "script-lr-sweep")
    assert result.outcome == "too-high", result.summary
    assert result.data["drop_lr10"] > result.data["drop_lr"] + 0.1
    assert "2 reruns; x1 is the observed run" in result.summary
    assert [r.what for r in target.reruns] == ["learning rate x0.1, seed 0", "learning rate x10, seed 0"]


def test_lr_sweep_finds_a_rate_far_too_low(tmp_path):
    result = run(target_of(script(tmp_path, lr="1e-3", opt="SGD")), "script-lr-sweep")
    assert result.outcome == "too-low", result.summary
    assert result.data["reruns"] == 3 and result.data["drop_lrx100"] > result.data["drop_lr"] + 0.1


def test_lr_sweep_quiet_on_a_good_rate(tmp_path):
    result = run(target_of(script(tmp_path)), "script-lr-sweep")
    assert result.outcome == "ok", result.summary


def test_sweep_rule_never_calls_a_diverging_rate_too_low():
    from nnwizard.probes.lr import sweep_outcome

    assert sweep_outcome({0.1: 0.9, 1.0: -math.inf, 10.0: -math.inf}) == "too-high"
    assert sweep_outcome({0.1: 0.01, 1.0: 0.02, 10.0: 0.6}) == "too-low"
    # every arm ended above its start, lr*10 least (a per-sample RNN's 60 noisy steps): no direction
    assert sweep_outcome({0.1: -0.18, 1.0: -0.16, 10.0: -0.02}) == "none-learns"
    assert sweep_outcome({0.1: -0.02, 1.0: -0.16, 10.0: -0.4}) == "none-learns"
    assert sweep_outcome({0.1: -0.05, 1.0: -math.inf, 10.0: -math.inf}) == "too-high"   # the configured rate diverged



def test_sweep_rule_names_no_direction_when_the_configured_rate_trails_both_neighbours():
    """A noisy objective (a diffusion model) measured lr/10 +8%, lr -12%, lr*10 +6%: lr*10 "beats" lr, but lr/10 beats
    both. Neither direction is the answer, and a 20% noise margin holds off even lr/10's lead."""
    from nnwizard.probes.lr import BETTER, noise_margin, sweep_outcome

    d = {0.1: 0.08, 1.0: -0.12, 10.0: 0.06}
    assert sweep_outcome(d) == "too-high"          # (10% margin: lr/10 is the best arm, 20 points ahead)
    assert sweep_outcome({0.1: 0.06, 1.0: -0.12, 10.0: 0.08}) != "too-high"   # lr*10 ahead of lr/10
    assert sweep_outcome({0.1: 0.10, 1.0: -0.12, 10.0: 0.09}) != "too-low"   # lr*10 ahead of lr, not of lr/10
    assert sweep_outcome(d, margin=0.25) not in ("too-low", "too-high")
    quiet = [1.0 - 0.02 * i for i in range(30)]
    noisy = [1.0 + (0.2 if i % 2 else -0.2) for i in range(30)]
    assert noise_margin([quiet], 1.0, 7) == BETTER
    assert noise_margin([noisy, [x + 0.1 for x in noisy]], 1.0, 7) > 0.15
    assert noise_margin([noisy, quiet], 1.0, 7) == BETTER   # the quietest arm: a rate's own jumps are not noise


def test_lr_sweep_reruns_from_the_observed_runs_seed(tmp_path):
    from nnwizard.probes.api import ProbeContext

    target = ScriptTarget(run_script(load_script(str(script(tmp_path, lr="0.5"))), [], RunOptions(max_steps=40, seed=3)))
    result = PROBES["script-lr-sweep"](ProbeContext(target, params={}, seed=3))
    assert [r.what for r in target.reruns] == ["learning rate x0.1, seed 3", "learning rate x10, seed 3"], result.summary


# ------------------------------------------------------------------------------------ determinism
def test_determinism_quiet_when_the_script_seeds_itself(tmp_path):
    result = run(target_of(script(tmp_path), steps=10), "script-determinism")
    assert result.outcome == "ok", result.summary


def test_determinism_finds_a_script_that_never_seeds(tmp_path):
    result = run(target_of(script(tmp_path, seed=""), steps=10), "script-determinism")
    assert result.outcome == "unseeded", result.summary
    assert result.data["seeded_run"] == result.data["observed"] != result.data["unseeded_run"]


def test_determinism_finds_a_seed_from_the_clock(tmp_path):
    result = run(target_of(script(tmp_path, seed="torch.manual_seed(time.time_ns() % 100003)"), steps=10),
                 "script-determinism")
    assert result.outcome == "nondeterministic", result.summary


# ------------------------------------------------------------------------------------ nan bisect
NAN = '''
import torch
from torch import nn
torch.manual_seed(0)
x = torch.rand(64, 4) + 0.1
y = torch.rand(64, 1)
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    opt.zero_grad()
    scale = x.sum(1, keepdim=True) * (0.0 if step == 6 else 1.0)
    pred = model(x) + scale.log()
    loss = ((pred - y) ** 2).mean()
    loss.backward()
    opt.step()
'''


def test_nan_bisect_names_the_op_and_line_of_the_first_nan(tmp_path):
    path = script(tmp_path, "nan_train.py", text=NAN)
    target = target_of(path)
    result = run(target, "script-nan-bisect")
    assert result.status == "failed" and result.data["step"] == 7, result.summary
    assert result.data["op"] in ("log", "div") and result.data["where"].startswith("nan_train.py:12"), result.data
    assert target.reruns[-1].steps == 7


def test_nan_bisect_skips_a_finite_run(tmp_path):
    assert run(target_of(script(tmp_path)), "script-nan-bisect").status == "skipped"


# ------------------------------------------------------------------------------------ model level
SOFTMAX0 = BASE.format(LR="1e-2", OPT="Adam", SEED="torch.manual_seed(0)", LOSS="F.nll_loss(out.log(), yb)").replace(
    "nn.Linear(64, 4))", "nn.Linear(64, 4), nn.Softmax(dim=0))")


@pytest.mark.parametrize("text, outcome", [(SOFTMAX0, "batch-softmax"), (None, "ok")])
def test_batch_independence_on_the_captured_model(tmp_path, text, outcome):
    target = target_of(script(tmp_path, text=text) if text else script(tmp_path))
    assert target.capturable
    assert run(target, "batch-independence").outcome == outcome


def test_model_level_trees_run_on_a_capturable_script(tmp_path):
    from nnwizard.session import select_trees
    from nnwizard.tree import load_trees

    trees = select_trees(load_trees(None), target_of(script(tmp_path), steps=5))
    assert {"classics", "activations", "script-model", "script-interventions", "script-reproducibility"} <= set(trees)


def test_forward_shape_sees_the_broadcast_in_the_users_loss_call(tmp_path):
    text = BROADCAST
    target = target_of(script(tmp_path, text=text), steps=5)
    assert run(target, "forward-shape").outcome == "broadcast"
    assert run(target_of(script(tmp_path, "ok.py"), steps=5), "forward-shape").outcome == "ok"
    # the script's own squeeze(1) before the loss: no broadcast where the loss is concerned
    squeezed = BROADCAST.replace("F.mse_loss(out, yb.float().view(-1))", "F.mse_loss(out.squeeze(1), yb.float())")
    assert run(target_of(script(tmp_path, "squeezed.py", text=squeezed), steps=5), "forward-shape").outcome == "ok"


# ------------------------------------------------------------------------------------ tree gate
def test_reruns_are_not_made_when_the_recording_already_explains_the_run(tmp_path):
    from nnwizard.session import Options, diagnose

    text = BASE.format(LR="3e-3", OPT="Adam", SEED="torch.manual_seed(0)", LOSS="F.cross_entropy(out, yb)").replace(
        "        optimizer.zero_grad()\n", "")
    diagnosis = diagnose(Options(script=str(script(tmp_path, text=text)), symptoms=["oscillating"], max_steps=30))
    ran = {r.id for r in diagnosis.results}
    assert "trace-zero-grad" in ran and not ran & {"script-overfit", "script-lr-sweep"}
    assert diagnosis.target.reruns == []


# far too high a rate held finite by clipping: on one repeated batch the loss rises ~30x without a NaN
CLIPPED_HIGH = BASE.format(LR="1000", OPT="SGD", SEED="torch.manual_seed(0)", LOSS="F.cross_entropy(out, yb)").replace(
    "        optimizer.step()", "        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)\n        optimizer.step()")


def test_a_loss_that_rises_on_one_repeated_batch_is_not_read_as_a_rate_too_low(tmp_path):
    from nnwizard.session import Options, diagnose

    diagnosis = diagnose(Options(script=str(script(tmp_path, text=CLIPPED_HIGH)), symptoms=["oscillating"], max_steps=30))
    overfit = next(r for r in diagnosis.results if r.id == "script-overfit")
    assert overfit.outcome == "stuck" and overfit.data["ratio"] > 10, overfit.summary
    scores = {h.id: h.confidence for h in diagnosis.ranked}
    assert scores.get("lr-too-low", 0.0) <= 0.0 < scores.get("lr-too-high", 0.0), scores


@pytest.mark.slow
def test_cli_reports_the_reruns_of_an_lr_too_high_script(tmp_path):
    import json
    import subprocess
    import sys

    path = script(tmp_path, lr="0.5")
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    done = subprocess.run([sys.executable, "-m", "nnwizard", "diagnose", "--script", str(path), "--non-interactive",
                           "--symptom", "oscillating", "--json", str(out), "--report", str(md)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["hypotheses"][0]["id"] == "lr-too-high"
    sweep = next(p for p in report["probes"] if p["id"] == "script-lr-sweep")
    assert sweep["outcome"] == "too-high" and "2 reruns" in sweep["summary"]
    assert {"learning rate x0.1, seed 0", "learning rate x10, seed 0"} <= {r["what"] for r in report["script"]["reruns"]}
    assert "### Reruns of the script (interventions)" in md.read_text()


# a small-initialised 3-layer MLP under Adam: it sits on its plateau for a few dozen steps at any rate;
# at lr 2e-5 nothing moves in 60 steps, lr*100 leaves the plateau only after its first 30
PLATEAU = BASE.format(LR="{LR}", OPT="Adam", LOSS="F.cross_entropy(out, yb)", SEED="torch.manual_seed(0)").replace(
    "nn.Linear(64, 4))", "nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))\n"
    "with torch.no_grad():\n    for p in model.parameters():\n        p.mul_(0.05)")


def test_lr_sweep_gives_lr_x100_the_observed_runs_length_when_nothing_moved(tmp_path):
    result = run(target_of(script(tmp_path, text=PLATEAU.replace("{LR}", "2e-5")), steps=60), "script-lr-sweep")
    assert result.outcome == "too-low", result.summary
    assert result.data["drop_lrx100"] < 0.1 <= result.data["drop_long_lrx100"] and result.data["long_steps"] == 60
    assert "over the observed run's 60 steps lr*100" in result.summary


def test_lr_sweep_makes_no_long_rerun_when_the_rate_moves_the_loss(tmp_path):
    target = target_of(script(tmp_path, text=PLATEAU.replace("{LR}", "2e-3")), steps=60)
    result = run(target, "script-lr-sweep")
    assert result.outcome == "ok" and "long_steps" not in result.data, result.summary
    assert len(target.reruns) == 2


def _fake_run(losses):
    from types import SimpleNamespace

    from nnwizard.record import Recording
    from nnwizard.script_run import RunResult

    steps = [SimpleNamespace(loss=v, optimizer=0, step=i + 1, lrs=[1e-3]) for i, v in enumerate(losses)]
    return RunResult(script=None, args=[], recording=Recording(steps=steps), exit="finished")


def _judged(monkeypatch, observed, window_arms, long_lr10=None):
    """script-lr-sweep's judgement on made-up loss series: the observed run, each short rerun's (factor -> losses),
    and the lr/10 rerun over the observed run's length (None: asking for it fails the test)."""
    from types import SimpleNamespace

    from nnwizard.probes import intervene

    asked = []

    def rerun(ctx, target, steps, lr_scale=None, **kw):
        asked.append((lr_scale, steps))
        if lr_scale == 0.1 and steps > 10 and long_lr10 is not None:
            return _fake_run(long_lr10[:steps])
        return _fake_run(window_arms[lr_scale][:steps])

    monkeypatch.setattr(intervene, "rerun_script", rerun)
    target = SimpleNamespace(run=_fake_run(observed), recording=_fake_run(observed).recording, measured_step_s=0.1,
                             rerun_cost=lambda steps: steps + 5)
    reruns = {f: _fake_run(v) for f, v in window_arms.items() if f in (0.1, 10.0)}
    result = intervene._sweep_judged(ProbeContext(target, params={}), target, reruns, 10, 30, None)
    return result, asked


def _descent(start, end, n):
    return [start + (end - start) * i / (n - 1) for i in range(n)]


def test_a_window_where_nothing_moves_is_no_verdict_on_a_run_that_learnt(monkeypatch):
    flat = [2.3] * 10
    observed = [2.3] * 10 + _descent(2.3, 1.2, 50)      # a plateau, then it learns (no overshoot)
    result, asked = _judged(monkeypatch, observed, {0.1: flat, 10.0: flat, 100.0: flat})
    assert result.outcome == "ok" and "long_steps" not in result.data, result.summary
    assert "little moves over these 10 steps, but the observed run went on to remove" in result.summary
    assert all(steps == 10 for _, steps in asked)        # no long rerun: the observed run answers it


@pytest.mark.parametrize("lr10_end,outcome", [(1.6, "ok"), (0.6, "too-high")])
def test_a_too_high_window_on_an_overshoot_is_judged_by_lr10_over_the_observed_run(monkeypatch, lr10_end, outcome):
    observed = [2.3, 5.0, 4.2, 3.5, 3.0, 2.6] + _descent(2.5, 1.2, 54)    # up 2.2x at the first update, then learns
    arms = {0.1: _descent(2.3, 2.0, 10), 10.0: [2.3] + [9.0] * 9}
    result, asked = _judged(monkeypatch, observed, arms, long_lr10=_descent(2.3, lr10_end, 60))
    assert result.outcome == outcome and result.data["long_factor"] == 0.1 and result.data["long_steps"] == 60, result.summary
    assert (0.1, 60) in asked and "over the observed run's 60 steps lr/10" in result.summary
    table = next(a for a in result.artifacts if getattr(a, "rows", None))    # the long arm and the observed run beside it
    assert [r[1] for r in table.rows][-2:] == ["60", "60"] and table.rows[-1][0].startswith("x1 (observed)")
    plot = next(a for a in result.artifacts if not getattr(a, "rows", None))
    assert "lr x0.1, 60 steps" in plot.series and "lr x1 (observed), 60 steps" in plot.series



@pytest.mark.parametrize("lr100_end,outcome", [(1.5, "too-high"), (2.3, "skipped")])   # (skipped: nothing learnt in
# the 10 steps this made-up budget fits, of 30 wanted)
def test_a_rate_that_threw_the_loss_up_and_never_came_back_below_it_is_tried_at_lr100(monkeypatch, lr100_end, outcome):
    """pytorch/examples' mnist at lr x100 (Adadelta at 100): the loss jumps 29000x at the first update and the
    collapsed model sits at chance, lr/10 (still 10) too; only lr/100 learns. Without that arm the sweep read
    'none-learns', which counted against lr-too-high. A loss that did not blow up gets no lr/100 arm."""
    observed = [2.3, 6e4, 900.0] + [2.31] * 57
    flat = [2.3] + [2.33] * 9
    arms = {0.1: flat, 10.0: [2.3] + [80.0] * 9, 100.0: [2.3] + [5e3] * 9, 0.01: _descent(2.3, lr100_end, 10)}
    result, asked = _judged(monkeypatch, observed, arms)
    assert result.outcome == outcome, result.summary
    assert (0.01, 10) in asked and "lr/100 (1e-05)" in result.summary
    assert outcome != "too-high" or result.data["best_lr"] == 1e-5
    calm = [2.3] + [2.29] * 59    # nothing moved, nothing blew up: no lr/100 arm
    result, asked = _judged(monkeypatch, calm, {0.1: flat, 10.0: flat, 100.0: flat})
    assert result.outcome == "skipped" and all(f != 0.01 for f, _ in asked), result.summary

def test_lr_sweep_runs_on_a_hand_written_update_and_says_how(tmp_path):
    text = BASE.format(LR="1e-2", OPT="SGD", LOSS="F.cross_entropy(out, yb)", SEED="torch.manual_seed(0)").replace(
        "optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)\n", "").replace(
        "        optimizer.zero_grad()\n", "        model.zero_grad()\n").replace(
        "        optimizer.step()\n", "        for p in model.parameters():\n            p.data.add_(p.grad, alpha=-0.1)\n")
    result = run(target_of(script(tmp_path, text=text), steps=20), "script-lr-sweep")
    assert result.status != "skipped" and "by hand" in result.summary, result.summary
    assert result.data["reruns"] >= 2


def test_a_loss_that_rose_on_one_batch_is_stuck_even_when_the_rerun_ends_early(tmp_path):
    # three epochs: the rerun ends after 24 of the 40 steps it wants. A loss still falling then is too short a
    # run to judge; one that rose far above its start is not (too small a step never raises it)
    short = CLIPPED_HIGH.replace("range(8)", "range(3)")
    rose = run(target_of(script(tmp_path, text=short), steps=24), "script-overfit")
    assert rose.outcome == "stuck" and rose.data["steps"] < 40 and rose.data["ratio"] > 1.5, rose.summary
    slow = BASE.format(LR="1e-4", OPT="SGD", SEED="torch.manual_seed(0)", LOSS="F.cross_entropy(out, yb)").replace(
        "range(8)", "range(3)")
    result = run(target_of(script(tmp_path, "slow.py", text=slow), steps=24), "script-overfit")
    assert could_not_run(result) and result.data["ratio"] <= 1.5, result.summary


HAND_WRITTEN = '''
import torch
from torch import nn
torch.manual_seed(0)
x = torch.randn(256, 8)
y = (x[:, :2] > 0).long() @ torch.tensor([1, 2])
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
for step in range(200):
    loss = nn.functional.cross_entropy(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= {LR} * p.grad
'''


def test_lr_sweep_scales_a_hand_written_update_through_its_gradients(tmp_path):
    # no torch.optim: the reruns scale the gradients the script's own p -= lr * p.grad reads
    far_too_high = run(target_of(script(tmp_path, text=HAND_WRITTEN.format(LR="50.0"))), "script-lr-sweep")
    assert far_too_high.outcome == "too-high" and far_too_high.data["hand_written"], far_too_high.summary
    good = run(target_of(script(tmp_path, name="good.py", text=HAND_WRITTEN.format(LR="0.5"))), "script-lr-sweep")
    assert good.status == "passed" and "by hand" in good.summary, good.summary


def test_a_rate_too_low_is_judged_on_the_first_sixty_steps_however_long_the_run_was_watched(tmp_path):
    """SGD at 3e-3 on a problem lr 3e-2 solves: over a fast script's ~3 s run (here 400 steps) the loss creeps
    down more than 10%, which held off "too low" when the whole observed run counted (pytorch/tutorials' BoW
    classifier at lr/100 read healthy); the first 60 steps barely move, and lr*10 moves in 30."""
    text = BASE.format(LR="3e-3", OPT="SGD", LOSS="F.cross_entropy(out, yb)", SEED="torch.manual_seed(0)").replace(
        "range(8)", "range(60)")
    target = target_of(script(tmp_path, text=text), steps=400)
    observed = [s.loss for s in target.recording.steps]
    assert len(observed) == 400 and (observed[0] - sum(observed[-10:]) / 10) / observed[0] >= 0.1   # crept >= 10%
    result = run(target, "script-lr-sweep")
    assert result.outcome == "too-low", result.summary
    assert result.data["drop_observed"] < 0.1 and result.data["observed_steps"] == 400


def test_overshot_is_an_early_blow_up_the_run_then_learnt_from():
    from nnwizard.probes.intervene import _overshot

    recovered = [2.4, 4.2, 3.8, 3.8, 3.8, 4.1, 2.9, 2.6, 2.8, 2.4] + [2.3 - 0.03 * i for i in range(50)]
    assert _overshot(recovered)
    assert not _overshot([2.4, 2.5, 2.35] + [2.3 - 0.03 * i for i in range(57)])       # minibatch noise
    assert not _overshot([2.4, 5.0, 4.0] + [3.5] * 57)                                   # never learnt
    assert not _overshot(recovered[:15])                                                 # too short to judge


# Adam at 1e-3 on a CNN with a 4096-wide fully connected layer (BatchNorm, dropout): its first update throws the
# loss up ~1.8x, and it recovers within ten steps. A short sweep window sees lr/10 ahead; the judgement must
# come from lr/10 over the observed run's length
OVERSHOOT = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(1)
gen = torch.Generator().manual_seed(0)
templates = torch.randn(10, 3, 16, 16, generator=gen)
y = torch.randint(0, 10, (2048,), generator=gen)
x = 0.6 * templates[y] + torch.randn(2048, 3, 16, 16, generator=gen)
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 128, 3, padding=1), nn.BatchNorm2d(128)
        self.conv2, self.bn2 = nn.Conv2d(128, 256, 3, padding=1), nn.BatchNorm2d(256)
        self.dropout = nn.Dropout(0.25)
        self.fc1, self.fc2 = nn.Linear(256 * 4 * 4, 256), nn.Linear(256, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = self.dropout(torch.flatten(x, 1))
        return self.fc2(self.dropout(F.relu(self.fc1(x))))

model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(3):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
'''


@pytest.mark.slow
def test_an_early_overshoot_is_judged_on_lr10_over_the_observed_runs_length(tmp_path):
    from nnwizard.probes.intervene import _overshot, losses_of

    target = target_of(script(tmp_path, text=OVERSHOOT), steps=60)
    observed = len(losses_of(target.run))   # 60, or fewer where a loaded machine met the run's time limit first
    assert _overshot(losses_of(target.run)) and observed >= 40
    result = run(target, "script-lr-sweep", steps=10)   # a window of 10 steps (a slow step's budget): lr/10 ahead
    data = result.data
    assert data["drop_lr10"] >= data["drop_lr"] + 0.1 and data["drop_observed"] >= data["drop_lr10"] + 0.1, result.summary
    assert data.get("long_factor") == 0.1 and data["long_steps"] == observed, result.summary
    better = data["drop_long_lr10"] >= data["drop_long_observed"] + 0.1
    assert result.outcome == ("too-high" if better else "ok"), result.summary
    assert f"over the observed run's {observed} steps lr/10" in result.summary


LEAK = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)

class LeakNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return F.dropout(self.fc(x), 0.1, training=self.training)   # read by the recorder's train/eval check

model = LeakNet()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
for _ in range(5):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
'''


def test_reruns_do_not_keep_the_scripts_objects_alive(tmp_path):
    """Each rerun defines the script's classes anew; nothing of nnwizard may hold them (a class holds its script's
    globals and so its data: a cache keyed by class kept every rerun of a 4.6M CNN, 2.2 GB peak against 0.8)."""
    import gc

    from torch import nn

    def subclasses(cls):   # (held weakly by their base: a class listed here is alive)
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    target = target_of(script(tmp_path, text=LEAK), steps=5)
    for _ in range(3):
        target.rerun(max_steps=3)
    gc.collect()
    alive = [c for c in subclasses(nn.Module) if c.__name__ == "LeakNet"]
    assert len(alive) <= 1, f"{len(alive)} LeakNet classes alive (the observed run's and its reruns')"


def test_the_sweep_knows_when_its_window_ended_inside_a_warm_up():
    """A rate still rising 2x or more at the window's end is a warm-up not over (its 'too low' counts for less in the
    tree); a warm-up that ended inside the window, or a constant rate, is not."""
    from types import SimpleNamespace

    from nnwizard.probes.intervene import _warmup

    def rec(lrs):
        return SimpleNamespace(steps=[SimpleNamespace(lrs=[lr], optimizer=0) for lr in lrs])

    rising = _warmup(rec([0.01 * (k + 1) for k in range(30)]), None, 30)
    assert rising["warmup_rise"] == pytest.approx(30.0) and rising["warmup_to"] == pytest.approx(0.3)
    assert _warmup(rec([0.01 * min(k + 1, 10) for k in range(30)]), None, 30) == {}   # over by step 10
    assert _warmup(rec([0.1] * 30), None, 30) == {}
    assert _warmup(rec([0.01 * (k + 1) for k in range(30)]), 1, 30) == {}   # another optimizer's steps
