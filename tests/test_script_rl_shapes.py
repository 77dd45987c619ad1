"""Script mode on the shapes reinforcement-learning loops give the model-level probes (found on pytorch/tutorials'
DQN and a policy-gradient loop). A loss that scores a selection of the model's output (a Q-network's ``gather`` of
the actions taken) cannot be replayed on a new output by reshaping it: the probes measure what they can without it
(the forward, the parameters it reaches), neither raise nor count the loss as missing, and still find a fault in the
forward. A policy called on one unbatched observation has no batch for batch-independence to read."""

from __future__ import annotations

import math

from nnwizard.probes.api import could_not_run
from tests.test_script_interventions import run, script, target_of

Q_LEARNING = '''
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
{MODEL}
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
X = torch.randn(512, 4); A = torch.randint(0, 2, (512, 1)); R = X[:, :1] * (2 * A.float() - 1)
for step in range(60):
    i = torch.randint(0, 512, (64,))
    q = net(X[i]).gather(1, A[i])
    loss = F.smooth_l1_loss(q, R[i])
    opt.zero_grad(); loss.backward(); opt.step()
'''
HEALTHY = "net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))"
# a layer kept in a plain list: its weights are used by the forward and never trained
UNREGISTERED = '''
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(4, 32), nn.Linear(32, 2)]
        self.scale = nn.Parameter(torch.ones(1))
    def forward(self, x):
        return self.layers[1](torch.relu(self.layers[0](x))) * self.scale
net = Net()'''


def test_a_gathered_loss_input_is_not_replayed_and_is_not_a_missing_measurement(tmp_path):
    target = target_of(script(tmp_path, text=Q_LEARNING.format(MODEL=HEALTHY)), 40)
    shape = run(target, "forward-shape")
    assert shape.status == "passed" and shape.outcome == "forward-only", shape.summary
    assert not shape.data.get("training_raised") and "[64, 1] has 64 values" in shape.summary, shape.summary
    initial = run(target, "initial-loss")
    assert initial.status == "skipped" and not could_not_run(initial), initial.summary
    registration = run(target, "parameter-registration")
    assert registration.status == "passed" and registration.data["loss_not_replayed"], registration.summary


def test_a_gathered_loss_still_finds_parameters_the_forward_uses_but_the_model_does_not_register(tmp_path):
    target = target_of(script(tmp_path, text=Q_LEARNING.format(MODEL=UNREGISTERED)), 40)
    registration = run(target, "parameter-registration")
    assert registration.status == "failed", registration.summary
    assert "layers" in registration.summary, registration.summary


def test_a_reshaped_loss_input_is_still_replayed(tmp_path):
    """The same element count (``out.view(-1)``) is a reshape the loss replays: the loss is called again."""
    text = Q_LEARNING.format(MODEL=HEALTHY.replace("nn.Linear(32, 2)", "nn.Linear(32, 1)")).replace(
        "q = net(X[i]).gather(1, A[i])", "q = net(X[i]).view(-1)").replace("R[i])", "R[i].view(-1))")
    shape = run(target_of(script(tmp_path, text=text), 40), "forward-shape")
    assert shape.outcome == "ok" and "loss" in shape.summary, shape.summary


POLICY = '''
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear({IN}, 32)
        self.a = nn.Linear(32, 2)
    def forward(self, x):
        return F.softmax(self.a(torch.relu(self.l(x))), {DIM})
model = Policy()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for episode in range(40):
    {OBS}
    probs = model(obs)
    loss = F.mse_loss(probs, torch.tensor([1.0, 0.0]).expand_as(probs))
    opt.zero_grad(); loss.backward(); opt.step()
'''


def test_a_policy_called_on_one_unbatched_observation_has_no_batch_to_mix(tmp_path):
    """An observation of 2 features and 2 actions: dim 0 of the output is the actions, not samples."""
    text = POLICY.format(IN=2, DIM=-1, OBS="obs = torch.randn(2)")
    result = run(target_of(script(tmp_path, text=text), 40), "batch-independence")
    assert result.status == "skipped" and "unbatched" in result.summary, result.summary


def test_a_batch_of_scalars_still_has_its_mixing_found(tmp_path):
    """A 1-D input the forward takes value by value is a batch: a softmax over it mixes the samples."""
    text = POLICY.format(IN=1, DIM=0, OBS="obs = torch.randn(8)").replace(
        "self.l(x)", "self.l(x.unsqueeze(1))")
    result = run(target_of(script(tmp_path, text=text), 40), "batch-independence")
    assert result.status == "failed", result.summary


TD = '''
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
S = torch.randn(512, 4); A = torch.randint(0, 2, (512, 1)); S2 = S + 0.1 * torch.randn(512, 4); R = torch.ones(512)
for step in range(40):
    i = torch.randint(0, 512, (64,))
    q = net(S[i]).gather(1, A[i])
    {TARGET}
    loss = F.smooth_l1_loss(q, target.unsqueeze(1))
    opt.zero_grad(); loss.backward(); opt.step()
'''


def test_a_td_target_computed_with_grad_by_the_trained_network_is_not_detached(tmp_path):
    target = target_of(script(tmp_path, text=TD.format(TARGET="target = R[i] + 0.99 * net(S2[i]).max(1).values")), 40)
    result = run(target, "trace-loss-target")
    assert result.outcome == "target-carries-grad", result.summary


def test_a_td_target_under_no_grad_is_quiet(tmp_path):
    text = TD.format(TARGET="with torch.no_grad():\n        target = R[i] + 0.99 * net(S2[i]).max(1).values")
    result = run(target_of(script(tmp_path, text=text), 40), "trace-loss-target")
    assert result.status == "passed", result.summary


def test_a_target_from_another_model_run_with_grad_is_not_this_finding(tmp_path):
    """A teacher's output (another model) as the target, its forward after the student's: the student's target is
    not its own; the teacher run with grad is another audit's (trace-eval-grad)."""
    text = TD.format(TARGET="target = R[i] + teacher(S2[i]).max(1).values").replace(
        "opt = torch.optim", "teacher = nn.Sequential(nn.Linear(4, 2))\nopt = torch.optim")
    result = run(target_of(script(tmp_path, text=text), 40), "trace-loss-target")
    assert result.outcome != "target-carries-grad", result.summary


ENCODER_DECODER = '''
import torch, torch.nn as nn
torch.manual_seed(0)
enc, dec = nn.Linear(8, 16), nn.Linear(16, 4)
eo, do = torch.optim.SGD(enc.parameters(), lr=0.1), torch.optim.SGD(dec.parameters(), lr=0.1)
X, Y = torch.randn(256, 8), torch.randint(0, 4, (256,))
for it in range(60):
    i = it % 8
    x, y = X[i*32:(i+1)*32], Y[i*32:(i+1)*32]
    eo.zero_grad(); do.zero_grad()
    loss = nn.functional.cross_entropy(dec(torch.tanh(enc(x))), y)
    loss.backward()
    eo.step(); do.step()
'''


def test_a_second_optimizer_stepped_after_the_same_backward_adds_no_nan_to_the_curve(tmp_path):
    """(pytorch/tutorials' seq2seq: an encoder's and a decoder's optimizer after one backward read symptom 'nan')"""
    result = run(target_of(script(tmp_path, text=ENCODER_DECODER), 60), "trace-run")
    assert result.outcome != "nan" and all(math.isfinite(v) for v in result.data["train"]), result.summary
    broken = ENCODER_DECODER.replace("    eo.zero_grad(); do.zero_grad()", "    x = x * float('nan') if it >= 20 else x\n"
                                     "    eo.zero_grad(); do.zero_grad()")
    nan = run(target_of(script(tmp_path, name="nan.py", text=broken), 60), "trace-run")
    assert nan.outcome in ("nan", "diverged") and not all(math.isfinite(v) for v in nan.data["train"]), nan.summary


def test_an_idle_optimizer_is_found_in_a_run_cut_short_just_after_zero_grad():
    """A run nnwizard stops at its time limit may end right after the script's zero_grad() set the idle optimizer's
    gradients to None: whether a backward ever reached its model decides, not its last .grad. A stage no backward
    has reached yet (training in stages, cut before it) is still not idle."""
    from types import SimpleNamespace

    import torch

    from nnwizard.probes._recording import idle_optimizers

    enc, dec = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    def opt(index, module, steps):
        return SimpleNamespace(index=index, steps=steps, models=[index],
                               optimizer=SimpleNamespace(param_groups=[{"params": list(module.parameters())}]))

    optimizers = [opt(0, enc, 12), opt(1, dec, 0)]
    reached = SimpleNamespace(optimizers=optimizers, stopped="time limit", steps=[SimpleNamespace(forwards={0: 1, 1: 1})] * 12)
    assert [o.index for o in idle_optimizers(reached)] == [1]
    staged = SimpleNamespace(optimizers=optimizers, stopped="time limit", steps=[SimpleNamespace(forwards={0: 1})] * 12)
    assert idle_optimizers(staged) == []
