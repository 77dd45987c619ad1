"""A script that compiles its model (``torch.compile``, nanoGPT's default) is recorded eagerly: the model is
the user's class, the loss computed inside its forward is seen, no step pays for compilation, and every
form of the call (a module, a function, a decorator with or without arguments, ``Module.compile()``,
``model._orig_mod``) keeps working; torch.compile is itself again afterwards."""

from __future__ import annotations

import torch

from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

COMPILED = '''
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x, y=None):
        logits = self.fc(x)
        return logits, (F.cross_entropy(logits, y) if y is not None else None)


@torch.compile
def scale(t):
    return t * 1.0


@torch.compile(mode="reduce-overhead")
def shift(t):
    return t + 0.0


raw = Net()
model = torch.compile(raw)
other = nn.Linear(2, 2)
other.compile()
assert model._orig_mod is raw or model._orig_mod is model
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
for step in range(10):
    _, loss = model(shift(scale(x)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("done", loss.item())
'''


def test_a_compiled_model_is_recorded_eagerly_with_its_own_loss(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(COMPILED)
    real = torch.compile
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=10)))
    rec = target.recording
    assert target.run.exit in ("finished", "stopped"), target.run.output[-5:]
    assert [m.name for m in rec.models] == ["Net"]
    assert [c.fn for c in rec.loss_calls if not c.eval][:1] == ["cross_entropy"] and len(rec.steps) == 10
    assert any("torch.compile ran eagerly" in n for n in rec.notes)
    assert torch.compile is real and torch.nn.Module.compile is not None   # given back


def test_a_script_without_compile_has_no_note(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(COMPILED.replace("torch.compile(raw)", "raw").replace("@torch.compile(mode=\"reduce-overhead\")\n", "")
                    .replace("@torch.compile\n", "").replace("other.compile()\n", "").replace(
                        "assert model._orig_mod is raw or model._orig_mod is model\n", ""))
    rec = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=10))).recording
    assert not any("torch.compile" in n for n in rec.notes) and [m.name for m in rec.models] == ["Net"]
