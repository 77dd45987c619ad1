"""Task and class count come from the loss actually called and the class dimension of its input,
never from the batch size; a guess says it is one."""

from __future__ import annotations

import textwrap

import pytest

from nnwizard.target import load_target

BASE = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

g = torch.Generator().manual_seed(0)
X = torch.randn(64, 5, generator=g)

def build_data():
    return TensorDataset(X, Y), None
"""


def load(tmp_path, body: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(BASE + textwrap.dedent(body))
    return load_target(str(path), "cpu")


def test_lambda_mse_with_long_targets_is_regression(tmp_path):
    t = load(tmp_path, """
        Y = torch.randint(0, 5, (64,))
        def build_model():
            return nn.Linear(5, 1)
        loss_fn = lambda out, y: F.mse_loss(out.squeeze(1), y.float())
    """, "task_mse_long")
    assert t.task == "regression" and "mse_loss" in t.task_source and t.expected_initial_loss(t.batch()[1]) is None


def test_class_count_from_the_loss_input_not_the_batch(tmp_path):
    t = load(tmp_path, """
        Y = torch.randint(0, 3, (64,))
        class Seq(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(5, 3)
            def forward(self, x):
                return self.fc(x).unsqueeze(0)          # [1, B, 3]
        def build_model():
            return Seq()
        loss_fn = lambda out, y: F.cross_entropy(out.squeeze(0), y)
    """, "task_ce_batchfirst")
    assert t.task == "classification" and t.num_classes == 3 and "3 classes" in t.task_source


def test_custom_loss_is_a_guess_that_says_so(tmp_path):
    t = load(tmp_path, """
        Y = torch.randint(0, 2, (64,))
        def build_model():
            return nn.Linear(5, 2)
        def loss_fn(out, y):
            return -(out.log_softmax(1).gather(1, y[:, None])).mean()
    """, "task_custom")
    assert t.task == "classification" and "set TASK" in t.task_source


def test_declared_task_wins(tmp_path):
    t = load(tmp_path, """
        Y = torch.rand(64)
        TASK = "regression"
        def build_model():
            return nn.Linear(5, 1)
        loss_fn = nn.L1Loss()
    """, "task_declared")
    assert t.task == "regression" and t.task_source == "TASK"


@pytest.mark.parametrize("loss, task", [("nn.CrossEntropyLoss()", "classification"), ("nn.MSELoss()", "regression")])
def test_plain_loss_modules(tmp_path, loss, task):
    y = "torch.randint(0, 2, (64,))" if task == "classification" else "torch.rand(64, 2)"
    t = load(tmp_path, f"""
        Y = {y}
        def build_model():
            return nn.Linear(5, 2)
        loss_fn = {loss}
    """, f"task_plain_{task}")
    assert t.task == task
