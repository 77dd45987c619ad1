"""The cheap parts of watch mode: the light recorder's bounded memory, its global module hooks only
while the models are being found, the gradient norm measured at an interval, and what is still
caught between two measured steps."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import nnwizard
from nnwizard.record import light as light_mod
from nnwizard.record.light import LightPolicy
from nnwizard.anomaly import Detector, Triggers
from nnwizard.record import Recorder
from nnwizard.record.light import LIGHT_KEEP


def _mlp():
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))


def _steps(model, opt, n, x=None):
    torch.manual_seed(1)
    crit = nn.CrossEntropyLoss()
    for _ in range(n):
        xb = torch.randn(8, 6) if x is None else x
        loss = crit(model(xb), torch.randint(0, 3, (8,)))
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_light_recording_keeps_a_bounded_window_and_counts_every_step(monkeypatch):
    # every step's norm due (the measured-cost interval is timing-dependent; its rule has its own tests)
    monkeypatch.setattr(LightPolicy, "norm_due", lambda self, n: True)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder("light") as rec:
        _steps(model, opt, LIGHT_KEEP + 44)
    r = rec.recording
    assert r.total_steps == LIGHT_KEEP + 44 and len(r.steps) == LIGHT_KEEP
    assert r.steps[-1].step == LIGHT_KEEP + 44 and r.steps[0].step == 45
    assert all(s.loss is not None for s in r.steps) and r.loss_calls == []
    assert r.norm_interval == 1 and all(s.grad_norm is not None for s in r.steps)


def test_global_module_hooks_go_once_the_models_are_known_and_come_back_for_a_new_optimizer():
    hooks = torch.nn.modules.module._global_forward_hooks
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder("light") as rec:
        assert len(hooks) == 1
        _steps(model, opt, 2)
        assert len(hooks) == 0  # the optimizer's parameters all belong to the model seen
        assert [m.name for m in rec.recording.models] == ["Sequential"]
        head = nn.Linear(3, 2)
        opt2 = torch.optim.SGD(head.parameters(), lr=0.01)  # a new optimizer over a model not seen yet
        assert len(hooks) == 1
        loss = head(model(torch.randn(4, 6))).sum()
        opt2.zero_grad()
        loss.backward()
        opt2.step()
        assert len(hooks) == 0 and [m.name for m in rec.recording.models] == ["Sequential", "Linear"]
    assert len(hooks) == 0


def test_standalone_light_recorder_leaves_the_loss_functions_alone():
    original = torch.nn.functional.cross_entropy
    with Recorder("light"):
        assert torch.nn.functional.cross_entropy is original
    with Recorder("light", listeners=[type("L", (), {"on_loss_args": lambda *a: None})()]):
        assert torch.nn.functional.cross_entropy is not original
    assert torch.nn.functional.cross_entropy is original


def test_gradient_norm_interval_follows_its_cost_and_every_logged_line_has_it(tmp_path, monkeypatch):
    monkeypatch.setattr(light_mod, "NORM_SHARE", 1e-9)  # any reduction is too dear: the longest interval
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nnwizard.watch(model, opt, out=tmp_path, every=5, tensorboard=False, quiet=True) as w:
        _steps(model, opt, 40)
    assert w._recorder is None
    lines = [json.loads(l) for l in (tmp_path / "watch.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 5, 10, 15, 20, 25, 30, 35, 40]
    assert all(l["grad_norm"] is not None and l["top_grads"] for l in lines)


def test_recorder_interval_is_one_when_the_reduction_is_cheap(monkeypatch):
    monkeypatch.setattr(light_mod, "NORM_SHARE", 1e9)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder("light") as rec:
        _steps(model, opt, 30)
    assert rec.recording.norm_interval == 1 and all(s.grad_norm is not None for s in rec.recording.steps)


def test_nan_gradient_with_a_finite_loss_between_measured_steps_is_caught_by_the_next_step(tmp_path, monkeypatch):
    """The gradient norm is measured every 10 steps here; a NaN gradient at step 13 (finite loss)
    makes the update NaN, so the loss of step 14 is NaN: caught one step later, within the interval."""
    monkeypatch.setattr(light_mod, "NORM_SHARE", 1e-9)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    weight = model[0].weight
    step = {"n": 0}
    weight.register_hook(lambda g: g * float("nan") if step["n"] == 13 else g)
    crit = nn.CrossEntropyLoss()
    torch.manual_seed(0)
    with nnwizard.watch(model, opt, out=tmp_path, every=10, tensorboard=False, quiet=True) as w:
        for _ in range(30):
            step["n"] += 1
            loss = crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
            assert torch.isfinite(loss) or step["n"] > 13
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert [(a.kind, a.step) for a in w.anomalies][:1] == [("nonfinite", 14)]
    assert [b.name for b in w.bundles] == ["anomaly-step14"]


def test_nan_gradient_on_a_measured_step_is_caught_at_that_step(tmp_path):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = {"n": 0}
    model[0].weight.register_hook(lambda g: g * float("nan") if step["n"] == 3 else g)  # steps 1-5 always measured
    crit = nn.CrossEntropyLoss()
    with nnwizard.watch(model, opt, out=tmp_path, tensorboard=False, quiet=True) as w:
        for _ in range(8):
            step["n"] += 1
            loss = crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert (w.anomalies[0].kind, w.anomalies[0].step) == ("nonfinite", 3)


def test_stalled_fires_on_zero_norms_measured_between_unmeasured_steps():
    d = Detector(Triggers(stall_steps=100))
    found = [a for a in (d.check(i, 1.0 + 0.01 * (i % 7), 0.0 if i % 10 == 0 else None) for i in range(1, 200)) if a]
    assert [a.kind for a in found] == ["stalled"] and found[0].step <= 111
    quiet = Detector(Triggers(stall_steps=100))
    assert not [a for a in (quiet.check(i, 1.0 + 0.01 * (i % 7), (0.0 if i % 20 else 1.0) if i % 10 == 0 else None)
                            for i in range(1, 200)) if a]


def _fast(det: Detector, series):
    """What watch does per step: quick(), and the full check only where quick() says so."""
    out = []
    for step, loss, norm in series:
        if not det.quick(step, loss, norm):
            a = det.check(step, loss, norm)
            if a:
                out.append((a.kind, a.step))
    return out


def _exact(det: Detector, series):
    return [(a.kind, a.step) for a in (det.check(*s) for s in series) if a]


def test_quick_path_fires_at_the_same_steps_as_a_full_check_every_step():
    import random

    rnd = random.Random(3)
    for trial in range(30):
        n = 400
        spike_at, nan_at, boom_at = rnd.randrange(30, n), rnd.randrange(30, n), rnd.randrange(30, n)
        series = []
        for i in range(1, n + 1):
            loss = 2.0 * 0.995 ** i + rnd.uniform(0, 0.05)
            norm = 1.0 + rnd.uniform(0, 0.3) if i % 3 == 0 else None  # measured every 3rd step
            if i == spike_at:
                loss *= rnd.choice([1.5, 3, 30])
            if i == nan_at and trial % 2:
                loss = rnd.choice([math.nan, math.inf, -math.inf])
            if i == boom_at and norm is not None:
                norm *= rnd.choice([5, 50])
            series.append((i, loss, norm))
        assert _fast(Detector(), series) == _exact(Detector(), series), trial


def test_stalled_is_decided_at_the_next_full_check_at_most_gap_steps_late():
    series = [(i, 1.0 if i > 30 else 2.0 - i * 0.01, None) for i in range(1, 300)]
    exact = _exact(Detector(Triggers(stall_steps=100)), series)
    fast = _fast(Detector(Triggers(stall_steps=100)), series)
    assert [k for k, _ in fast] == [k for k, _ in exact] == ["stalled"]
    assert 0 <= fast[0][1] - exact[0][1] < Detector().gap


def _watched_run(tmp_path, bad_step, make_bad, on_anomaly="continue", every=10, steps=60):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    crit = nn.CrossEntropyLoss()
    torch.manual_seed(0)
    before = {}
    with nnwizard.watch(model, opt, out=tmp_path, every=every, on_anomaly=on_anomaly, tensorboard=False,
                        quiet=True) as w:
        for i in range(1, steps + 1):
            loss = crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
            if i == bad_step:
                loss = make_bad(loss)
                before = {k: v.clone() for k, v in model.state_dict().items()}
            opt.zero_grad()
            loss.backward()
            opt.step()
    return w, model, before


def test_nan_loss_on_an_unlogged_unmeasured_step_fires_at_its_step_with_the_state_before_it(tmp_path, monkeypatch):
    monkeypatch.setattr(light_mod, "NORM_SHARE", 1e-9)  # the gradient norm only every 10 steps
    w, model, before = _watched_run(tmp_path, 37, lambda l: l * float("nan"), on_anomaly="stop")
    assert [(a.kind, a.step) for a in w.anomalies] == [("nonfinite", 37)]
    assert [b.name for b in w.bundles] == ["anomaly-step37"]
    # stopped inside step 37's optimizer.step(), before its update: the weights are those before it
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    lines = [json.loads(l) for l in (tmp_path / "watch.jsonl").read_text().splitlines()]
    assert lines[-1]["step"] == 37 and lines[-1]["anomaly"] == "nonfinite"


def test_loss_spike_on_an_unlogged_step_fires_at_its_step(tmp_path, monkeypatch):
    monkeypatch.setattr(light_mod, "NORM_SHARE", 1e-9)
    w, _, _ = _watched_run(tmp_path, 43, lambda l: l * 50.0)
    assert [(a.kind, a.step) for a in w.anomalies][:1] == [("loss-spike", 43)]
    assert [b.name for b in w.bundles][:1] == ["anomaly-step43"]


def test_light_step_records_are_the_dataclass_defaults_with_their_own_lists():
    from nnwizard.record import StepRecord, blank_step

    a, b = blank_step(7), blank_step(8)
    assert a == StepRecord(step=7, optimizer=-1, t=0.0)  # every field, as the dataclass makes it
    a.losses.append(1.0)
    a.forwards[0] = 1
    assert b.losses == [] and b.forwards == {}  # no list or dict shared between records


def test_light_recorder_counts_frozen_and_missing_gradients_like_the_full_one(tmp_path):
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3), nn.Linear(3, 3))
    model[0].bias.requires_grad_(False)  # frozen: not counted
    unused = nn.Parameter(torch.zeros(2))  # trainable, in the optimizer, never gets a gradient
    opt = torch.optim.SGD([{"params": list(model[0].parameters()) + list(model[2].parameters())},
                           {"params": list(model[3].parameters()) + [unused], "lr": 0.5}], lr=0.1)
    with Recorder("light") as rec:
        _steps(model, opt, 3)
    last = rec.recording.steps[-1]
    assert (last.grads_total, last.grads_none) == (6, 1) and last.lrs == [0.1, 0.5]
    assert last.grad_norm is not None and math.isfinite(last.grad_norm) and last.grad_norm > 0


@pytest.mark.parametrize("foreach_clone", [True, False])
def test_update_ratio_is_the_norm_of_the_step_over_the_weights_before_it(tmp_path, monkeypatch, foreach_clone):
    from nnwizard import watcher

    monkeypatch.setattr(watcher, "UPDATE_SHARE", 1e9)  # measured on every logged step
    if not foreach_clone:  # a torch without torch._foreach_clone: one clone per tensor
        monkeypatch.delattr(torch, "_foreach_clone", raising=False)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    crit = nn.CrossEntropyLoss()
    torch.manual_seed(0)
    expected = {}
    with nnwizard.watch(model, opt, out=tmp_path, every=5, tensorboard=False, quiet=True):
        for i in range(1, 11):
            loss = crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
            opt.zero_grad()
            loss.backward()
            before = [p.detach().clone() for p in model.parameters()]
            opt.step()
            norm = lambda ts: math.sqrt(sum(float(t.pow(2).sum()) for t in ts))  # noqa: E731
            expected[i] = norm([p.detach() - b for p, b in zip(model.parameters(), before)]) / norm(before)
    lines = {l["step"]: l for l in map(json.loads, (tmp_path / "watch.jsonl").read_text().splitlines())}
    assert sorted(lines) == [1, 5, 10]
    for step, line in lines.items():
        assert line["update_ratio"] == pytest.approx(expected[step], rel=1e-4)
    assert all(p.grad is None or p.grad.grad_fn is None for p in model.parameters())
    assert torch.is_grad_enabled()  # (the ratio's copy and difference ran with autograd off, then on again)


def test_logged_times_are_seconds_since_the_watch_was_made_also_when_its_recorder_starts_later(tmp_path):
    import time

    from nnwizard.watcher import Watch

    w = Watch(out=tmp_path, every=1, tensorboard=False, quiet=True)
    w._t0 -= 100.0  # as if made 100 s before its recorder started
    made = w._t0
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder("light", listeners=[w]) as rec:  # the CLI's order: the watch first, its recorder later
        w.start(recorder=rec)
        _steps(model, opt, 3)
    w.close()
    elapsed = time.monotonic() - made
    ts = [json.loads(l)["t"] for l in (tmp_path / "watch.jsonl").read_text().splitlines()]
    assert len(ts) == 3 and ts == sorted(ts) and 100 <= ts[0] and ts[-1] <= elapsed + 0.001


def test_light_gradient_norm_of_gradients_with_their_own_graph(monkeypatch):
    monkeypatch.setattr(LightPolicy, "norm_due", lambda self, n: True)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder("light") as rec:
        loss = model(torch.randn(8, 6)).pow(2).sum()
        opt.zero_grad()
        loss.backward(create_graph=True)  # (gradients that require grad themselves)
        expected = math.sqrt(sum(float(p.grad.detach().pow(2).sum()) for p in model.parameters()))
        opt.step()
    assert rec.recording.steps[-1].grad_norm == pytest.approx(expected, rel=1e-5)


def _climb(start, factor, n=60):
    return [(i, start * factor ** (i - 1), None) for i in range(1, n + 1)]


@pytest.mark.parametrize("losses, fires_at", [
    # word_language_model, AdamW at lr 5 (measured): a jump at step 2, then a slow climb that widens its own window
    ([8.4, 461.7, 791.1, 1174.8, 1386.0, 1583.6, 2015.7, 2069.2, 2368.4, 2268.6] + [2500.0 + i for i in range(40)], 4),
    # x1.2 a step from 8.4: past 100x the first five's median (12.1) at step 29, the third in a row at 31
    ([8.4 * 1.2 ** i for i in range(60)], 31),
])
def test_a_loss_that_leaves_its_start_for_good_is_a_divergence_also_inside_the_first_window(losses, fires_at):
    series = [(i, v, None) for i, v in enumerate(losses, 1)]
    exact, fast = _exact(Detector(), series), _fast(Detector(), series)
    assert exact == fast == [("loss-spike", fires_at)]


@pytest.mark.parametrize("series", [
    _climb(2.0, 0.98, 300),                                                             # a healthy fall
    [(i, 0.003 * (1 + 199 * (i % 17 == 0)), None) for i in range(1, 300)],             # converged, hard batches 200x
    [(i, (0.5 if i < 6 else 2.5) + 0.1 * (i % 3), None) for i in range(1, 200)],       # rose once (x5), then level
    [(i, 0.01 * (-1) ** i * (1 + i % 7), None) for i in range(1, 200)],                # a signed loss (policy gradient)
])
def test_divergence_stays_quiet_on_runs_that_do_not_leave_their_start(series):
    assert _exact(Detector(), series) == _fast(Detector(), series) == []


def test_divergence_is_not_judged_for_a_run_with_several_objectives():
    series = _climb(0.5, 1.2)   # a GAN's generator loss may rise by design
    assert _exact(Detector(solo=False), series) == []


def test_alternating_optimizers_each_get_their_logged_lines_and_no_divergence_check(tmp_path):
    gen, disc = _mlp(), _mlp()
    opt_g, opt_d = torch.optim.SGD(gen.parameters(), lr=0.01), torch.optim.SGD(disc.parameters(), lr=0.01)
    crit = nn.CrossEntropyLoss()
    torch.manual_seed(0)
    with nnwizard.watch(out=tmp_path, every=10, tensorboard=False, quiet=True) as w:
        for _ in range(40):
            for model, opt in ((disc, opt_d), (gen, opt_g)):
                loss = crit(model(torch.randn(8, 6)), torch.randint(0, 3, (8,)))
                opt.zero_grad()
                loss.backward()
                opt.step()
    lines = [json.loads(l) for l in (tmp_path / "watch.jsonl").read_text().splitlines()]
    by_opt = [sum(1 for l in lines if l.get("optimizer", 0) == k) for k in (0, 1)]
    assert by_opt == [5, 5]   # steps 1, 10, 20, 30, 40 of each optimizer's own 40
    assert all(not d.solo for d in w._detectors.values()) and len(w._detectors) == 2


# -- the watch folded into its own light recorder's hooks (Recorder(inline=watch)) ---------------------------------

def _fold_run(tmp_path, fused: bool, extra=None, steps: int = 60):
    """The same seeded run (a spike at step 31, a NaN input at step 47) watched by a watch that starts its own
    (fused) recorder, or as a plain listener of a separate light recorder (the CLI's way)."""
    from nnwizard.watcher import Watch

    torch.manual_seed(3)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    crit = nn.CrossEntropyLoss()
    w = Watch(model, opt, out=tmp_path, every=5, tensorboard=False, quiet=True)
    if fused:
        w.start()
        rec = w._recorder
        assert rec.inline is w and rec.policy.pre_listener == w.on_step_pre and rec.policy.post_listener == w.on_step_post   # called directly
    else:
        rec = Recorder("light", files=w.files, listeners=[w, *(extra or [])]).__enter__()
        w.start(recorder=rec)
        assert rec.inline is None
    try:
        for i in range(1, steps + 1):
            x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
            if i == 47:
                x[2, 1] = float("nan")  # (its backward: the loss call itself, watch's common case)
            loss = crit(model(x), y)
            if i == 31:
                loss = loss * 40.0  # (a scaled loss: watch relates it to the call through the graph)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        if not fused:
            rec.__exit__(None, None, None)
        w.close()
    return w, rec


def test_a_watch_folded_into_its_recorder_sees_and_writes_what_a_listening_watch_does(tmp_path, monkeypatch):
    from nnwizard import watcher

    monkeypatch.setattr(LightPolicy, "norm_due", lambda self, n: n % 3 == 0)  # (not timing-dependent)
    monkeypatch.setattr(watcher, "UPDATE_SHARE", 1e9)
    fused, frec = _fold_run(tmp_path / "fused", True)
    plain, prec = _fold_run(tmp_path / "plain", False)

    def lines(folder):
        out = []
        for l in map(json.loads, (folder / "watch.jsonl").read_text().splitlines()):
            for k in ("t", "step_s", "bundle_s", "bundle"):
                l.pop(k, None)
            out.append(l)
        return out

    assert lines(tmp_path / "fused") == lines(tmp_path / "plain") and len(lines(tmp_path / "fused")) >= 12
    assert [(a.kind, a.step, a.reason) for a in fused.anomalies] == [(a.kind, a.step, a.reason) for a in plain.anomalies]
    assert [(a.kind, a.step) for a in fused.anomalies][:2] == [("loss-spike", 31), ("nonfinite", 47)]
    assert [b.name for b in fused.bundles] == [b.name for b in plain.bundles] == ["anomaly-step31", "anomaly-step47"]
    for name in ("anomaly-step31", "anomaly-step47"):
        (a, ra), (b, rb) = ((torch.load(tmp_path / side / name / "batch.pt", weights_only=False),
                             torch.load(tmp_path / side / name / "rng.pt", weights_only=False)) for side in ("fused", "plain"))
        sa, sb = a["step"], b["step"]
        assert sa["backward"] == sb["backward"] and sa["replayable"] == sb["replayable"]
        assert [l["fn"] for l in sa["losses"]] == [l["fn"] for l in sb["losses"]] == ["cross_entropy"]
        assert len(sa["calls"]) == len(sb["calls"]) == 1 \
            and torch.allclose(sa["calls"][0]["args"][0], sb["calls"][0]["args"][0], rtol=0, atol=0, equal_nan=True)
        assert [r["step"] for r in a["ring"]] == [r["step"] for r in b["ring"]] == [int(name[12:]) - k for k in (4, 3, 2, 1)]
        assert torch.equal(ra["torch"], rb["torch"])  # the RNG state at the step's first forward, both ways
    # the recorders' own step records: the same values, one per step (no listener call doubled or lost)
    fields = ("step", "optimizer", "loss", "losses", "backwards", "grad_norm", "grads_total", "grads_none", "lrs",
              "zero_grad", "zero_grad_after_backward", "closure")
    assert repr([[getattr(s, f) for f in fields] for s in frec.recording.steps]) == \
        repr([[getattr(s, f) for f in fields] for s in prec.recording.steps])  # (repr: NaN == NaN)
    assert frec.recording.total_steps == prec.recording.total_steps == 60
    assert frec.recording.backwards == prec.recording.backwards == 60
    assert frec.recording.listener_errors == prec.recording.listener_errors == 0
    assert repr([h[:4] for h in fused._history]) == repr([h[:4] for h in plain._history])


def test_a_fused_recorder_still_tells_its_other_listeners_each_event_once(tmp_path):
    from nnwizard.watcher import Watch

    seen = {"on_loss_args": 0, "on_backward": 0, "on_step_pre": 0, "on_step_post": 0}

    class Spy:
        def __getattr__(self, name):
            if name not in seen:
                raise AttributeError(name)
            return lambda *a: seen.__setitem__(name, seen[name] + 1)

    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = Watch(model, opt, out=tmp_path, every=5, tensorboard=False, quiet=True)
    rec = Recorder("light", listeners=[w, Spy()], inline=w)
    with rec:
        w.start(recorder=rec)
        _steps(model, opt, 12)
        assert [r[0] for r in w._ring] == [9, 10, 11, 12]
    w.close()
    assert seen == dict.fromkeys(seen, 12)
    assert [h[0] for h in w._history] == list(range(1, 13))


def test_an_error_in_a_fused_watch_is_counted_and_the_run_goes_on(tmp_path, monkeypatch):
    from nnwizard import watcher

    def broken(self, *args):
        raise ValueError("watch bug")

    monkeypatch.setattr(watcher.Watch, "_step_full", broken)  # every logged step (and the first 5) fails
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nnwizard.watch(model, opt, out=tmp_path, every=5, tensorboard=False, quiet=True) as w:
        rec = w._recorder
        _steps(model, opt, 12)
    assert rec.recording.total_steps == 12 and rec.recording.listener_errors >= 3


def test_step_records_opened_by_a_backward_are_the_dataclass_defaults_with_their_own_lists():
    from nnwizard.record import StepRecord

    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder("light") as rec:
        _steps(model, opt, 3)
    a, b = rec.recording.steps[-2], rec.recording.steps[-1]
    assert set(vars(a)) == {f.name for f in __import__("dataclasses").fields(StepRecord)}
    assert a.losses is not b.losses and a.lrs is not b.lrs and a.forwards is not b.forwards
    assert (a.step, b.step, a.backwards, b.loss is not None) == (2, 3, 1, True)
