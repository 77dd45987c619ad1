"""record/patches/: what a recording installs is removed again, whatever happens in the program, and each group
of patches records what it intercepts."""

from __future__ import annotations

import multiprocessing.process as mp_process

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nnwizard.record import LOSS_FUNCTIONS, Recorder, StopRun
from nnwizard.record.full import FullPolicy
from nnwizard.record.light import LightPolicy


def _patched_now() -> dict:
    from torch.amp import GradScaler
    from torch.nn.utils import clip_grad

    return {"Module.__call__": nn.Module.__call__, "Module.zero_grad": nn.Module.zero_grad,
            "Module.load_state_dict": nn.Module.load_state_dict, "Optimizer.__init__": torch.optim.Optimizer.__init__,
            "Optimizer.zero_grad": torch.optim.Optimizer.zero_grad, "SGD.step": torch.optim.SGD.__dict__.get("step"),
            "Tensor.backward": torch.Tensor.backward, "autograd.backward": torch.autograd.backward,
            "DataLoader.__iter__": DataLoader.__iter__, "torch.load": torch.load, "GradScaler.scale": GradScaler.scale,
            "clip_grad_norm_": torch.nn.utils.clip_grad_norm_, "clip_grad.clip_grad_norm_": clip_grad.clip_grad_norm_,
            "Distribution.__init__": torch.distributions.Distribution.__init__,
            "Process.start": mp_process.BaseProcess.start, "torch.manual_seed": torch.manual_seed,
            "torch.random.manual_seed": torch.random.manual_seed,
            "LRScheduler.step": torch.optim.lr_scheduler.LRScheduler.step,
            **{f"F.{name}": getattr(F, name) for name in LOSS_FUNCTIONS if hasattr(F, name)}}


def _train(steps: int, fail_at: int | None = None):
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        if i == fail_at:
            raise RuntimeError("the program fails")
        loss = F.mse_loss(model(torch.randn(4, 3)), torch.randn(4, 2))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


@pytest.mark.parametrize("mode", ["full", "light"])
@pytest.mark.parametrize("fail_at", [None, 2])
def test_every_patch_is_undone_on_exit(mode, fail_at):
    torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)   # (torch wraps SGD.step itself at the first SGD built)
    before = _patched_now()
    stack = torch._C._len_torch_function_stack()
    with pytest.raises(RuntimeError) if fail_at is not None else _nothing():
        with Recorder(mode, listeners=[object()]) as rec:
            assert _patched_now() != before
            _train(4, fail_at)
    assert _patched_now() == before
    assert torch._C._len_torch_function_stack() == stack   # (full mode's graph mode is gone too)
    assert isinstance(rec.policy, FullPolicy if mode == "full" else LightPolicy)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_step_budget_ends_the_run_with_stop_run_and_patches_undone():
    torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    before = _patched_now()
    with Recorder("full", max_steps=3) as rec:
        with pytest.raises(StopRun):
            _train(10)
    assert rec.recording.total_steps == 3 and "3 optimizer steps" in rec.recording.stopped
    assert _patched_now() == before


def test_each_group_records_what_it_intercepts(tmp_path):
    model = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.2), nn.Linear(8, 2))
    loader = DataLoader(TensorDataset(torch.randn(12, 3), torch.randint(0, 2, (12,))), batch_size=4)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    with Recorder("full", limit_batches=2) as rec:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)   # (the line that built it is recorded)
        model.load_state_dict(torch.load(tmp_path / "w.pt"))
        for x, y in loader:                                   # data: passes, batches, the cap
            loss = nn.CrossEntropyLoss()(model(x), y)         # modules, losses
            opt.zero_grad()                                   # optimizers
            loss.backward()                                   # backward
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
        torch.distributions.Normal(model(torch.randn(1, 3)), 1.0)
    r = rec.recording
    assert [i.batches for i in r.loaders] == [[2]] and r.capped_training == 1
    assert len(r.models) == 1 and r.models[0].mode_layers == 1 and r.models[0].forwards == 3
    assert [(c.fn, c.input_shape, c.target_shape, c.from_model) for c in r.loss_calls] == \
        [("cross_entropy", [4, 2], [4], True)] * 2
    assert r.zero_grads == 2 and r.backwards == 2 and [s.zero_grad for s in r.steps] == [True, True]
    assert [c.fn for c in r.clips] == ["clip_grad_norm_"] * 2 and all(s.grad_norm_clipped is not None for s in r.steps)
    assert r.optimizers[0].where.startswith("test_record_patches.py:") and r.distributions == 1


def test_child_processes_are_counted_in_full_mode():
    with Recorder("full") as rec:
        p = mp_process.BaseProcess.__new__(mp_process.BaseProcess)   # (counted before it starts: no real process)
        with pytest.raises(Exception):
            p.start()
    assert rec.recording.child_processes == 1
    with Recorder("light") as light:
        pass
    assert light.recording.child_processes == 0


def test_the_programs_own_seed_calls_are_recorded_with_their_line():
    torch.manual_seed(5)   # (before the recording: not recorded)
    with Recorder("full", files=[__file__]) as rec:
        torch.manual_seed(1234)
        _train(2)
        torch.random.manual_seed(7)
    assert [(s.seed, s.step) for s in rec.recording.seeds] == [(1234, 0), (7, 2)]
    assert all(s.where.startswith("test_record_patches.py:") for s in rec.recording.seeds)
    with Recorder("full", files=["elsewhere.py"]) as other:
        torch.manual_seed(3)   # (no frame of the program's files: nnwizard's own seeding looks like this)
    assert other.recording.seeds == []
