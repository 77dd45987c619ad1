"""Script mode: a script that trains only in child processes (Hogwild style) records no step in its
own process; the one sentence says why, instead of 'never called a torch.nn.Module'."""

from __future__ import annotations

import multiprocessing.process
from pathlib import Path

from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget
from nnwizard.script_view import script_problem

SCRIPT = '''
import multiprocessing as mp
import torch
from torch import nn

def train(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad(); model(torch.randn(4, 3)).sum().backward(); opt.step()

if __name__ == "__main__":
    model = nn.Linear(3, 1)
    {RUN}
'''


def _problem(tmp_path: Path, run: str) -> str | None:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.replace("{RUN}", run), encoding="utf-8")
    before = multiprocessing.process.BaseProcess.start
    result = run_script(load_script(str(path)), [], RunOptions(max_steps=10))
    assert multiprocessing.process.BaseProcess.start is before
    return script_problem(ScriptTarget(result))


def test_training_only_in_child_processes_is_named(tmp_path):
    text = _problem(tmp_path, "p = mp.get_context('fork').Process(target=train, args=(model,)); p.start(); p.join()")
    assert text is not None and "1 child process" in text and "does not record" in text


def test_training_in_the_main_process_has_no_problem(tmp_path):
    assert _problem(tmp_path, "train(model)") is None
