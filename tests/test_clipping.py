"""trace-clip: gradient clipping that runs where no step applies it (script mode)."""

from __future__ import annotations

import pytest
import torch

from nnwizard.probes.api import ProbeContext, get
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

LOOP = '''
import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_

torch.manual_seed(0)
X, Y = torch.randn(256, 6), torch.randn(256, 1)
model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    for i in range(0, 256, 32):
        loss = nn.functional.mse_loss(model(X[i:i + 32]), Y[i:i + 32])
        opt.zero_grad()
        BEFORE
        loss.backward()
        BETWEEN
        opt.step()
        AFTER
'''
CLIP = "clip_grad_norm_(model.parameters(), 0.1)"
ORIGINAL = torch.nn.utils.clip_grad_norm_


def _trace_clip(tmp_path, where: str | None):
    text = LOOP
    for slot in ("BEFORE", "BETWEEN", "AFTER"):
        text = text.replace(slot, CLIP if slot == where else "pass")
    path = tmp_path / "train.py"
    path.write_text(text)
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=30)))
    return get("trace-clip")(ProbeContext(target))


@pytest.mark.parametrize("where", ["BEFORE", "AFTER"])
def test_clipping_before_backward_or_after_step_fires(tmp_path, where):
    result = _trace_clip(tmp_path, where)
    assert result.outcome == "clip-stale", result.summary
    assert result.data["fresh_calls"] == 0 and result.data["calls"] >= 15
    assert result.data["stale_norms_zero"] is (where == "BEFORE")   # set_to_none: no gradient before backward
    assert "train.py:" in result.summary


def test_clipping_between_backward_and_step_is_quiet(tmp_path):
    result = _trace_clip(tmp_path, "BETWEEN")
    assert result.outcome == "ok", result.summary
    assert result.data["fresh_calls"] == result.data["calls"] == 16
    assert result.data["over_limit"] > 0          # max_norm 0.1 is below this model's gradient norm
    assert torch.nn.utils.clip_grad_norm_ is ORIGINAL is torch.nn.utils.clip_grad.clip_grad_norm_  # the patch is undone


def test_no_clipping_is_quiet(tmp_path):
    result = _trace_clip(tmp_path, None)
    assert result.outcome == "ok" and result.data["calls"] == 0
