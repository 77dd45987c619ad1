"""Watch mode: the anomaly triggers, the context manager, bundles, and replay of a bundle's step."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from torch import nn

import nnwizard
from nnwizard.anomaly import Detector, Triggers


# ------------------------------------------------------------------------------------ triggers
def _feed(values, norms=None):
    d = Detector(Triggers())
    norms = norms or [1.0] * len(values)
    return [a for a in (d.check(i + 1, v, g) for i, (v, g) in enumerate(zip(values, norms))) if a]


def _noisy_descent(n, seed=0, floor=0.0):
    rnd = random.Random(seed)
    return [floor + 2.3 * math.exp(-i / 60) * (1 + 0.3 * rnd.random()) + 0.05 * rnd.random() for i in range(n)]


def test_healthy_noisy_descent_is_quiet():
    assert _feed(_noisy_descent(600)) == []


def test_converged_run_with_a_hard_batch_is_quiet():
    losses = [2.3, 1.5, 0.9, 0.5, 0.3] + [1e-3 * (1 + random.Random(i).random()) for i in range(300)]
    losses[250] = 0.014  # 14x the recent range, but far below the run's own scale
    norms = [1.0] * 5 + [0.005] * 300
    norms[250] = 0.2
    assert _feed(losses, norms) == []


def test_nonfinite_fires_once_at_its_step():
    losses = _noisy_descent(100) + [math.nan] * 5
    found = _feed(losses)
    assert [(a.kind, a.step) for a in found] == [("nonfinite", 101)]


def test_loss_spike_fires():
    losses = _noisy_descent(300)
    losses[200] = 5.0
    found = _feed(losses)
    assert [(a.kind, a.step) for a in found] == [("loss-spike", 201)]


def test_gradient_explosion_fires():
    norms = [1.0 + 0.1 * (i % 3) for i in range(200)]
    norms[150] = 80.0
    found = _feed(_noisy_descent(200), norms)
    assert [(a.kind, a.step) for a in found] == [("grad-explosion", 151)]


def test_stalled_loss_fires():
    losses = _noisy_descent(50) + [0.693147] * 150
    found = _feed(losses)
    assert [a.kind for a in found] == ["stalled"]


# ----------------------------------------------------------------------- the context manager
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _loop(out, bad_step=None, steps=120, on_anomaly="continue", every=10, value=float("nan")):
    torch.manual_seed(0)
    model, crit = Net(), nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    X = torch.randn(1200, 8)
    Y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long()
    done = 0
    with nnwizard.watch(model, opt, out=out, on_anomaly=on_anomaly, every=every, tensorboard=False, quiet=True) as w:
        for i in range(steps):
            x, y = X[i * 10:(i + 1) * 10].clone(), Y[i * 10:(i + 1) * 10]
            if bad_step is not None and i + 1 == bad_step:
                x[4, 0] = value
            loss = crit(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
    return w, done, model


def test_watch_logs_healthy_run_without_bundles(tmp_path):
    w, done, _ = _loop(tmp_path / "w")
    assert done == 120 and w.bundles == [] and w.anomalies == []
    lines = [json.loads(l) for l in (tmp_path / "w" / "watch.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines][:3] == [1, 10, 20]
    for key in ("step", "loss", "grad_norm", "lr", "top_grads", "update_ratio", "nonfinite"):
        assert key in lines[-1]
    assert math.isfinite(lines[-1]["loss"])
    ratios = [l["update_ratio"] for l in lines if l["update_ratio"] is not None]  # measured as its cost allows
    assert ratios and all(r > 0 for r in ratios)


def test_watch_saves_bundle_at_first_nan_step_and_continues(tmp_path):
    w, done, _ = _loop(tmp_path / "w", bad_step=70)
    assert done == 120
    assert [b.name for b in w.bundles] == ["anomaly-step70"]
    meta = json.loads((w.bundles[0] / "meta.json").read_text())
    assert meta["step"] == 70 and meta["trigger"] == "nonfinite" and meta["replayable"]
    assert meta["ring_steps"] == [66, 67, 68, 69]
    state = torch.load(w.bundles[0] / "state.pt", weights_only=False)
    # weights from before the step: finite (the NaN step's update made the live model NaN)
    assert all(torch.isfinite(p).all() for p in state["models"]["model"].parameters())
    lines = [json.loads(l) for l in (tmp_path / "w" / "watch.jsonl").read_text().splitlines()]
    flagged = [l for l in lines if l.get("anomaly")]
    assert flagged and flagged[0]["step"] == 70 and flagged[0]["bundle"].endswith("anomaly-step70")


def test_watch_stop_ends_the_loop_before_the_bad_update(tmp_path):
    w, done, model = _loop(tmp_path / "w", bad_step=70, on_anomaly="stop")
    assert done == 69 and w.stopped and "step 70" in w.stopped
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the NaN update never happened


def test_replay_names_the_bad_batch_and_the_line(tmp_path):
    from nnwizard.replay import replay, report_dict

    w, _, _ = _loop(tmp_path / "w", bad_step=70)
    diagnosis, target = replay(w.bundles[0])
    data = report_dict(diagnosis, target)
    assert data["mode"] == "replay" and data["step"] == 70
    assert data["hypotheses"][0]["id"] == "nan-in-inputs"
    assert data["localised"]["phase"] == "inputs" and data["localised"]["rows"] == [4]
    assert "test_watch.py" in data["localised"]["where"]


def test_replayed_batches_go_to_the_device_but_their_rng_state_stays_on_the_cpu(tmp_path):
    """torch.random.set_rng_state takes a CPU tensor only: moved to CUDA with the batch, every replayed step
    raised there (an H200: nan-in-inputs named, no rows localised). The meta device stands in for CUDA."""
    from nnwizard.bundle import load_bundle
    from nnwizard.replay import ReplayTarget

    w, _, _ = _loop(tmp_path / "w", bad_step=70)
    target = ReplayTarget.from_bundle(load_bundle(w.bundles[0]), torch.device("meta"))
    inputs, targets, about = target.batches(1)[0]
    assert inputs["calls"][0]["args"][0].device.type == "meta" and targets["targets"][0].device.type == "meta"
    assert about["rng"].device.type == "cpu"
    torch.random.set_rng_state(about["rng"])   # what the replayed step does first


def test_replay_of_a_finite_step_is_not_reproduced_as_nan(tmp_path):
    """A bundle of a healthy step (forced trigger) must not produce NaN findings."""
    from nnwizard.replay import replay, report_dict

    torch.manual_seed(0)
    model, opt = Net(), None
    opt = torch.optim.SGD(model.parameters(), 0.1)
    trig = Triggers(window=5, min_history=3, spike_ranges=0.0, spike_floor=0.0, explode_factor=1e9)
    X, Y = torch.randn(400, 8), torch.randint(0, 3, (400,))
    with nnwizard.watch(model, opt, out=tmp_path / "w", triggers=trig, tensorboard=False, quiet=True) as w:
        for i in range(40):
            loss = nn.functional.cross_entropy(model(X[i * 10:(i + 1) * 10]), Y[i * 10:(i + 1) * 10])
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert w.bundles, "the forced trigger should have saved a bundle"
    data = report_dict(*replay(w.bundles[0]))
    ids = {h["id"] for h in data["hypotheses"] if h["confidence"] >= 0.5}
    assert not ids & {"nan-in-inputs", "missing-epsilon", "bad-batch"}
    swap = next(p for p in data["probes"] if p["id"] == "replay-swap")
    assert swap["outcome"] == "not-reproduced"


def test_replay_calls_an_extreme_batch_a_bad_batch(tmp_path):
    from nnwizard.replay import replay, report_dict

    w, _, _ = _loop(tmp_path / "w", bad_step=70, value=-1e6)
    assert [b.name for b in w.bundles][:1] == ["anomaly-step70"]
    data = report_dict(*replay(w.bundles[0]))
    batch = next(p for p in data["probes"] if p["id"] == "replay-batch")
    assert batch["outcome"] == "extreme" and batch["data"]["rows"] == [4]
    assert data["hypotheses"][0]["id"] == "bad-batch"


def test_curve_reads_the_watch_log(tmp_path):
    from nnwizard.curve_cmd import analyse

    _loop(tmp_path / "w", bad_step=70, steps=100, every=5)
    curves, shape = analyse(tmp_path / "w" / "watch.jsonl")
    assert shape.shape == "diverged" and shape.step == 70


def test_tensorboard_scalars_when_installed(tmp_path):
    pytest.importorskip("tensorboard")
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    with nnwizard.watch(model, opt, out=tmp_path / "w", every=2, tensorboard=True, quiet=True):
        for _ in range(6):
            loss = nn.functional.cross_entropy(model(torch.randn(8, 8)), torch.randint(0, 3, (8,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    from nnwizard.curves import read_log

    curves = read_log(tmp_path / "w" / "tensorboard")
    assert len(curves.train) == 4  # steps 1, 2, 4, 6


# ------------------------------------------------------------------------------------ exact replay
class _FunctionalDropout(nn.Module):
    """Randomness inside forward, no Dropout module: only the RNG state can make its replay exact."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.b(nn.functional.dropout(torch.relu(self.a(x)), 0.5, self.training))


@pytest.mark.parametrize("kind", ["module", "functional"])
def test_bundle_of_a_dropout_model_replays_its_step_bit_exactly(tmp_path, monkeypatch, kind):
    from nnwizard import anomaly
    from nnwizard.bundle import load_bundle
    from nnwizard.replay import ReplayTarget

    real = anomaly.Detector.check
    monkeypatch.setattr(anomaly.Detector, "check", lambda self, step, loss, norm: real(self, step, loss, norm) or (
        anomaly.Anomaly("loss-spike", step, "forced", loss, norm) if step == 10 else None))  # a logged step: checked in full
    torch.manual_seed(3)
    model = (nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)) if kind == "module"
             else _FunctionalDropout())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(12)]
    losses = []
    with nnwizard.watch(model, optimizer, out=tmp_path / "w", tensorboard=False, quiet=True) as w:
        for i, (x, y) in enumerate(batches):
            torch.rand(3)  # the loop's own RNG use between steps (shuffling, augmentation) moves the state
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert [b.name for b in w.bundles] == ["anomaly-step10"]
    target = ReplayTarget.from_bundle(load_bundle(w.bundles[0]), torch.device("cpu"))
    replay_model = target.fresh_model()
    replay_model.train()
    batch = target.batches(1)[0]
    replayed = target._step(replay_model, batch, target.loss_fn, target.make_optimizer(replay_model))
    assert replayed.item() == losses[9]  # the very step, bit for bit (the dropout masks included)
    torch.random.set_rng_state(batch[2]["rng"])
    torch.rand(1)  # a state one draw off gives other dropout masks: the check above is not vacuous
    shifted = (batch[0], batch[1], {**batch[2], "rng": torch.random.get_rng_state()})
    replay_model = target.fresh_model()
    replay_model.train()
    assert target._step(replay_model, shifted, target.loss_fn, target.make_optimizer(replay_model)).item() != losses[9]


# ----------------------------------------------------------------- how watch takes the model calls
class _KwNet(Net):
    def forward(self, x, scale=1.0):
        return super().forward(x) * scale


def _watched_steps(model, out, steps, nan_at=None, copies=None, **call):
    opt = torch.optim.SGD(model.parameters(), 0.1)
    torch.manual_seed(0)
    X, Y = torch.randn(steps * 8, 8), torch.randint(0, 3, (steps * 8,))
    with nnwizard.watch(model, opt, out=out, tensorboard=False, quiet=True) as w:
        for i in range(steps):
            x = X[i * 8:(i + 1) * 8].clone()
            if nan_at == i + 1:
                x[2, 1] = float("nan")
            loss = nn.functional.cross_entropy(model(x, **call), Y[i * 8:(i + 1) * 8])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if copies is not None:
                copies(model, w)
    return w


def test_first_step_bundle_has_the_call_with_its_keyword_arguments_and_replays(tmp_path):
    from nnwizard.replay import replay, report_dict

    w = _watched_steps(_KwNet(), tmp_path / "w", 3, nan_at=1, scale=0.5)
    assert [b.name for b in w.bundles] == ["anomaly-step1"]
    batch = torch.load(w.bundles[0] / "batch.pt", weights_only=False)
    call = batch["step"]["calls"][0]
    assert len(batch["step"]["calls"]) == 1 and call["kwargs"] == {"scale": 0.5}
    assert json.loads((w.bundles[0] / "meta.json").read_text())["replayable"]
    data = report_dict(*replay(w.bundles[0]))
    assert data["hypotheses"][0]["id"] == "nan-in-inputs" and data["localised"]["rows"] == [2]


def test_watched_model_can_be_copied_and_pickled_and_its_class_is_left_as_it_was(tmp_path):
    import copy
    import io

    originals = (_KwNet.__dict__["forward"], Net.__dict__["forward"])
    seen = []

    def copies(model, w):  # the user's own checkpointing/EMA copies, inside the watched loop
        twin = copy.deepcopy(model)
        torch.save(model, io.BytesIO())
        twin(torch.randn(2, 8))  # another instance of the class: not a watched call
        seen.append(len(w.step_calls["calls"]))

    w = _watched_steps(_KwNet(), tmp_path / "w", 4, copies=copies)
    assert w.anomalies == [] and seen == [0, 0, 0, 0]  # (the step's calls were rotated out; the twin added none)
    assert (_KwNet.__dict__["forward"], Net.__dict__["forward"]) == originals
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in _KwNet().modules())


def test_a_model_with_an_instance_forward_is_hooked_copies_cleanly_and_replays(tmp_path):
    import copy

    from nnwizard.replay import replay, report_dict

    model = Net()
    model.forward = model.forward  # an instance attribute: the class's forward is never called
    w = _watched_steps(model, tmp_path / "w", 12, nan_at=9, copies=lambda m, w: copy.deepcopy(m)(torch.randn(2, 8)))
    assert [b.name for b in w.bundles] == ["anomaly-step9"]
    data = report_dict(*replay(w.bundles[0]))
    assert data["hypotheses"][0]["id"] == "nan-in-inputs" and data["localised"]["rows"] == [2]
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_script_definitions_load_without_the_values_only_the_run_computes(tmp_path):
    from nnwizard.bundle import load_script_defs

    script = tmp_path / "train.py"
    script.write_text(
        "import argparse\nfrom torch import nn\n"
        "parser = argparse.ArgumentParser()\nparser.add_argument('--lr', type=float, default=0.1)\n"
        "args = parser.parse_args()\n"
        "lr = args.lr            # call-free, but reads a value the run made\n"
        "WIDTH = 16\n"
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(WIDTH, 2)\n"
        "raise SystemExit('training would start here')\n")
    module = load_script_defs(script)
    assert module.WIDTH == 16 and not hasattr(module, "lr") and not hasattr(module, "args")
    assert module.Net().fc.in_features == 16


def _clipped(out, boost_step=None, max_norm=0.05, triggers=None, every=10):
    """_loop's model and data, clipping every gradient to max_norm; at boost_step the loss backpropagated is
    scaled up 1e4 (the gradient explodes; clipping hides it from anything that reads the gradient after it)."""
    torch.manual_seed(0)
    model, crit = Net(), nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    X = torch.randn(1200, 8)
    Y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long()
    returned = {}
    with nnwizard.watch(model, opt, out=out, every=every, tensorboard=False, quiet=True, triggers=triggers) as w:
        for i in range(120):
            loss = crit(model(X[i * 10:(i + 1) * 10]), Y[i * 10:(i + 1) * 10])
            opt.zero_grad()
            (loss * (1e4 if i + 1 == boost_step else 1.0)).backward()
            returned[i + 1] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
            opt.step()
    return w, returned


def test_watch_logs_the_gradient_norm_before_the_scripts_clipping(tmp_path):
    w, returned = _clipped(tmp_path / "w")
    lines = [json.loads(l) for l in (tmp_path / "w" / "watch.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines][:3] == [1, 10, 20]
    for line in lines:   # what clip_grad_norm_ returned, not the clipped norm (never above 0.05)
        assert line["grad_norm"] == pytest.approx(returned[line["step"]], rel=1e-5) and line["grad_norm"] > 0.05
        assert line["grad_norm_clipped"] <= 0.05 + 1e-6
    unclipped = [json.loads(l) for l in _loop(tmp_path / "u")[0].out.joinpath("watch.jsonl").read_text().splitlines()]
    assert all("grad_norm_clipped" not in l for l in unclipped)


def test_a_gradient_explosion_under_clipping_is_caught(tmp_path):
    # (every=1: the norm on every step; at watch's own interval, chosen from the measured cost of a norm, a loaded
    # machine may sample it so sparsely that the 20 measured norms the trigger needs are not there by step 100)
    only = Triggers(enabled=("grad-explosion",))
    w, _ = _clipped(tmp_path / "w", boost_step=100, triggers=only, every=1)
    assert [(a.kind, a.step) for a in w.anomalies] == [("grad-explosion", 100)]
    quiet, _ = _clipped(tmp_path / "q", triggers=only, every=1)
    assert quiet.anomalies == []


def test_a_compiled_model_is_watched_and_its_nan_step_replays(tmp_path):
    """torch.compile(model): watch keeps the wrapper's calls (its instance hooks run outside the compiled graph)
    as the model's own, nothing of ours is traced into the graph, and the NaN step's bundle is replayable."""
    class OwnLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x, y):
            logits = self.b(torch.relu(self.a(x)))
            return logits, nn.functional.cross_entropy(logits, y)

    torch.manual_seed(0)
    raw = OwnLoss()
    model = torch.compile(raw)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    X = torch.randn(1600, 16)
    Y = (X[:, 0] > 0).long() + 2 * (X[:, 1] > 0).long()
    with pytest.warns(UserWarning, match="global hooks"), \
            nnwizard.watch(raw, opt, out=tmp_path / "w", tensorboard=False, quiet=True) as w:
        for i in range(60):
            x, y = X[i * 16:(i + 1) * 16].clone(), Y[i * 16:(i + 1) * 16]
            if i == 40:
                x[3, 0] = float("nan")
            _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert [(a.kind, a.step) for a in w.anomalies] == [("nonfinite", 41)]
    meta = json.loads((w.bundles[0] / "meta.json").read_text())
    assert meta["replayable"], meta.get("why_not")
    assert meta["models"] == {"model": "OwnLoss"}   # the model itself, not torch's wrapper around it
    from nnwizard.bundle import load_bundle

    # backward ran on the model's second output, its loss; a compiled graph is one autograd node for both outputs,
    # so the logits share the loss's grad_fn: the output number tells them apart
    assert load_bundle(w.bundles[0]).batch["step"]["backward"] == [{"kind": "output", "call": 0, "path": [1], "scale": 1.0}]
