"""Script mode, from the recording: trace-clip (gradient clipping that runs where no step applies it) and
trace-optimizer-rebuilt (an optimizer built anew every step)."""

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
        REBUILD
        opt.zero_grad()
        BEFORE
        loss.backward()
        BETWEEN
        opt.step()
        AFTER
'''
CLIP = "clip_grad_norm_(model.parameters(), 0.1)"
ORIGINAL = torch.nn.utils.clip_grad_norm_


def _audit(tmp_path, probe_id: str, where: str | None = None, rebuild: str = "pass", epochs: int = 2,
           max_steps: int = 30):
    text = LOOP.replace("REBUILD", rebuild).replace("range(2)", f"range({epochs})")
    for slot in ("BEFORE", "BETWEEN", "AFTER"):
        text = text.replace(slot, CLIP if slot == where else "pass")
    path = tmp_path / "train.py"
    path.write_text(text)
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=max_steps)))
    return get(probe_id)(ProbeContext(target))


def _trace_clip(tmp_path, where: str | None):
    return _audit(tmp_path, "trace-clip", where)


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


@pytest.mark.parametrize("optimizer", ["torch.optim.Adam(model.parameters(), lr=1e-3)",
                                       "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)"])
def test_an_optimizer_with_state_built_every_step_fires(tmp_path, optimizer):
    result = _audit(tmp_path, "trace-optimizer-rebuilt", rebuild=f"opt = {optimizer}")
    assert result.outcome == "rebuilt", result.summary
    assert result.data["built"] >= 16 and result.data["stepped"] == 16 and result.data["most_steps_by_one"] == 1


def test_an_optimizer_rebuilt_past_the_builds_kept_still_fires(tmp_path):
    """The recording keeps the step of the first 64 builds only; over 100 steps the last one kept is not
    one object stepped 37 times."""
    result = _audit(tmp_path, "trace-optimizer-rebuilt", rebuild="opt = torch.optim.Adam(model.parameters(), lr=1e-3)",
                    epochs=20, max_steps=100)
    assert result.outcome == "rebuilt", result.summary
    assert result.data["built"] == 100 and result.data["most_steps_by_one"] == 1

def test_plain_sgd_rebuilt_every_step_loses_nothing(tmp_path):
    result = _audit(tmp_path, "trace-optimizer-rebuilt", rebuild="opt = torch.optim.SGD(model.parameters(), lr=0.05)")
    assert result.outcome == "rebuilt-stateless" and result.status == "passed", result.summary


def test_an_optimizer_built_once_is_quiet(tmp_path):
    result = _audit(tmp_path, "trace-optimizer-rebuilt")
    assert result.outcome == "ok" and result.data["built"] == 1 and result.data["most_steps_by_one"] == 16, result.summary


def test_the_recording_keeps_one_optimizer_per_family_alive(tmp_path):
    """A loop that builds an Adam per step must not have the recorder keep every one (each with its state)."""
    import gc

    path = tmp_path / "train.py"
    path.write_text(LOOP.replace("REBUILD", "opt = torch.optim.Adam(model.parameters(), lr=1e-3)")
                    .replace("BEFORE", "pass").replace("BETWEEN", "pass").replace("AFTER", "pass"))
    def adams() -> int:   # (other tests may leave optimizers behind: count the difference)
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.optim.Adam))

    before = adams()
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=30)))
    assert len(target.recording.optimizers) == 2          # the SGD built before the loop, and the Adam family
    assert target.recording.optimizers[1].built == 16 and adams() - before <= 1


def test_the_recorded_gradient_norm_is_the_one_before_the_scripts_clip(tmp_path):
    """The per-step trace's grad norm is what clip_grad_norm_ returned (after the clip every measured norm would be
    0.1, so a growing or exploding gradient would never show), the clipped one kept beside it; without clipping
    there is nothing beside it."""
    from nnwizard.script_view import CLIPPED, markdown_lines, observed

    text = LOOP.replace("REBUILD", "pass").replace("BEFORE", "pass").replace("AFTER", "pass").replace("BETWEEN", CLIP)
    path = tmp_path / "train.py"
    path.write_text(text)
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=12)))
    measured = [s for s in target.recording.steps if s.grad_norm is not None]
    assert measured and all(s.grad_norm > 0.1 and s.grad_norm_clipped <= 0.1 + 1e-6 for s in measured)
    clips = [c.norm for c in target.recording.clips]   # the norms clip_grad_norm_ returned, as trace-clip keeps them
    assert all(s.grad_norm == pytest.approx(clips[s.step - 1], rel=1e-5) for s in measured)
    assert CLIPPED in "\n".join(markdown_lines(observed(target)))
    plain = LOOP.replace("REBUILD", "pass").replace("BEFORE", "pass").replace("AFTER", "pass").replace("BETWEEN", "pass")
    path.write_text(plain)
    unclipped = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=12)))
    assert all(s.grad_norm_clipped is None for s in unclipped.recording.steps)
    assert CLIPPED not in "\n".join(markdown_lines(observed(unclipped)))
