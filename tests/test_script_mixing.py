"""Script mode: does the script's reshape between the model and the loss keep samples apart
(probes/mixing.py)? The check on live tensors, both ways, including the legitimate ways of combining
or regrouping samples that must stay quiet; then the listener and the probe on a recorded script."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nnwizard.probes.api import ProbeContext, load_all
from nnwizard.probes.mixing import SampleMixing, judge
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

PROBES = load_all()


def _out(*shape) -> torch.Tensor:
    """A model-like output with a graph (a leaf times a weight)."""
    torch.manual_seed(0)
    leaf = torch.randn(*shape, requires_grad=True)
    return leaf * 2.0


MIXED = {
    "view(10, -1).t() of (N, C)": lambda: (lambda o: (o.view(10, -1).t(), o))(_out(64, 10)),
    "log_softmax after the view": lambda: (lambda o: (F.log_softmax(o.view(10, -1).t(), 1), o))(_out(64, 10)),
    "a square output transposed": lambda: (lambda o: (o.t(), o))(_out(10, 10)),
    "time-first (T, B, H) viewed as (B, -1)": lambda: (lambda o: (o.view(4, -1), o))(_out(12, 4, 5)),
}
QUIET = {
    "the output itself": lambda: (lambda o: (o, o))(_out(64, 10)),
    "(B, T, V) -> (B*T, V)": lambda: (lambda o: (o.reshape(-1, 7), o))(_out(4, 6, 7)),
    "time-first (T, B, V) -> (T*B, V)": lambda: (lambda o: (o.view(-1, 7), o))(_out(6, 4, 7)),
    "time-first transposed then flattened per sample": lambda: (lambda o: (o.transpose(0, 1).reshape(4, -1), o))(_out(6, 4, 5)),
    "contrastive a @ b.T": lambda: (lambda o: (_out(16, 8).detach().requires_grad_() @ o.t(), o))(_out(16, 8)),
    "pooled over the batch": lambda: (lambda o: (o.mean(0), o))(_out(32, 5)),
    "pooled, keepdim": lambda: (lambda o: (o.mean(0, keepdim=True), o))(_out(32, 5)),
    "multiple-choice scores grouped": lambda: (lambda o: (o.view(-1, 4), o))(_out(32, 1)),
    "one logit of each pair, grouped": lambda: (lambda o: (o[:, 1].reshape(-1, 4), o))(_out(32, 2)),
    "(N, 1) squeezed": lambda: (lambda o: (o.view(-1), o))(_out(64, 1)),
    "channels-last for a segmentation loss": lambda: (lambda o: (o.permute(0, 2, 3, 1).reshape(-1, 3), o))(_out(2, 3, 4, 4)),
    "a slice of the classes": lambda: (lambda o: (o[:, :5], o))(_out(64, 10)),
}


@pytest.mark.parametrize("name", list(MIXED))
def test_reshapes_that_mix_samples_are_found(name):
    x, out = MIXED[name]()
    found = judge(x, out)
    assert found["judged"] and found["mixed"], (name, found)


@pytest.mark.parametrize("name", list(QUIET))
def test_legitimate_reshapes_and_combinations_stay_quiet(name):
    x, out = QUIET[name]()
    found = judge(x, out)
    assert found["judged"] and not found["mixed"], (name, found)


def test_a_loss_input_not_computed_from_the_output_is_not_judged():
    out = _out(8, 3)
    other = torch.randn(8, 3, requires_grad=True) * 1.0
    assert judge(other, out) is None


def test_the_check_leaves_gradients_and_the_global_rng_alone():
    x, out = MIXED["view(10, -1).t() of (N, C)"]()
    state = torch.get_rng_state()
    judge(x, out)
    assert torch.equal(state, torch.get_rng_state())
    x.sum().backward()   # the script's own backward still works: the graph was retained
    leaf = out.grad_fn.next_functions[0][0].variable
    assert leaf.grad is not None and torch.allclose(leaf.grad, torch.full_like(leaf, 2.0))


SCRIPT = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
x, y = torch.randn(256, 12), torch.randint(0, 4, (256,))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for xb, yb in loader:
    optimizer.zero_grad()
    out = model(xb)
    loss = F.cross_entropy({LOSS_INPUT}, yb)
    loss.backward()
    optimizer.step()
'''


def _recorded(tmp_path: Path, loss_input: str):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.replace("{LOSS_INPUT}", loss_input), encoding="utf-8")
    listener = SampleMixing()
    try:
        run = run_script(load_script(str(path)), [], RunOptions(max_steps=4, listeners=[listener]))
    finally:
        listener.close()
    target = ScriptTarget(run)
    return PROBES["trace-sample-mixing"](ProbeContext(target, params={})), target


def test_the_recorded_script_that_mixes_samples_fails_the_probe(tmp_path):
    result, target = _recorded(tmp_path, "out.view(4, -1).t()")
    assert result.outcome == "mixed", result.summary
    assert "train.py:" in result.summary and "view, t" in result.summary
    assert not target.recording.models[0].module._forward_hooks   # the listener's hook is gone


def test_the_recorded_script_that_keeps_samples_apart_passes(tmp_path):
    result, _ = _recorded(tmp_path, "F.log_softmax(out, 1) * 1.0")
    assert result.status == "passed" and result.outcome == "ok", result.summary


TAGGER = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(5, 16)           # time-first, PyTorch's default
        self.head = nn.Linear(16, 3)
    def forward(self, x):
        return self.head(self.gru(x)[0])
model = Tagger()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
{LOOP}
'''
SLICED = '''
x, y = torch.randn(9, 64, 5), torch.randint(0, 3, (9, 64))      # (T, B, F), tags (T, B)
for start in range(0, 64, 16):
    logits = model(x[:, start:start + 16])
    loss = F.cross_entropy(logits.reshape(-1, 3), y[:, start:start + 16].reshape(-1))
    optimizer.zero_grad(); loss.backward(); optimizer.step()
'''
LOADER = '''
x, y = torch.randn(64, 9, 5), torch.randint(0, 3, (64, 9))      # batch-first data into a time-first GRU
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
for xb, yb in loader:
    logits = model(xb)
    loss = F.cross_entropy(logits.reshape(-1, 3), yb.reshape(-1))
    optimizer.zero_grad(); loss.backward(); optimizer.step()
'''


def _batch_independence(tmp_path: Path, loop: str):
    from conftest import run_probe_on

    path = tmp_path / "tagger.py"
    path.write_text(TAGGER.replace("{LOOP}", loop), encoding="utf-8")
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=4)))
    return run_probe_on("batch-independence", target), target


def test_a_time_first_rnn_fed_time_first_by_the_script_is_not_called_axes_swapped(tmp_path):
    result, target = _batch_independence(tmp_path, SLICED)
    assert not target.inputs_batch_first
    assert result.status == "skipped" and result.outcome == "time-first", result.summary


def test_batch_first_loader_data_into_a_time_first_rnn_is_still_found(tmp_path):
    result, target = _batch_independence(tmp_path, LOADER)
    assert target.inputs_batch_first
    assert result.outcome == "sequence-axis", result.summary
