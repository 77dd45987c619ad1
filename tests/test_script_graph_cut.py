"""Script mode: a loss whose graph was cut from the model (``model(x).detach().requires_grad_()``, the
usual way to silence "element 0 of tensors does not require grad"). backward() runs, the optimizer holds
the model's parameters, no gradient ever reaches them: that is a disconnected graph, and the model's
training forwards (scored by a loss, never reached by a backward) are not evaluation forwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from nnwizard.probes.api import ProbeContext, load_all
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

PROBES = load_all()

SCRIPT = '''
import torch
from torch import nn
torch.manual_seed(0)
features, labels = torch.randn(320, 6), torch.randint(0, 3, (320,))
loader = torch.utils.data.DataLoader(list(zip(features, labels)), batch_size=32, shuffle=True)
net = nn.Sequential(nn.Linear(6, 24), nn.Dropout(0.2), nn.Tanh(), nn.Linear(24, 3))
opt = torch.optim.RMSprop(net.parameters(), lr=1e-3)
criterion = nn.CrossEntropyLoss()
for epoch in range(2):
    for inputs, classes in loader:
        opt.zero_grad()
        scores = {SCORES}
        criterion(scores, classes).backward()
        opt.step()
'''


def _probes(tmp_path: Path, scores: str) -> dict:
    path = tmp_path / "fit.py"
    path.write_text(SCRIPT.replace("{SCORES}", scores), encoding="utf-8")
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=8)))
    return {name: PROBES[name](ProbeContext(target, params={}))
            for name in ("trace-backward-step", "trace-eval-mode", "trace-eval-grad")}


def test_a_detached_output_is_a_cut_graph_not_an_evaluation(tmp_path):
    found = _probes(tmp_path, "net(inputs).detach().requires_grad_()")
    step = found["trace-backward-step"]
    assert step.outcome == "no-grad-at-step" and step.data["graph_cut"], step.summary
    assert "graph between the model and the loss is cut" in step.summary
    for name in ("trace-eval-mode", "trace-eval-grad"):
        assert found[name].status != "failed", (name, found[name].summary)


def test_the_connected_loop_is_not_called_cut(tmp_path):
    found = _probes(tmp_path, "net(inputs)")
    assert found["trace-backward-step"].status == "passed", found["trace-backward-step"].summary
