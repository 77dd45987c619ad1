"""eval-stochastic: a functional dropout that model.eval() does not turn off (module mode and script mode)."""

from __future__ import annotations

import pytest

from nnwizard.target import load_target
from tests.conftest import load_example, run_probe_on

MODULE = """
import torch
from torch import nn
import torch.nn.functional as F
from examples.datasets import blobs, split
loss_fn = nn.CrossEntropyLoss()
def build_data(): return split(*blobs())
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)
    def forward(self, x):
        h = F.relu(self.fc1(x))
        {noise}
        return self.fc2(h)
def build_model(): return Net()
"""


def module_target(tmp_path, noise: str, name: str = "mod"):
    path = tmp_path / f"{name}.py"   # a module name per variant: the loader caches modules by name
    path.write_text(MODULE.replace("{noise}", noise))
    return load_target(str(path), "cpu")


def test_functional_dropout_without_the_training_flag_fires_and_names_its_line(tmp_path):
    result = run_probe_on("eval-stochastic", module_target(tmp_path, "h = F.dropout(h, 0.5)"))
    assert result.outcome == "stochastic", result.summary
    assert result.data["relative_difference"] > 0.01 and result.data["changed_share"] > 0.5
    assert "dropout at mod.py:14 in forward" in result.summary


@pytest.mark.parametrize("noise", ["h = F.dropout(h, 0.5, training=self.training)", "pass"])
def test_dropout_that_follows_the_mode_is_quiet(tmp_path, noise):
    result = run_probe_on("eval-stochastic", module_target(tmp_path, noise, f"mod_quiet_{len(noise)}"))
    assert result.outcome == "ok" and result.data["relative_difference"] == 0.0, result.summary


def test_sampling_by_design_is_not_a_dropout_fault(tmp_path):
    """A VAE-style forward that samples in eval mode on purpose: random, but no dropout op is active."""
    result = run_probe_on("eval-stochastic", module_target(tmp_path, "h = h + 0.1 * torch.randn_like(h)", "mod_vae"))
    assert result.outcome == "random-by-design" and result.status == "passed", result.summary


def test_nn_dropout_modules_in_eval_mode_are_quiet():
    result = run_probe_on("eval-stochastic", load_example("healthy_cnn"))
    assert result.outcome == "ok", result.summary


# self-attention over the hidden units seen as 4 tokens of 8 features; attention dropout through SDPA's dropout_p
ATTENTION = ("q = h.view(-1, 4, 8); h = F.scaled_dot_product_attention(q, q, q, dropout_p={p}).reshape(-1, 32)")


def test_attention_dropout_that_ignores_the_mode_fires(tmp_path):
    result = run_probe_on("eval-stochastic", module_target(tmp_path, ATTENTION.format(p="0.5"), "mod_sdpa"))
    assert result.outcome == "stochastic", result.summary
    assert "scaled_dot_product_attention at mod_sdpa.py:14" in result.summary and "dropout_p" in result.summary


def test_attention_dropout_that_follows_the_mode_is_quiet(tmp_path):
    noise = ATTENTION.format(p="0.5 if self.training else 0.0")
    result = run_probe_on("eval-stochastic", module_target(tmp_path, noise, "mod_sdpa_quiet"))
    assert result.outcome == "ok", result.summary
