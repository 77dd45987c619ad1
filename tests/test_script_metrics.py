"""Script mode: the accuracy a script prints, recounted from its own evaluation's outputs and targets
(script-metric-audit, module mode's rules), and its training samples against its evaluation samples
(script-leakage, module mode's leakage-audit): each fault found, each healthy twin quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from nnwizard.probes._metrics import judge
from nnwizard.probes.api import ProbeContext, load_all
from nnwizard.probes.script_metrics import printed_accuracy
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget
from nnwizard.target import load_target

PROBES = load_all()
SCRIPTS = Path(__file__).resolve().parents[1] / "examples" / "scripts"
EXAMPLES = SCRIPTS.parent


def _target(path: Path, steps: int = 40) -> ScriptTarget:
    return ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=steps)))


@pytest.mark.parametrize("line, value, extra", [
    ("epoch 3 loss 0.21 val accuracy 0.8125", 0.8125, {}),
    ("Test set: Average loss: 0.0001, Accuracy: 9823/10000 (98%)", 9823, {"total": 10000}),
    ("train acc 0.99, val acc 87.5%", 87.5, {"percent_sign": True}),
])
def test_printed_accuracy(line, value, extra):
    found = printed_accuracy(line)
    assert found["value"] == value
    for k, v in extra.items():
        assert found[k] == v


def test_the_rules_shared_with_module_mode():
    counts = {"samples": 400, "batches": 4}
    assert judge("acc", 74.75, 299, counts, "x").outcome == "percent"      # batches of 100: the percentage first
    assert judge("acc", 0.0, 299, counts, "x", fixed_zero=True).outcome == "fixed"
    assert judge("acc", 0.7475, 299, counts, "x", percent_sign=True).outcome == "fraction-as-percent"
    assert judge("acc", 0.7475, 299, counts, "x").outcome is None
    assert judge("acc", 0.6, 299, {"samples": 400, "batches": 4, "dataset": 500}, "x").outcome == "wrong-count"
    assert judge("acc", 0.598, 299, {"samples": 400, "batches": 4, "dataset": 500}, "x",
                 allowed=("samples", "dataset")).outcome is None          # a capped pass over a 500-sample set


@pytest.mark.parametrize("name, outcome", [
    ("broken_accuracy_probabilities_vs_labels", "fixed"),
    ("healthy_accuracy_printed_percent", "percent"),
])
def test_script_metric_audit(name, outcome):
    result = PROBES["script-metric-audit"](ProbeContext(_target(SCRIPTS / f"{name}.py")))
    assert result.outcome == outcome, result.summary
    if outcome == "fixed":
        assert result.data["compare_scores"] and "evaluate" in result.data["compare_where"]


def test_a_script_that_prints_no_accuracy_costs_no_rerun(tmp_path):
    path = tmp_path / "fit.py"
    path.write_text("import torch\nnet = torch.nn.Linear(3, 1)\nopt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
                    "for i in range(20):\n    loss = net(torch.randn(8, 3)).pow(2).mean()\n    opt.zero_grad()\n"
                    "    loss.backward()\n    opt.step()\n    print('loss', loss.item())\n", encoding="utf-8")
    target = _target(path)
    result = PROBES["script-metric-audit"](ProbeContext(target))
    assert result.outcome == "no-accuracy" and not target.reruns


@pytest.mark.parametrize("name, outcome", [
    ("broken_augment_then_split", "leak"),
    ("healthy_split_then_augment", "ok"),
    ("broken_accuracy_probabilities_vs_labels", "ok"),   # DataLoaders over two separate datasets
])
def test_script_leakage(name, outcome):
    result = PROBES["script-leakage"](ProbeContext(_target(SCRIPTS / f"{name}.py")))
    assert result.outcome == outcome, result.summary
    if outcome == "leak":
        assert result.data["augmented_before_split"] and "augmented before it was split" in result.summary


def test_module_leakage_names_augmentation_before_the_split(tmp_path):
    for name in ("broken_augmented_before_split", "broken_train_val_leakage"):   # noisy copies; flipped noisy images
        result = PROBES["leakage-audit"](ProbeContext(load_target(str(EXAMPLES / f"{name}.py"), "cpu")))
        assert result.outcome == "leak" and result.data["augmented_before_split"], result.summary
    repeated = tmp_path / "repeated.py"   # the same records twice (a join gone wrong): copies, not augmentation
    repeated.write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\n"
        "g = torch.Generator().manual_seed(0)\nx = torch.randn(300, 20, generator=g)\ny = (x[:, 0] > 0).long()\n"
        "x, y = torch.cat([x, x]), torch.cat([y, y])\nperm = torch.randperm(600, generator=g)\n"
        "def build_model():\n    return nn.Linear(20, 2)\n"
        "def build_data():\n    return TensorDataset(x[perm[:480]], y[perm[:480]]), TensorDataset(x[perm[480:]], y[perm[480:]])\n"
        "loss_fn = nn.CrossEntropyLoss()\n", encoding="utf-8")
    result = PROBES["leakage-audit"](ProbeContext(load_target(str(repeated), "cpu")))
    assert result.outcome == "leak" and not result.data["augmented_before_split"], result.summary
