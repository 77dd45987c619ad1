"""Script mode: several objectives (probes/_objectives.py). Two optimizers that each step after their
own backward train two objectives, each with its own loss curve; when one's backward runs through the
other's model (a GAN) the objectives compete and no curve-based probe judges them, while the audits
that read no curve still run. Two optimizers stepped after one backward stay one objective."""

from __future__ import annotations

from pathlib import Path

import pytest

from nnwizard.probes._objectives import objectives
from nnwizard.probes.api import ProbeContext, get, load_all
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

PROBES = load_all()

# a tiny GAN on 2-D points: D learns real from fake, G learns to fool D through D's output
GAN = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
real = torch.randn(512, 2) * 0.3 + torch.tensor([2.0, -1.0])
loader = DataLoader(TensorDataset(real), batch_size=32, shuffle=True)
gen = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
disc = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
for epoch in range(4):
    for (xb,) in loader:
        ones, zeros = torch.ones(len(xb), 1), torch.zeros(len(xb), 1)
        fake = gen(torch.randn(len(xb), 4))
        disc.zero_grad()
        loss_d = bce(disc(xb), ones) + bce(disc(fake.detach()), zeros)
        loss_d.backward()
        opt_d.step()
        gen.zero_grad()
        loss_g = bce(disc(fake), ones)
        loss_g.backward()
        opt_g.step()
'''
GAN_NO_ZERO_GRAD = GAN.replace("        disc.zero_grad()\n", "")
# the generator scored against the fake labels: it helps the discriminator, and both losses collapse together
GAN_G_FAKE_LABELS = GAN.replace("loss_g = bce(disc(fake), ones)", "loss_g = bce(disc(fake), zeros)").replace("lr=1e-3", "lr=1e-2")
# the generator's loss reads its output through .detach(): its optimizer steps without a gradient
GAN_G_DETACHED = GAN.replace("loss_g = bce(disc(fake), ones)", "loss_g = bce(disc(fake.detach()), ones)")

# an encoder and a decoder, each with its own optimizer, stepped after ONE backward: one objective
ENC_DEC = '''
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
x = torch.randn(512, 16)
loader = DataLoader(TensorDataset(x), batch_size=32, shuffle=True)
enc = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
dec = nn.Linear(8, 16)
opt_e = torch.optim.SGD(enc.parameters(), lr={LR})
opt_d = torch.optim.SGD(dec.parameters(), lr={LR})
for epoch in range(4):
    for (xb,) in loader:
        opt_e.zero_grad()
        opt_d.zero_grad()
        loss = F.mse_loss(dec(enc(xb)), xb)
        loss.backward()
        opt_e.step()
        opt_d.step()
'''


# two independent models, each with its own loss, backward and optimizer: two objectives, not adversarial
TWO = ENC_DEC.replace("""        opt_e.zero_grad()
        opt_d.zero_grad()
        loss = F.mse_loss(dec(enc(xb)), xb)
        loss.backward()
        opt_e.step()
        opt_d.step()""", """        opt_e.zero_grad()
        F.mse_loss(enc(xb), xb[:, :8]).backward()
        opt_e.step()
        opt_d.zero_grad()
        F.mse_loss(dec(xb[:, :8]), xb).backward()
        opt_d.step()""").replace("opt_d = torch.optim.SGD(dec.parameters(), lr={LR})", "opt_d = torch.optim.SGD(dec.parameters(), lr={LR_D})")


def target_of(tmp_path: Path, text: str, steps: int = 40) -> ScriptTarget:
    path = tmp_path / "train.py"
    path.write_text(text, encoding="utf-8")
    return ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=steps)))


def run(target, probe_id: str, **params):
    return PROBES[probe_id](ProbeContext(target, params=params))


@pytest.fixture(scope="module")
def gan(tmp_path_factory):
    return target_of(tmp_path_factory.mktemp("gan"), GAN)


def test_gan_is_two_adversarial_objectives(gan):
    objs = objectives(gan.recording)
    assert objs.several and objs.adversarial
    d_index = next(i for i in objs.series if len(gan.recording.optimizers[i].models) == 1
                   and gan.recording.models[gan.recording.optimizers[i].models[0]].forwards > 40)
    g_index = next(i for i in objs.series if i != d_index)
    assert list(objs.through) == [g_index]          # G's loss goes through D; D's does not go through G
    assert all(len(v) == 20 for v in objs.series.values())
    assert "adversarial" in objs.text and "goes through" in objs.text


@pytest.mark.parametrize("probe_id", ["trace-run", "script-overfit", "script-lr-sweep", "script-ladder"])
def test_curve_probes_do_not_judge_an_adversarial_game(gan, probe_id):
    reruns = len(gan.reruns)
    result = run(gan, probe_id)
    assert result.status == "skipped" and result.outcome == "adversarial", result.summary
    assert not result.data.get("cannot_run")      # does not apply: no evidence missing
    assert "compete" in result.summary and "goes through" in result.summary
    assert len(gan.reruns) == reruns               # nothing rerun for a judgement that does not apply


def test_gan_whose_generator_agrees_with_the_discriminator_is_a_flipped_objective(tmp_path, gan):
    result = run(target_of(tmp_path, GAN_G_FAKE_LABELS, steps=80), "trace-loss-sign")
    assert (result.status, result.outcome) == ("failed", "cooperating"), result.summary
    healthy = run(target_of(tmp_path, GAN.replace("lr=1e-3", "lr=1e-2"), steps=80), "trace-loss-sign")
    assert healthy.status == "skipped" and "compete" in healthy.summary   # a real contest: not judged
    assert run(gan, "trace-loss-sign").status == "skipped"


def test_healthy_gan_clears_its_gradients(gan):
    result = run(gan, "trace-zero-grad")
    assert result.outcome == "ok", result.summary


def test_healthy_gan_steps_every_optimizer_with_gradients(gan):
    result = run(gan, "trace-backward-step")
    assert result.status == "passed", result.summary


def test_gan_whose_generator_loss_is_detached_is_a_cut_graph(tmp_path):
    # the discriminator's steps have gradients, the generator's never do: one starved optimizer of two
    result = run(target_of(tmp_path, GAN_G_DETACHED), "trace-backward-step")
    assert result.outcome == "no-grad-at-step" and result.data["graph_cut"], result.summary
    assert result.data["starved_models"] == "Sequential" and "graph between" in result.summary
    found = run(target_of(tmp_path, GAN_G_DETACHED), "trace-disconnected")
    assert found.outcome == "disconnected" and "in the 2 optimizers" in found.summary, found.summary


def test_healthy_gan_connects_every_optimizers_tensors(gan):
    result = run(gan, "trace-disconnected")
    assert result.status == "passed" and "in the 2 optimizers" in result.summary, result.summary


def test_gan_without_the_discriminators_zero_grad_is_found(tmp_path):
    result = run(target_of(tmp_path, GAN_NO_ZERO_GRAD), "trace-zero-grad")
    assert result.outcome == "carry-over", result.summary
    assert result.data["carried_worst"] > 0.5 and "Adam over Sequential" in result.summary


def test_encoder_decoder_after_one_backward_is_one_objective(tmp_path):
    target = target_of(tmp_path, ENC_DEC.replace("{LR}", "0.05"))
    objs = objectives(target.recording)
    assert not objs.several and not objs.adversarial
    assert len(objs.series[None]) == 20              # the steps with a backward of their own
    result = run(target, "trace-run")
    assert "objectives" not in result.data and result.data["steps"] == 40


def test_lr_too_high_on_encoder_decoder_after_one_backward_is_still_found(tmp_path):
    target = target_of(tmp_path, ENC_DEC.replace("{LR}", "15.0"))
    assert not objectives(target.recording).several
    result = run(target, "script-lr-sweep", steps=16)
    assert result.outcome == "too-high", result.summary


@pytest.mark.parametrize("lr_d, expected", [("0.5", "ok"), ("15.0", "too-high")])
def test_two_independent_objectives_are_judged_each_on_its_own_series(tmp_path, lr_d, expected):
    target = target_of(tmp_path, TWO.replace("{LR}", "0.5").replace("{LR_D}", lr_d))
    objs = objectives(target.recording)
    assert objs.several and not objs.adversarial and sorted(objs.series) == [0, 1]
    sweep = run(target, "script-lr-sweep", steps=16)
    assert sweep.outcome == expected, sweep.summary
    assert sweep.data["objectives"] == objs.text
    if expected == "too-high":
        assert sweep.data["judged"].startswith("SGD #2") and sweep.data["lr"] == 15.0
    curve = run(target, "trace-run")
    assert curve.data["objectives"] == objs.text and set(curve.data["objective_series"]) == {"SGD #1 (Sequential)", "SGD #2 (Linear)"}


@pytest.mark.slow
@pytest.mark.parametrize("text, expected", [(GAN, None), (GAN_NO_ZERO_GRAD, "missing-zero-grad")])
def test_cli_gan_verdicts(tmp_path, text, expected):
    import os

    from examples._scripts import diagnose_with_cli

    path = tmp_path / "gan.py"
    path.write_text(text, encoding="utf-8")
    report, error, _ = diagnose_with_cli(path, ["auto"], tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert error is None, error
    findings = [h["id"] for h in report["hypotheses"] if h["confidence"] >= 0.5]
    ids = {h["id"] for h in report["hypotheses"]}
    assert not ids & {"lr-too-high", "lr-too-low"}, report["hypotheses"]
    if expected is None:
        assert report["verdict"] == "healthy", findings
    else:
        assert findings[:1] == [expected], findings


def test_ladder_does_not_apply_to_several_independent_objectives(tmp_path):
    target = target_of(tmp_path, TWO.replace("{LR}", "0.5").replace("{LR_D}", "0.5"))
    reruns = len(target.reruns)
    result = run(target, "script-ladder")
    assert result.status == "skipped" and not result.data.get("cannot_run"), result.summary
    assert "several objectives" in result.summary and len(target.reruns) == reruns


# actor-critic's shape: one forward per time step saved over an episode longer than the recorder's pending cap
# (64), then one loss call per step on the saved values and one backward for the episode
EPISODES = '''
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for episode in range(6):
    saved = []
    for t in range(150):
        saved.append(model(torch.randn(1, 4)))
    returns = torch.randn(150)
    losses = [nn.functional.smooth_l1_loss(v.squeeze(), r) for v, r in zip(saved, returns)]
    opt.zero_grad()
    torch.stack(losses).sum().backward()
    opt.step()
'''


def test_loss_calls_on_values_saved_over_a_long_episode_come_from_the_model(tmp_path):
    """Past the pending cap the oldest forwards' outputs were forgotten before the episode's loss calls: 86 of
    each episode's 150 calls read as 'not computed from the model's output' (loss-wrong-tensor on actor_critic)."""
    path = tmp_path / "episodes.py"
    path.write_text(EPISODES)
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=6)))
    result = get("trace-loss-target")(ProbeContext(target))
    assert result.outcome == "ok", result.summary
