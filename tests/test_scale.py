"""The cost model (wizard/budget.py): step planning, limits, calibration, and probes cut by the
budget saying so instead of concluding; a train_step stuck in native ops ends the CLI cleanly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from nnwizard.budget import SLICE, SMALL_SLICE, Budget, calibrate, plan_steps
from tests.conftest import ROOT, diagnose_example, load_example, run_probe_on


def test_plan_steps_keeps_the_wanted_steps_when_they_fit():
    cheap = Budget(total_s=20.0, step_s=0.001)
    assert plan_steps(cheap, 4.0, 200, minimum=20) == 200
    assert plan_steps(None, None, 200) == 200  # nothing measured: as asked
    dear = Budget(total_s=60.0, step_s=0.5)
    assert plan_steps(dear, 10.0, 200, minimum=10) == 20
    assert plan_steps(dear, 10.0, 200, minimum=10, runs=2, fixed=4) == 0  # 8 per run < minimum 10
    assert plan_steps(dear, 0.0, 20, minimum=0) == 0


def test_allot_shares_the_budget_and_sizes_fixed_probes_by_their_cost():
    budget = Budget(total_s=100.0, step_s=2.0)
    budget.pending = {"triage-run": 0.3, "overfit-one-batch": 0.2, "activation-stats": 0.1}
    allowance, limit, reason, lendable = budget.allot(0.2, 1.0, 60.0, probe_id="overfit-one-batch")
    assert reason is None and allowance == pytest.approx(100.0 * 0.2 / 0.6, abs=0.1) and limit >= 60.0
    assert lendable == pytest.approx(100.0 * 0.4 / 0.6, abs=0.1)  # what the probes after it were to share
    assert budget.allot(0.3, 1.0, 60.0, probe_id="triage-run")[0] == pytest.approx(100.0 * 0.3 / 0.4, abs=0.2)
    allowance, limit, reason, _ = budget.allot(0.0, 14, 60.0)  # a fixed-cost audit: 14 steps of 2 s
    assert allowance is None and limit == pytest.approx(3 * 14 * 2.0 + 10)
    budget.timeouts = 1  # after a time-out: the cost, not the generous default
    assert budget.allot(0.0, 1, 60.0)[1] == pytest.approx(16.0)
    assert budget.allot(0.3, 1.0, 60.0, probe_timeout=5.0)[:2] == (4.0, 5.0)
    budget.started -= 150.0  # spent: a share probe gets nothing; past the ceiling nothing runs
    assert budget.allot(0.3, 1.0, 60.0)[0] == 0.0
    budget.started -= 100.0
    assert "past" in budget.allot(0.0, 1, 60.0)[2]


def test_pending_fixed_cost_audits_keep_their_declared_cost_at_a_slow_step():
    # 0.5 s a step, a 20 s budget: the audits still to come cost 12 + 14 steps = 13 s, far more than
    # the 1 s a 5% reserve kept; a budgeted probe allotted now gets only what is left beyond them
    budget = Budget(total_s=20.0, step_s=0.5)
    budget.fixed = {"determinism": 12, "step-audit": 14}
    budget.pending = {"overfit-one-batch": 0.2}
    assert budget.reserve_s() == pytest.approx(13.0)
    assert budget.spare() == pytest.approx(7.0, abs=0.05)
    allowance = budget.allot(0.2, 1.0, 60.0, probe_id="overfit-one-batch")[0]
    assert allowance == pytest.approx(7.0, abs=0.05)
    budget.fixed = {}  # once they ran, their time is the probes' again
    assert budget.allot(0.2, 1.0, 60.0, probe_id="overfit-one-batch")[0] == pytest.approx(20.0, abs=0.05)


def test_an_early_probe_leaves_later_probes_their_floors():
    budget = Budget(total_s=10.0, step_s=0.1)
    budget.pending = {"overfit-one-batch": 0.2, "triage-run": 0.3, "simplify-ladder": 0.2}
    budget.floors = {"overfit-one-batch": 23, "triage-run": 34, "simplify-ladder": 198}
    allowance, _, _, lendable = budget.allot(0.2, 1.0, 60.0, probe_id="overfit-one-batch", floor=23)
    # the ladder's floor (19.8 s) cannot fit the 10 s left, so it is not kept (the ladder will say so);
    # triage-run's 3.4 s is: overfit gets its own 2.3 s floor and its share of the 4.3 s beyond both
    assert allowance == pytest.approx(2.3 + 4.3 * 0.2 / 0.7, abs=0.05)
    assert 10.0 - allowance - lendable >= 3.4 - 0.05
    # while a probe that measures symptoms is still to come, the trees it may queue keep their share
    budget.pending = {"overfit-one-batch": 0.2, "triage-run": 0.3}
    budget.future = 0.5
    kept, _, _, lendable = budget.allot(0.2, 1.0, 60.0, probe_id="overfit-one-batch", floor=23)
    assert kept == pytest.approx(2.3 + 4.3 * 0.2 / 1.0, abs=0.05)
    # a cut run that cannot conclude may borrow from that share too (those trees run only if a symptom is measured)
    assert lendable == pytest.approx(4.3 * (0.3 + 0.5) / 1.0, abs=0.05)
    # a probe's own floor that does not fit what is left: it gets what is left (and plans from that)
    small = Budget(total_s=1.0, step_s=0.1)
    assert small.allot(0.2, 1.0, 60.0, probe_id="overfit-one-batch", floor=23)[0] == pytest.approx(1.0, abs=0.05)


def test_a_smallest_run_goes_ahead_past_nnwizards_own_budget_but_not_past_an_explicit_one():
    # an 85M GPT on a GPU: 38 ms steps, a 16 s default budget, and the fixed-cost audits overran it (model builds
    # that a step time does not price): overfit-one-batch still gets its floor (20 steps) and can conclude
    budget = Budget(total_s=16.0, step_s=0.04)
    budget.started -= 18.0
    budget.pending = {"overfit-one-batch": 0.2, "triage-run": 0.3}
    budget.floors = {"overfit-one-batch": 23, "triage-run": 30}
    assert budget.allot(0.2, 1.0, 60.0, probe_id="overfit-one-batch", floor=23)[0] == pytest.approx(23 * 0.04)
    assert budget.allot(0.3, 1.0, 60.0, probe_id="triage-run", floor=30)[0] == pytest.approx(30 * 0.04)
    firm = Budget(total_s=16.0, step_s=0.04, explicit=True)  # --budget 16: the limit is the user's
    firm.started -= 18.0
    assert firm.allot(0.2, 1.0, 60.0, probe_id="overfit-one-batch", floor=23)[0] == 0.0
    late = Budget(total_s=16.0, step_s=0.04)  # near the ceiling (2x): nothing more starts
    late.started -= 31.5
    assert late.allot(0.2, 1.0, 60.0, probe_id="overfit-one-batch", floor=23)[0] == 0.0


def test_the_engine_tells_the_budget_what_its_queued_trees_still_run():
    from nnwizard.catalog import load_catalog
    from nnwizard.engine import Engine
    from nnwizard.session import select_trees
    from nnwizard.tree import load_trees

    target = load_example("healthy_mlp")
    engine = Engine(target, select_trees(load_trees(), target), load_catalog(), None, budget=Budget(total_s=20.0, step_s=0.5))
    engine._queue = engine._trees_for(["auto"])
    overfit = next(n for t in engine._queue for n in t.nodes.values() if n.kind == "probe" and n.probe == "overfit-one-batch")
    engine._plan_ahead(overfit)
    budget = engine.budget
    assert "triage-run" in budget.pending and budget.floors["triage-run"] > 0 and "overfit-one-batch" not in budget.pending
    assert budget.fixed["step-audit"] == 14 and budget.reserve_s() > 0.05 * budget.total_s
    # triage-run measures symptoms: the trees one symptom may queue keep their share (oscillating's two
    # sweeps), but only the probes whose smallest runs fit what is left: at 0.5 s a step neither sweep does
    # (what is kept is a floor-less probe's share: nan-repair's 0.15)
    assert budget.future == pytest.approx(0.15)
    budget.step_s = 0.001
    engine._plan_ahead(overfit)
    assert budget.future == pytest.approx(0.45)
    budget.step_s = 0.02  # 3 s left: lr-sweep's 44 steps fit (0.9 s), oscillation's 204 beside them do not (4.1 s)
    engine._plan_ahead(overfit)
    budget.started -= budget.spare() - 3.0
    engine._plan_ahead(overfit)
    assert 0.15 < budget.future < 0.45
    from nnwizard.probes.api import ProbeResult

    for tree in engine._queue:  # everything ran: nothing is kept any more
        for node in tree.nodes.values():
            if node.kind == "probe":
                engine._cache[engine._key(node)] = ProbeResult("passed", "ok", "", {})
    engine._plan_ahead(overfit)
    assert budget.pending == {} and budget.fixed == {} and budget.future == 0.0


def test_calibrate_uses_a_measured_step_time_and_slices_dear_batches():
    target = load_example("healthy_mlp")
    target.measured_step_s = 0.25
    budget = calibrate(target)
    assert budget.step_s == 0.25 and budget.total_s == pytest.approx(0.8 * max(20.0, 40 * 0.25))
    assert budget.how == "measured in the real run" and budget.batch is None
    # a script's target sizes the default from its reruns (their steps and start-up: ScriptTarget.default_plain_steps)
    target.default_plain_steps = 130 + 4 * 5.0 / 0.25
    assert calibrate(target).total_s == pytest.approx(210 * 0.25)
    target.measured_step_s = 4.0       # 4 s steps (a loaded CPU): the reruns' steps would take 14 minutes; capped
    target.default_plain_steps = 210
    assert calibrate(target).total_s == pytest.approx(180.0)
    target.default_plain_steps = 50    # a fast script: the 20 s floor
    target.measured_step_s = 0.01
    assert calibrate(target).total_s == pytest.approx(0.8 * 20.0)
    del target.measured_step_s, target.default_plain_steps
    timed = calibrate(target, total_s=0.05)  # so small a budget that the user's batch is too dear
    assert timed.user_step_s > 0 and timed.how == "timed on the user's step" and timed.explicit
    # sliced only where a 16-sample step is measurably cheaper than the user's 64-sample one
    assert timed.batch in (None, SLICE, SMALL_SLICE) and "a plain step takes" in timed.describe()


def test_sliced_target_hands_out_sliced_batches():
    target = load_example("healthy_mlp")
    full = target.batch()
    target.sample_limit = 4
    x, y = target.batch()
    assert len(y) == 4 and torch.equal(x, full[0][:4])
    assert all(len(b[1]) == 4 for b in target.batches(2))
    assert all(len(b[1]) == 4 for b in target.loader("train", 2))
    # evaluation subsets: sliced batches, and a dataset that is exactly what the loader iterates
    subset = target.subset_loader("val", 3)
    assert [len(b[1]) for b in subset] == [4, 4, 4] and len(subset.dataset) == 12


def test_a_training_probe_borrows_its_minimum_from_what_is_left():
    target = load_example("healthy_cnn")
    from nnwizard.probes import ProbeContext

    plenty = ProbeContext(target, {}, {}, 0, budget=Budget(total_s=100.0, step_s=0.01), allowance_s=0.05)
    assert plenty.plan_steps(200, minimum=20, fixed=3) == 20 and plenty.plan["borrowed_s"] == pytest.approx(0.23)
    assert plenty.allowance_s == pytest.approx(0.23)
    spent = Budget(total_s=100.0, step_s=0.01)
    spent.started -= 99.9  # nothing left: no borrowing, the probe is skipped
    poor = ProbeContext(target, {}, {}, 0, budget=spent, allowance_s=0.05)
    assert poor.plan_steps(200, minimum=20, fixed=3) == 0 and "borrowed_s" not in poor.plan


def test_a_budget_cut_overfit_says_so_instead_of_calling_it_slow():
    target = load_example("healthy_cnn")
    from nnwizard.isolation import run_probe
    from nnwizard.probes import ProbeContext, get

    ctx = ProbeContext(target, {}, {}, 0, budget=Budget(total_s=10.0, step_s=0.01), allowance_s=0.3)
    result = run_probe(get("overfit-one-batch"), ctx)
    assert result.data["plan"]["planned"] < 200
    assert result.outcome in ("learns", "skipped") and result.status in ("passed", "skipped")
    if result.status == "skipped":
        assert result.data["cannot_run"] == "budget" and "budget" in result.summary
    nothing = ProbeContext(target, {}, {}, 0, budget=Budget(total_s=10.0, step_s=1.0), allowance_s=2.0)
    skipped = run_probe(get("overfit-one-batch"), nothing)
    assert skipped.status == "skipped" and skipped.data["cannot_run"] == "budget" and "fit fewer than" in skipped.summary


def test_overfit_reads_a_memorised_batch_as_learnt_but_not_a_capped_loss():
    from nnwizard.probes.sanity import overfit_outcome

    # every sample right and the loss down to a sixth of its start: memorised, even though not below 10%
    assert overfit_outcome([2.16, 1.2, 0.34], accuracy=1.0) == "learns"
    assert overfit_outcome([2.16, 1.2, 0.34], accuracy=0.88) == "slow"  # not every sample right yet
    assert overfit_outcome([2.16, 1.2, 0.34]) == "slow"  # no accuracy (regression): the loss alone decides
    # a loss with a floor (softmax into CrossEntropyLoss) reaches 100% accuracy but stays at about half its start
    assert overfit_outcome([1.36, 0.9, 0.749], accuracy=1.0) == "slow"


def test_a_softmax_fed_to_cross_entropy_stays_slow_at_full_accuracy():
    result = run_probe_on("overfit-one-batch", load_example("broken_double_softmax"))
    assert result.outcome == "slow" and result.data["accuracy"] == 1.0 and result.data["ratio"] > 1 / 3


class _Clock:
    """A fake monotonic clock the fake steps advance: no timed assertions."""

    def __init__(self):
        self.now = time.monotonic()  # from the real clock, so objects made before the patch agree with it

    def __call__(self):
        return self.now


def test_a_run_goes_past_its_plan_while_its_own_steps_fit(monkeypatch):
    from nnwizard.probes import ProbeContext
    from nnwizard.probes import api

    clock = _Clock()
    monkeypatch.setattr(api.time, "monotonic", clock)
    budget = Budget(total_s=100.0, step_s=0.1)  # calibrated at 0.1 s a step ...
    ctx = ProbeContext(load_example("healthy_mlp"), {}, {}, 0, budget=budget, allowance_s=2.0)
    planned = ctx.plan_steps(200, minimum=5)
    assert planned == 20
    done = 0
    while ctx.more_steps(done, planned, 200):
        clock.now += 0.02  # ... but the probe's own steps take 0.02 s: it runs what 2 s really fit
        done += 1
    assert 90 <= done <= 100 and ctx.plan["extended_to"] == done
    # a probe whose cut run cannot conclude may borrow part of what the probes after it were to share
    lender = ProbeContext(load_example("healthy_mlp"), {}, {}, 0, budget=budget, allowance_s=2.0, lendable_s=4.0)
    done = 0
    while lender.more_steps(done, planned, 200, borrow=True):
        clock.now += 0.02
        done += 1
    assert 190 <= done <= 200
    # ... but never into the smallest run of a budgeted probe still to come (triage-run's floor: about 34 steps)
    tight = Budget(total_s=7.0, step_s=0.1)
    tight.pending, tight.floors = {"triage-run": 0.3}, {"triage-run": 33.7}
    clock.now = time.monotonic()
    tight.started = clock.now
    keeper = ProbeContext(load_example("healthy_mlp"), {}, {}, 0, budget=tight, allowance_s=2.0, lendable_s=4.0)
    done = 0
    while keeper.more_steps(done, planned, 200, borrow=True):
        clock.now += 0.02
        done += 1
    assert 100 <= done < 190 and tight.spare() >= 3.3
    # without a budget the plan is the wanted count, and nothing runs past it
    free = ProbeContext(load_example("healthy_mlp"))
    assert free.plan_steps(50) == 50 and free.more_steps(49, 50, 50) and not free.more_steps(50, 50, 50)


def test_calibration_takes_the_median_step_so_one_slow_moment_does_not_misprice(monkeypatch):
    from nnwizard import budget as budget_module

    target = load_example("healthy_mlp")
    clock = _Clock()
    monkeypatch.setattr(budget_module.time, "perf_counter", clock)
    durations = iter([0.05, 0.01, 0.2, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01])
    real_step = target.train_step

    def step(model, batch, optimizer):
        clock.now += next(durations)  # warm-up, then one step slowed by a loaded moment
        return real_step(model, batch, optimizer)

    monkeypatch.setattr(target, "train_step", step)
    assert budget_module._timed_steps(target, target.batch(), 30.0) == pytest.approx(0.01)


def test_uncut_probes_run_as_before():
    result = run_probe_on("overfit-one-batch", load_example("healthy_mlp"))
    assert result.outcome == "learns" and result.data["plan"] == {"wanted": 200, "planned": 200, "runs": 1}


NATIVE_HANG = '''
import time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

def build_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, 0] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True), DataLoader(TensorDataset(x, y), batch_size=32)

loss_fn = nn.CrossEntropyLoss()

def train_step(model, batch, loss_fn, optimizer):
    # seconds inside native torch ops on every call (a stand-in for a model far too big for the machine)
    a = torch.randn(384, 384)
    started = time.monotonic()
    while time.monotonic() - started < 6:
        a = torch.tanh(a @ a)
    x, y = batch
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
'''


@pytest.mark.slow
def test_native_hang_ends_cleanly_and_never_healthy(tmp_path):
    module = tmp_path / "native_hang.py"
    module.write_text(textwrap.dedent(NATIVE_HANG))
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nnwizard", "diagnose", "-m", str(module), "-s", "auto", "--non-interactive",
         "--probe-timeout", "2", "--budget", "6", "--json", str(out), "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr and "Traceback" not in proc.stderr
    report = json.loads(out.read_text())
    assert report["verdict"] != "healthy"
    timed_out = [p for p in report["probes"] if "timeout_s" in p["data"]]
    assert timed_out and all(p["status"] == "errored" and "timed out" in p["summary"] for p in timed_out)
    # no evidence is drawn from a probe that timed out
    ids = {p["id"] for p in timed_out}
    for h in report["hypotheses"]:
        assert not any(m.get("probe") in ids and m["weight"] > 0 for m in h["moves"]), h
    assert report["budget"]["total_s"] == 6.0


def test_cancellation_ends_a_worker_in_the_user_code(tmp_path):
    """The stopped probe's worker is gone once run_probe returns: nothing keeps burning CPU."""
    import threading

    from nnwizard.isolation import run_probe
    from nnwizard.probes import ProbeContext, get

    module = tmp_path / "native_hang.py"
    module.write_text(textwrap.dedent(NATIVE_HANG))
    from nnwizard.target import load_target

    target = load_target(str(module), "cpu")
    before = threading.active_count()
    result = run_probe(get("overfit-one-batch"), ProbeContext(target), 1.0)
    assert result.status == "errored" and result.data["stopped"] is True
    assert threading.active_count() == before


def test_probes_a_confirmed_finding_makes_moot_are_not_run_and_say_so():

    diagnosis, _ = diagnose_example("broken_no_step")
    assert diagnosis.ranked[0].id == "missing-optimizer-step" and diagnosis.ranked[0].confidence >= 0.85
    moot = [r for r in diagnosis.results if r.data.get("cannot_run") == "not-needed"]
    assert moot and all(r.status == "skipped" and "missing-optimizer-step is already confirmed" in r.summary for r in moot)
    assert all(r.data["confirmed"] == "missing-optimizer-step" for r in moot)
    healthy, report = diagnose_example("healthy_mlp")
    assert report.verdict == "healthy"
    assert not [r for r in healthy.results if r.data.get("cannot_run") == "not-needed"]



def _dear_step(monkeypatch, step_s: float = 0.05, total_s: float = 16.0):
    """Sessions priced as if a step cost ``step_s`` (the tiny examples' real steps are far cheaper)."""
    import nnwizard.session as session

    monkeypatch.setattr(session, "calibrate", lambda target, total=None, limit_s=60.0: Budget(
        total_s=total_s, step_s=step_s, user_step_s=step_s, how="priced by the test"))


def test_a_run_the_budget_would_cut_is_not_needed_once_the_cheap_audits_confirm_a_finding(monkeypatch):
    # at 50 ms a step a 16 s budget cannot fit overfit-one-batch's 200 steps nor triage-run's 300; the cheap
    # audits (run first) already confirm the missing zero_grad, whose tree is walked after theirs: the
    # engine foresees that conclusion, so the cut runs are not run and say why instead of being budget cuts
    _dear_step(monkeypatch)
    diagnosis, _ = diagnose_example("broken_missing_zero_grad")
    assert diagnosis.ranked[0].id == "missing-zero-grad" and diagnosis.ranked[0].confidence >= 0.85
    moot = {r.id: r for r in diagnosis.results if r.data.get("cannot_run") == "not-needed"}
    assert {"overfit-one-batch", "triage-run"} <= set(moot)
    overfit = moot["overfit-one-batch"]
    assert overfit.status == "skipped" and "missing-zero-grad is already confirmed" in overfit.summary
    assert overfit.data["plan"]["fits"] < overfit.data["plan"]["wanted"] == 200 and "budget fits" in overfit.summary
    # no confirmed finding: the same cut runs run (and may go past their plan while their own steps fit)
    healthy, report = diagnose_example("healthy_mlp")
    assert not [r for r in healthy.results if r.data.get("cannot_run") == "not-needed"]
    assert next(r for r in healthy.results if r.id == "overfit-one-batch").status == "passed"


def test_a_run_that_fits_is_still_run_beside_a_confirmed_finding():
    # the tiny example's real step: everything fits, so the session's own trees run every probe as before
    diagnosis, _ = diagnose_example("broken_missing_zero_grad")
    overfit = next(r for r in diagnosis.results if r.id == "overfit-one-batch")
    assert overfit.data.get("cannot_run") is None and overfit.data["plan"]["planned"] == 200



def test_a_cut_triage_run_that_looks_stalled_goes_on_to_tell_a_standstill_from_a_slow_start():
    from nnwizard.probes import ProbeContext
    from nnwizard.probes.triage import _Extension

    target = load_example("healthy_mlp")
    ctx = ProbeContext(target, {}, {}, 0, budget=Budget(total_s=20.0, step_s=0.01), allowance_s=4.0)
    extend = _Extension(ctx, wanted=300, reference=2.3)
    assert extend.room == pytest.approx(0.5 * (20.0 - 4.0), abs=0.05)  # half of what is left beyond its allowance
    stalled = [2.3, 2.2, 2.1, 2.0] + [1.9 + 0.01 * (i % 2) for i in range(56)]
    out = {"train": stalled, "val": [], "val_steps": [], "epochs": 6}
    assert extend(out, 3.0) == pytest.approx(0.5) and extend.epochs == 1  # one epoch as the run's epochs cost
    falling = [2.3 - 0.02 * i for i in range(60)]
    assert extend({**out, "train": falling}, 3.0) == 0.0  # a clear curve needs no more steps
    assert extend({**out, "train": stalled * 5}, 3.0) == 0.0  # the wanted steps are the end
    extend.room = 0.2
    assert extend(out, 3.0) == 0.0  # never past its part of what is left
    ctx.budget.floors, ctx.budget.pending = {"capacity-check": 1000}, {"capacity-check": 0.15}
    kept = _Extension(ctx, wanted=300, reference=2.3)  # the floors of the probes still to come are not lent
    assert kept.room == pytest.approx(0.5 * (20.0 - 4.0 - 10.0), abs=0.05)


def test_a_cut_triage_run_that_looks_flat_goes_on_too():
    # a slow starter's first few dozen steps can be flat as well as stalled: the same question, the same answer
    from nnwizard.curves import Curves, classify
    from nnwizard.probes import ProbeContext
    from nnwizard.probes.triage import _Extension

    ctx = ProbeContext(load_example("healthy_mlp"), {}, {}, 0, budget=Budget(total_s=20.0, step_s=0.01), allowance_s=4.0)
    flat = [2.30 + 0.01 * (i % 3) for i in range(60)]
    assert classify(Curves(train=flat), 2.3).shape == "flat"
    extend = _Extension(ctx, wanted=300, reference=2.3)
    assert extend({"train": flat, "val": [], "val_steps": [], "epochs": 6}, 3.0) == pytest.approx(0.5)
    noisy = [2.3, 1.3] * 32  # oscillating: more steps do not change what a jump is
    assert classify(Curves(train=noisy), 2.3).shape == "oscillating"
    assert extend({"train": noisy, "val": [], "val_steps": [], "epochs": 6}, 3.0) == 0.0


def test_triage_prices_the_validation_batches_a_pass_really_reads():
    from nnwizard.probes.triage import _batches_read

    target = load_example("healthy_mlp")
    available = len(target.val_loader)
    assert _batches_read(target, available + 4) == available  # a small validation set costs what it holds
    assert _batches_read(target, 1) == 1
    target.val_loader = None
    assert _batches_read(target, 8) == 0


def test_a_cut_overfit_run_stops_as_soon_as_the_batch_is_memorised(monkeypatch):
    # memorised is memorised at any step count: the check does not wait for the planned minimum
    from nnwizard.probes import sanity

    monkeypatch.setattr(sanity, "_as_stepped", lambda target, model, batch: (0.1, 1.0))
    losses = [2.3, 1.5, 0.9, 0.6, 0.5]
    assert sanity._clear(None, None, None, losses) and sanity.CHECK_EVERY == len(losses)
    assert not sanity._clear(None, None, None, losses[:4])  # between checks: no forward spent
    monkeypatch.setattr(sanity, "_as_stepped", lambda target, model, batch: (1.2, 0.75))
    assert not sanity._clear(None, None, None, losses)  # a quarter of the samples still wrong: go on


def test_the_first_optimizers_imports_happen_before_the_session_clock_starts(monkeypatch):
    from nnwizard import budget as budget_module

    order = []
    monkeypatch.setattr(budget_module, "_import_optimizer_machinery", lambda: order.append("import"))

    class Clocked(Budget):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)  # the clock starts here (Budget.started)
            order.append("clock")

    monkeypatch.setattr(budget_module, "Budget", Clocked)
    target = load_example("healthy_mlp")
    target.measured_step_s = 0.01
    budget_module.calibrate(target)
    assert order == ["import", "clock"]



def test_label_leak_column_quantiles_are_torch_quantile_to_the_bit():
    from nnwizard.probes.leakage import _column_quantiles

    q = torch.linspace(0, 1, 11)[1:-1]
    g = torch.Generator().manual_seed(0)
    for x in (torch.randn(301, 40, generator=g), torch.randint(0, 5, (200, 30), generator=g).float()):
        assert torch.equal(_column_quantiles(x, q), torch.quantile(x, q, dim=0).T.contiguous())


SLOW_SCRIPT = '''
import time
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
for step in range(30):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    time.sleep(0.25)  # a step of a model far too large for the default time limit
    opt.step()
'''


def test_a_slow_scripts_time_limit_grows_to_fit_a_readable_run(tmp_path):
    from nnwizard.script_run import RunOptions, StepFit, load_script, run_script

    path = tmp_path / "slow.py"
    path.write_text(SLOW_SCRIPT)
    plain = run_script(load_script(str(path)), [], RunOptions(max_steps=12, time_limit_s=0.8))
    assert plain.recording.total_steps < StepFit.STEPS and "time limit" in plain.recording.stopped
    fitted = run_script(load_script(str(path)), [], RunOptions(max_steps=12, time_limit_s=0.8, listeners=[StepFit()]))
    assert fitted.recording.total_steps >= StepFit.STEPS
    assert any(note.startswith("time limit raised") for note in fitted.recording.notes)
    # a fast script keeps its limit: nothing raised
    fast = run_script(load_script(str(path)), [], RunOptions(max_steps=3, time_limit_s=30.0, listeners=[StepFit()]))
    assert not any(note.startswith("time limit raised") for note in fast.recording.notes)


SLOW_START_SCRIPT = SLOW_SCRIPT.replace("    time.sleep(0.25)", "    time.sleep(1.0 if step == 0 else 0.25)  # lazy set-up in the first step")


def test_a_first_step_that_ends_past_the_time_limit_still_gets_a_measured_second_step(tmp_path):
    # the first step ends past the limit (start-up plus a slow step): the run is not cut at one step
    # before StepFit can measure a step; the second step then sizes the limit as usual
    from nnwizard.script_run import RunOptions, StepFit, load_script, run_script

    path = tmp_path / "slow_start.py"
    path.write_text(SLOW_START_SCRIPT)
    plain = run_script(load_script(str(path)), [], RunOptions(max_steps=12, time_limit_s=0.8))
    assert plain.recording.total_steps == 1 and "time limit" in plain.recording.stopped
    fitted = run_script(load_script(str(path)), [], RunOptions(max_steps=12, time_limit_s=0.8, listeners=[StepFit()]))
    assert fitted.recording.total_steps >= StepFit.STEPS
    assert any("to measure a second step" in note for note in fitted.recording.notes)


def test_triage_keeps_the_users_batch_when_it_learns_from_more_samples_a_second():
    from nnwizard.probes import ProbeContext
    from nnwizard.probes.triage import MIN_STEPS, _own_batch

    target = load_example("healthy_mlp")
    target.sample_limit = 16

    def own(user_step_s, allowance_s):
        budget = Budget(total_s=20.0, step_s=0.02, user_step_s=user_step_s, batch=16, user_batch=64)
        return _own_batch(ProbeContext(target, {}, {}, 0, budget=budget, allowance_s=allowance_s), 300, 8)

    # 64 samples in 0.04 s against 16 in 0.02 s (per-layer overhead): the user's batch, priced at 2 session steps
    kept, price = own(0.04, 5.0)
    assert kept.sample_limit is None and target.sample_limit == 16 and price == pytest.approx(2.0)
    assert kept.batch()[1].shape[0] > 16
    assert own(0.09, 5.0) is None  # 64 samples in 0.09 s: the slice sees more a second
    assert own(0.04, MIN_STEPS * 0.04) is None  # the user's batch would not fit a curve's minimum
    target.sample_limit = None
    assert own(0.04, 5.0) is None  # nothing sliced: nothing to keep
