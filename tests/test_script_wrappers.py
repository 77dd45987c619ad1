"""Scripts that train through a library's wrappers of the model and optimizer (Lightning Fabric's
``fabric.setup``, Accelerate's ``accelerator.prepare``): the wrapper optimizer delegates to the one it
wraps, so the recording has that one optimizer, however the script reaches it (a scheduler built over
the wrapper, ``zero_grad`` called on the wrapper), and the audits read the wrapped one's steps."""

from __future__ import annotations

import pytest

from tests.test_script_mode import outcome, record, write

# a wrapper the way Fabric builds one: the optimizer kept as `_optimizer`, the wrapped class imitated,
# attribute lookups (param_groups, state) answered by the wrapped optimizer
WRAPPED = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Wrapped:
    def __init__(self, optimizer):
        self._optimizer = optimizer
        self.__class__ = type("Wrapped" + optimizer.__class__.__name__, (Wrapped, optimizer.__class__), {})

    def step(self, closure=None):
        return self._optimizer.step(closure)

    def __getattr__(self, item):
        return getattr(self._optimizer, item)


torch.manual_seed(0)
X = torch.randn(256, 8)
Y = (X[:, 0] > 0).long()
loader = DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = Wrapped(torch.optim.SGD(model.parameters(), lr=0.1))
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
crit = nn.CrossEntropyLoss()
for epoch in range(4):
    for x, y in loader:
        optimizer.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        optimizer.step()
    scheduler.step()
'''

FABRIC = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from lightning.fabric import Fabric

fabric = Fabric(accelerator="cpu", devices=1)
torch.manual_seed(0)
X = torch.randn(256, 8)
Y = (X[:, 0] > 0).long()
loader = fabric.setup_dataloaders(DataLoader(TensorDataset(X, Y), batch_size=32, shuffle=True))
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
crit = nn.CrossEntropyLoss()
for epoch in range(4):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        loss = crit(model(x), y)
        fabric.backward(loss)
        optimizer.step()
    scheduler.step()
'''


def test_a_wrapper_optimizer_is_the_optimizer_it_wraps(tmp_path):
    target = record(write(tmp_path, text=WRAPPED))
    rec = target.recording
    assert [o.name for o in rec.optimizers] == ["SGD"]
    assert rec.optimizers[0].steps == len(rec.steps) == 30
    assert [(s["name"], s["optimizer"]) for s in rec.schedulers] == [("StepLR", 0)]
    assert outcome(target, "trace-zero-grad") == "ok"
    assert outcome(target, "trace-scheduler") == "ok"


def test_without_zero_grad_through_the_wrapper_gradients_pile_up(tmp_path):
    target = record(write(tmp_path, ("        optimizer.zero_grad()\n", ""), text=WRAPPED))
    assert [o.name for o in target.recording.optimizers] == ["SGD"]
    assert outcome(target, "trace-zero-grad") != "ok"


def test_lightning_fabric_script(tmp_path):
    pytest.importorskip("lightning")
    target = record(write(tmp_path, text=FABRIC))
    rec = target.recording
    assert [o.name for o in rec.optimizers] == ["SGD"]
    assert rec.optimizers[0].steps == 30
    assert [(s["name"], s["optimizer"]) for s in rec.schedulers] == [("StepLR", 0)]
    assert outcome(target, "trace-zero-grad") == "ok"
    assert outcome(target, "trace-backward-step") == "ok"


DATA_PARALLEL = '''
import torch
from torch import nn

torch.manual_seed(0)
X = torch.randn(256, 8)
Y = (X[:, 0] > 0).long()
model = nn.DataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))   # (CPU: runs the module itself)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(4):
    for i in range(0, 256, 32):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(X[i:i + 32]), Y[i:i + 32])
        loss.backward()
        optimizer.step()
'''


def test_a_wrapped_model_is_named_and_audited_as_the_model_it_runs(tmp_path):
    """nn.DataParallel (as Fabric's _FabricModule, torch.compile's OptimizedModule): the report names the user's
    class and its layers (``Sequential.0``, not ``module.0``), and says what it ran through."""
    from nnwizard.probes.api import ProbeContext, get
    from nnwizard.script_view import _models_line, observed

    target = record(write(tmp_path, text=DATA_PARALLEL))
    info = target.recording.models[0]
    assert (info.name, info.wrapper) == ("Sequential", "DataParallel")
    line = _models_line(observed(target))
    assert line.startswith("Sequential (178 parameters") and "run through DataParallel" in line, line
    assert outcome(target, "trace-optimizer") == "ok"
    head_only = record(write(tmp_path, ("optim.SGD(model.parameters()", "optim.SGD(model.module[2].parameters()"),
                             text=DATA_PARALLEL, name="head.py"))
    result = get("trace-optimizer")(ProbeContext(head_only))
    assert result.status == "failed" and "Sequential.0" in result.summary and "module." not in result.summary, result.summary


DDP_ONE_PROCESS = '''
import os
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", "__PORT__"
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
X = torch.randn(512, 16)
Y = (X[:, 0] + X[:, 1] > 0).long()
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
opt = torch.optim.SGD(model.parameters(), lr=50.0)
for epoch in range(3):
    for i in range(0, 512, 32):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(X[i:i + 32]), Y[i:i + 32])
        loss.backward()
        opt.step()
dist.destroy_process_group()
'''


def test_a_one_process_ddp_script_can_be_rerun_and_its_model_probed(capsys, tmp_path):
    """Stopped at its step budget, the script never reached its destroy_process_group(): every rerun raised
    "initialize the default process group twice" (the overfit probe even *failed* on it), and a copy of the
    DDP model needs the group. The run now closes the group it opened; the probes copy the model DDP runs."""
    import json
    import socket

    from nnwizard.cli import main

    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch without distributed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "train.py"
    path.write_text(DDP_ONE_PROCESS.replace("__PORT__", str(port)))
    js = tmp_path / "r.json"
    with pytest.raises(SystemExit):
        main(["diagnose", "--script", str(path), "--non-interactive", "--symptom", "auto", "--json", str(js)])
    report = json.loads(js.read_text())
    assert [p["id"] for p in report["probes"] if p["status"] == "errored"] == []
    assert not any("twice" in p["summary"] for p in report["probes"])
    assert any(p["id"] == "script-overfit" and p["status"] in ("passed", "failed") for p in report["probes"])
    assert report["hypotheses"][0]["id"] == "lr-too-high"
    assert not dist.is_initialized()
