"""Script mode: labels paired with the wrong inputs by the script's own data code (two loaders that
shuffle apart) are measured on the pairs the recording captured (label-signal-audit, trees/
script_label_signal.yaml), and the same-batch rerun repeats each zipped loader's own first batch."""

from __future__ import annotations

from pathlib import Path

from conftest import run_probe_on
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

SCRIPT = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
centers = 3 * torch.randn(4, 10)
y = torch.randint(0, 4, (1024,))
x = centers[y] + torch.randn(1024, 10)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
{LOADER}
for epoch in range(2):
    for xb, yb in loader:
        optimizer.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        optimizer.step()
'''
TOGETHER = "loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)"
APART = ("class Zipped:\n"
         "    def __iter__(self):\n"
         "        return zip(torch.utils.data.DataLoader(x, batch_size=32, shuffle=True),\n"
         "                   torch.utils.data.DataLoader(y, batch_size=32, shuffle=True))\n"
         "loader = Zipped()")


def _target(tmp_path: Path, loader: str) -> ScriptTarget:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.replace("{LOADER}", loader), encoding="utf-8")
    return ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=40)))


def test_labels_shuffled_apart_from_their_inputs_carry_no_signal(tmp_path):
    result = run_probe_on("label-signal-audit", _target(tmp_path, APART))
    assert result.outcome == "no-signal", result.summary


def test_labels_kept_with_their_inputs_carry_signal(tmp_path):
    result = run_probe_on("label-signal-audit", _target(tmp_path, TOGETHER))
    assert result.status == "passed", result.summary


def test_the_same_batch_rerun_repeats_each_zipped_loaders_own_first_batch(tmp_path):
    target = _target(tmp_path, APART)
    run = target.rerun(same_batch=True, max_steps=6)
    assert run.exit != "raised", run.recording.error
    calls = [c for c in run.recording.loss_calls if c.inputs is not None and not c.eval]
    assert len(calls) >= 6 and calls[0].target_dtype == "int64"
    assert all(c.targets.equal(calls[0].targets) for c in calls)


MANY_CLASSES = SCRIPT.replace("randn(4, 10)", "randn(5000, 10)").replace("randint(0, 4,", "randint(0, 5000,") \
    .replace("nn.Linear(32, 4)", "nn.Linear(32, 5000)")


def test_too_few_samples_per_class_is_not_read_as_labels_without_signal(tmp_path):
    # 5000 classes, labels that do follow the inputs, a few captured batches: most held-out labels are
    # classes the fitted half never saw, so real and permuted labels both score ~0: no evidence either way
    path = tmp_path / "train.py"
    path.write_text(MANY_CLASSES.replace("{LOADER}", TOGETHER), encoding="utf-8")
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=3)))
    result = run_probe_on("label-signal-audit", target)
    assert result.status == "skipped" and result.outcome == "few-per-class", result.summary


# mixup's shape: the loss called twice on one output (two targets), and an evaluation run with grad on between steps
TWO_CALLS = SCRIPT.replace("F.cross_entropy(model(xb), yb).backward()",
                           "out = model(xb)\n"
                           "        (0.7 * F.cross_entropy(out, yb) + 0.3 * F.cross_entropy(out, yb.flip(0))).backward()\n"
                           "        model(x[:100]).argmax(1)   # a look at the predictions, grad mode on")


def test_each_input_is_paired_with_the_target_of_its_own_forward(tmp_path):
    """Two loss calls per step and an extra forward with grad on: pairs zipped in order drift off their inputs from
    the second step on (labels-misaligned on a healthy mixup script); paired by forward they keep the labels' signal."""
    path = _write(tmp_path, TWO_CALLS.replace("{LOADER}", TOGETHER))
    result = run_probe_on("label-signal-audit", ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=40))))
    assert result.status == "passed", result.summary


def test_paired_by_forward_labels_shuffled_apart_still_carry_no_signal(tmp_path):
    path = _write(tmp_path, TWO_CALLS.replace("{LOADER}", APART))
    result = run_probe_on("label-signal-audit", ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=40))))
    assert result.outcome == "no-signal", result.summary


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "two_calls.py"
    path.write_text(text, encoding="utf-8")
    return path
