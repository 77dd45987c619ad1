"""Loops over range() in the script's own code are capped like DataLoader passes (wizard/script_ranges.py)."""

from __future__ import annotations

import pickle
import re
import random
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import torch

from nnwizard.probes.api import ProbeContext, get
from nnwizard.script_ranges import CappedRange, capped_range
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

from test_script_mode import write   # (tests/ is on sys.path: pytest's rootdir-relative imports)

# word_language_model style: the data is one long tensor cut into slices by range(); evaluate() slices too.
SLICES = '''
import torch
from torch import nn

torch.manual_seed(0)
data = torch.randn(4000, 8)
labels = (data[:, 0] > 0).long()
val, val_labels = data[:400], labels[:400]
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
crit = nn.CrossEntropyLoss()
BATCH = 10


def evaluate():
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, val.size(0), BATCH):
            total += crit(model(val[i:i + BATCH]), val_labels[i:i + BATCH]).item()
    return total


def train():
    model.train()
    for batch, i in enumerate(range(0, data.size(0), BATCH)):
        opt.zero_grad()
        loss = crit(model(data[i:i + BATCH]), labels[i:i + BATCH])
        loss.backward()
        opt.step()


for epoch in range(1, 4):
    train()
    print(f"epoch {epoch} val {evaluate():.3f}")
'''


def record(path: Path, **opts) -> ScriptTarget:
    return ScriptTarget(run_script(load_script(str(path)), [], RunOptions(**{"max_steps": 60, **opts})))


def test_a_slice_loop_ends_after_the_cap_so_evaluation_and_the_next_epoch_are_seen(tmp_path):
    target = record(write(tmp_path, text=SLICES), limit_batches=20)
    rec = target.recording
    assert len(rec.steps) == 60 and target.run.exit == "stopped"   # 3 epochs x 20 slices, not 60 of epoch 1's 400
    evals = [c for c in rec.loss_calls if c.eval]
    assert len(evals) == 2 * 20                                   # two evaluations, each capped at 20 slices
    assert any("range()" in n and "capped at 20" in n for n in rec.notes)
    assert "epoch 2 val" in "\n".join(target.run.output)
    assert rec.capped_training == 2   # epochs 1 and 2 ended by the cap; the run stopped inside epoch 3


def test_train_mode_never_restored_is_found_in_a_slice_loop_script(tmp_path):
    broken = record(write(tmp_path, ("    model.train()\n    for batch", "    for batch"), text=SLICES), limit_batches=20)
    assert get("trace-train-mode")(ProbeContext(broken)).outcome == "stays-eval"
    healthy = record(write(tmp_path, name="healthy.py", text=SLICES), limit_batches=20)
    assert get("trace-train-mode")(ProbeContext(healthy)).outcome == "ok"


def test_without_a_cap_the_first_epoch_outlasts_the_run(tmp_path):
    target = record(write(tmp_path, text=SLICES), limit_batches=None)
    assert len(target.recording.steps) == 60 and not any(c.eval for c in target.recording.loss_calls)
    assert target.recording.capped_training == 0


FULL_BATCH = '''
import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(64, 4)
y = x.sum(1, keepdim=True)
rows = []
for i in range(100):                 # builds data: no forward, never capped
    rows.append(i)
assert len(rows) == 100
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(50):              # the outermost loop: a full-batch script's whole training
    opt.zero_grad()
    total = 0.0
    for j in range(32):              # per-sample forwards with gradients, no step inside: never capped
        total = total + ((model(x[j]) - y[j]) ** 2).mean()
    kept = [k for k in range(40)]    # a loop that builds a list inside the epoch loop
    assert len(kept) == 40
    (total / 32).backward()
    opt.step()
print("done", epoch)
'''


def test_outer_loops_data_loops_and_per_sample_loops_run_to_their_end(tmp_path):
    target = record(write(tmp_path, text=FULL_BATCH), limit_batches=3)
    assert target.run.exit == "finished", target.run.output
    assert len(target.recording.steps) == 50 and "done 49" in target.run.output[-1]
    assert not any("range()" in n for n in target.recording.notes)


HELPER = '''
def train_epoch(model, opt, crit, data, labels, batch):
    for i in range(0, data.size(0), batch):
        opt.zero_grad()
        crit(model(data[i:i + batch]), labels[i:i + batch]).backward()
        opt.step()
'''

USES_HELPER = '''
import torch
from torch import nn
from helpers import train_epoch

range = range   # (a script may bind the name itself: its own binding is kept)
data = torch.randn(500, 8)
labels = (data[:, 0] > 0).long()
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    train_epoch(model, opt, nn.CrossEntropyLoss(), data, labels, 10)
    print("epoch", epoch)
'''


def test_loops_in_the_scripts_own_modules_are_capped_too(tmp_path):
    write(tmp_path, name="helpers.py", text=HELPER)
    target = record(write(tmp_path, text=USES_HELPER), limit_batches=5)
    assert target.run.exit == "finished" and len(target.recording.steps) == 15   # 3 epochs x 5 slices
    assert "helpers" not in __import__("sys").modules   # dropped with the run


def test_capped_range_behaves_as_range():
    rng = capped_range(NS(recording=NS(notes=[])))
    r = rng(0, 10, 2)
    assert (len(r), r[1], r[-1], list(r), list(reversed(r))) == (5, 2, 8, [0, 2, 4, 6, 8], [8, 6, 4, 2, 0])
    assert r[1:3] == range(2, 6, 2) and r == range(0, 10, 2) and hash(r) == hash(range(0, 10, 2))
    assert 4 in r and 5 not in r and r.count(4) == 1 and r.index(6) == 3 and not rng(0) and repr(r) == "range(0, 10, 2)"
    assert (r.start, r.stop, r.step) == (0, 10, 2)
    assert isinstance(r, rng) and isinstance(range(3), rng) and isinstance(r, CappedRange) and not isinstance(3, rng)
    assert type(pickle.loads(pickle.dumps(r))) is range and pickle.loads(pickle.dumps(r)) == range(0, 10, 2)
    assert len(random.sample(rng(10), 3)) == 3 and torch.tensor(rng(4)).tolist() == [0, 1, 2, 3]
    assert list(enumerate(rng(2))) == [(0, 0), (1, 1)] and sum(rng(5)) == 10
    with pytest.raises(TypeError):
        rng("a")


def test_an_evaluation_whose_gathered_predictions_meet_all_labels_runs_again_uncapped(tmp_path):
    gathered = write(tmp_path, ("""        for i in range(0, val.size(0), BATCH):
            total += crit(model(val[i:i + BATCH]), val_labels[i:i + BATCH]).item()
    return total""", """        preds = [model(val[i:i + BATCH]).argmax(1) for i in range(0, val.size(0), BATCH)]
    model.train()
    return (torch.cat(preds) == val_labels).float().mean().item()   # fails on a capped pass: 200 vs 400"""), text=SLICES)
    target = record(gathered, limit_batches=20)
    assert target.run.exit == "stopped" and target.recording.error is None, target.run.output
    assert any("evaluation passes uncapped, did not raise" in n for n in target.recording.notes), target.recording.notes
    assert len(target.recording.steps) == 60 and "epoch 2 val" in "\n".join(target.run.output)


def test_hand_written_updates_lower_the_cap_when_steps_are_slow(tmp_path):
    """BatchCap and StepFit hear of hand-written updates too (word_language_model updates by hand)."""
    slow = write(tmp_path, ("""        opt.step()
""", """        import time
        time.sleep(0.3)
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
"""), text=SLICES)
    target = record(slow, limit_batches=20, time_limit_s=10.0)
    rec = target.recording
    assert rec.steps and all(s.manual for s in rec.steps)
    caps = [int(m) for n in rec.notes for m in re.findall(r"loops over range\(\) .* capped at (\d+) iterations", n)]
    assert caps == [rec.pass_cap] and 4 <= caps[0] <= 13, rec.notes   # at most 10 s / (2.5 passes x 0.3 s), not the 20 given
    assert not any("batches per pass" in n for n in rec.notes)   # (no DataLoader: the slice loops' own note says it)
    assert any(c.eval for c in rec.loss_calls)                      # the first evaluation was reached


def test_steps_of_a_slice_loop_get_their_epoch_and_batch(tmp_path):
    target = record(write(tmp_path, text=SLICES), limit_batches=20)
    marks = [(s.epoch, s.batch) for s in target.recording.steps]
    assert marks == [(e, b) for e in (1, 2, 3) for b in range(20)]


def test_a_per_sample_loop_inside_a_slice_loop_keeps_the_batch_numbers(tmp_path):
    per_sample = write(tmp_path, ("""        loss = crit(model(data[i:i + BATCH]), labels[i:i + BATCH])
""", """        loss = sum(crit(model(data[j:j + 1]), labels[j:j + 1]) for j in range(i, i + BATCH)) / BATCH
"""), text=SLICES)
    target = record(per_sample, limit_batches=5, max_steps=15)
    assert [(s.epoch, s.batch) for s in target.recording.steps] == [(e, b) for e in (1, 2, 3) for b in range(5)]


def test_the_per_step_trace_shows_where_the_model_stayed_in_eval_mode(tmp_path):
    from nnwizard.script_view import _trace_rows, observed
    broken = record(write(tmp_path, ("    model.train()\n    for batch", "    for batch"), text=SLICES), limit_batches=20)
    rows = _trace_rows(observed(broken)["trace"])
    shown = {r[0]: r for r in rows if r[0] != "…"}
    assert shown[20][1] == "1.19" and shown[20][7] == "train"   # the last step of epoch 1, in training mode
    assert shown[21][1] == "2.0" and shown[21][7] == "eval"     # the first of epoch 2, after evaluate()
    assert [r[0] for r in rows][-3:] == [58, 59, 60] and len(rows) <= 14


def test_a_generator_that_slices_in_a_range_loop_is_capped_too(tmp_path):
    generated = write(tmp_path, ("""def train():
    model.train()
    for batch, i in enumerate(range(0, data.size(0), BATCH)):
        opt.zero_grad()
        loss = crit(model(data[i:i + BATCH]), labels[i:i + BATCH])""", """def batches():
    for i in range(0, data.size(0), BATCH):
        yield data[i:i + BATCH], labels[i:i + BATCH]


def train():
    model.train()
    for x, y in batches():
        opt.zero_grad()
        loss = crit(model(x), y)"""), text=SLICES)
    target = record(generated, limit_batches=6, max_steps=60)
    assert [(s.epoch, s.batch) for s in target.recording.steps] == [(e, b) for e in (1, 2, 3) for b in range(6)]


def test_a_real_crash_after_a_capped_evaluation_stays_the_finding(tmp_path):
    crashing = write(tmp_path, ("""    print(f"epoch {epoch} val {evaluate():.3f}")""", """    print(f"epoch {epoch} val {evaluate():.3f}")
    if epoch == 2:
        model(torch.randn(4, 9))   # a layer-shape bug of the script's own, after the second evaluation"""), text=SLICES)
    target = record(crashing, limit_batches=20)
    assert target.run.exit == "raised" and "mat1 and mat2" in target.recording.error.message
    assert not any("run again" in n or "first run raised" in n for n in target.recording.notes)


EPISODES = '''
import torch
from torch import nn

torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
opt = torch.optim.SGD(policy.parameters(), lr=0.01)
policy.eval()
for run in range(2):
    for episode in range(3):
        logps = []
        for t in range(50):        # an episode: policy calls with gradients, one backward after it
            logps.append(policy(torch.randn(1, 4)).log_softmax(-1)[0, 0])
        opt.zero_grad()
        (-torch.stack(logps).sum()).backward()
        opt.step()
        print("episode", len(logps))
'''


def test_an_episode_of_policy_calls_with_gradients_is_not_an_evaluation_pass(tmp_path):
    target = record(write(tmp_path, text=EPISODES), limit_batches=5)
    assert target.run.exit == "finished" and len(target.recording.steps) == 6
    assert all(line == "episode 50" for line in target.run.output), target.run.output


def test_the_batch_cap_note_appears_for_a_dataloader_and_not_for_a_full_batch_script(tmp_path):
    """A slow script's lowered batch cap is noted where it caps something: a DataLoader's passes. A full-batch
    script (the graph-attention example: one forward over every node per step) has no pass to cap, and its report
    said 'batches per pass (DataLoader or slice loop) capped at 4' all the same."""
    from test_script_mode import BASE

    slow = "            opt.step()\n            __import__('time').sleep(0.2)\n"
    loader = record(write(tmp_path, ("            opt.step()\n", slow), text=BASE), limit_batches=20, time_limit_s=6.0)
    assert any("batches per pass" in n for n in loader.recording.notes), loader.recording.notes
    full = '''
import time, torch
from torch import nn
torch.manual_seed(0)
X, Y = torch.randn(256, 8), torch.randint(0, 2, (256,))
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(40):
    opt.zero_grad()
    nn.functional.cross_entropy(model(X), Y).backward()
    opt.step()
    time.sleep(0.2)
'''
    target = record(write(tmp_path, text=full, name="full.py"), limit_batches=20, time_limit_s=6.0)
    assert len(target.recording.steps) >= 3 and not any("batches per pass" in n for n in target.recording.notes)
