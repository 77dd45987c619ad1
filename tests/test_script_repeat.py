"""Script mode: script-overfit on a script that feeds its model without a DataLoader (slices of its
own tensors, a carried hidden state): every training call gets the first step's tensors again
(wizard/script_replace.py RepeatFirstStep), and the probe says so honestly where that cannot hold."""

from __future__ import annotations

from pathlib import Path

from conftest import run_probe_on
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

SLICED = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
g = torch.Generator().manual_seed(3)
X = torch.randn(512, 8, generator=g)
Y = torch.randint(0, 4, (512,), generator=g)          # random labels: only memorising one batch works
model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(30):
    for i in range(0, len(X), {BS}):
        xb, yb = X[i:i + {BS}], Y[i:i + {BS}]
        loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
    torch.save(model, "model.pt")                      # pickles the model: nothing of nnwizard's may be on it
'''
RAGGED = SLICED.replace("for i in range(0, len(X), {BS}):", "for i in range(0, len(X) - 40, 40):").replace(
    "X[i:i + {BS}], Y[i:i + {BS}]", "X[i:i + 8 + i % 32], Y[i:i + 8 + i % 32]")


def _target(tmp_path: Path, text: str) -> ScriptTarget:
    path = tmp_path / "train.py"
    path.write_text(text, encoding="utf-8")
    return ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=40)))


def test_a_sliced_loop_repeats_its_first_step_and_memorises_it(tmp_path):
    target = _target(tmp_path, SLICED.replace("{BS}", "32"))
    assert not target.recording.loaders and not target.feeds_one_batch
    result = run_probe_on("script-overfit", target)
    assert result.outcome == "learns", result.summary
    assert result.data["first_step_repeated"] and "first step's model inputs and loss target" in result.summary
    rerun = target.reruns[-1]
    assert rerun.exit != "raised" and rerun.steps >= 20, rerun   # torch.save(model) inside the rerun worked


def test_the_loop_without_a_repeat_does_not_memorise_random_labels(tmp_path):
    # the same script observed plainly: the loss does not fall to zero on new random labels each step,
    # so 'learns' above comes from the repeat, not from the script
    target = _target(tmp_path, SLICED.replace("{BS}", "32"))
    losses = [s.loss for s in target.recording.steps]
    assert min(losses[-10:]) > 0.5, losses


def test_batches_of_changing_size_are_not_called_one_batch(tmp_path):
    result = run_probe_on("script-overfit", _target(tmp_path, RAGGED))
    assert result.status == "skipped" and result.data.get("cannot_run") == "precondition", result.summary
    assert "could not all be given the first step's tensors" in result.summary


def test_a_small_corpus_whose_every_epoch_ends_in_a_short_slice_is_still_one_batch_repeated(tmp_path):
    # 112 rows in slices of 32: every fourth call is the epoch's last slice of 16 (a quarter of the calls,
    # well over 10%); it keeps its own tensors, and the rest is the first step repeated
    target = _target(tmp_path, SLICED.replace("{BS}", "32").replace("randn(512,", "randn(112,").replace(
        "(512,), generator", "(112,), generator"))
    result = run_probe_on("script-overfit", target)
    assert result.outcome in ("learns", "slow") and result.data.get("kept_steps"), result.summary


def test_the_repeat_leaves_torch_and_the_model_class_as_it_found_them(tmp_path):
    import torch
    import torch.nn.functional as F

    before = (torch.nn.Sequential.forward, F.cross_entropy)
    target = _target(tmp_path, SLICED.replace("{BS}", "32"))
    run_probe_on("script-overfit", target)
    assert (torch.nn.Sequential.forward, F.cross_entropy) == before
    assert "forward" in torch.nn.Sequential.__dict__
