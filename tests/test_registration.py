"""parameter-registration: names layers kept in plain lists/dicts, bare tensors requiring grad and
module-level learnable tensors that the loss uses but model.parameters() lacks; quiet on
ModuleList / ModuleDict / nn.Parameter models (and on plain lists of *registered* layers)."""

from __future__ import annotations

import textwrap

import pytest

from nnwizard.target import load_target
from tests.conftest import diagnose_example, load_example, run_probe_on

HEADER = """
import torch
from torch import nn
from examples.datasets import blobs, split
loss_fn = nn.CrossEntropyLoss()
def build_data(): return split(*blobs())
"""


def module_target(tmp_path, name: str, body: str):
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return load_target(str(path), "cpu")


@pytest.mark.parametrize("name", ["healthy_mlp", "healthy_modulelist", "healthy_transformer", "healthy_cnn"])
def test_quiet_when_everything_is_registered(name):
    result = run_probe_on("parameter-registration", load_example(name))
    assert result.outcome == "ok", result.summary
    assert result.data["unregistered_leaves"] == 0 and result.data["loss_leaves"] > 0


def test_layers_in_a_plain_list_are_named():
    result = run_probe_on("parameter-registration", load_example("broken_unregistered_parameters"))
    assert result.outcome == "unregistered"
    assert result.data["attribute"] == "hidden" and result.data["holder_kind"] == "list"
    assert result.data["objects"] == 3 and result.data["object_types"] == "Linear"
    assert result.data["unregistered_values"] == 3 * (64 * 64 + 64)
    assert result.data["used_tensors"] == 6          # 3 weights + 3 biases reached from the loss
    assert "'hidden' of DeepMLP is a plain list" in result.summary


def test_dict_bare_tensor_and_global(tmp_path):
    target = module_target(tmp_path, "mixed", """
        bias = torch.zeros(4, requires_grad=True)               # module-level learnable tensor
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(16, 8)
                self.heads = {"main": nn.Linear(8, 4)}            # should be nn.ModuleDict
                self.temperature = torch.ones(1, requires_grad=True)  # should be nn.Parameter
            def forward(self, x):
                return self.heads["main"](self.body(x)) / self.temperature + bias
        def build_model(): return Net()
    """)
    result = run_probe_on("parameter-registration", target)
    assert result.outcome == "unregistered"
    assert set(result.data["attributes"]) == {"heads", "temperature", "bias"}
    kinds = {row[0]: row[1] for row in result.artifacts[0].rows}
    assert kinds == {"heads": "dict", "temperature": "Tensor", "bias": "global"}


def test_unused_plain_list_is_reported_but_not_as_used(tmp_path):
    target = module_target(tmp_path, "unused", """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 4)
                self.spare = [nn.Linear(4, 4)]          # never called in forward
            def forward(self, x):
                return self.fc(x)
        def build_model(): return Net()
    """)
    result = run_probe_on("parameter-registration", target)
    assert result.outcome == "held-unused" and result.status == "passed"
    assert result.data["attribute"] == "spare" and result.data["used_tensors"] == 0


def test_scripted_diagnosis_ranks_the_fault_first():
    _, report = diagnose_example("broken_unregistered_parameters", ["underfitting"])
    top = report.hypotheses[0]
    assert top.id == "unregistered-parameters", [h.id for h in report.hypotheses[:3]]
    assert top.confidence >= 0.8 and any("'hidden'" in e for e in top.evidence)


def _unregistered_elsewhere() -> str:
    """broken_unregistered_parameters with its plain-list layers built on another device than the model (on a
    GPU machine: left on the CPU while the model went to CUDA; emulated here with the meta device)."""
    from tests.conftest import EXAMPLES

    text = (EXAMPLES / "broken_unregistered_parameters.py").read_text()
    old = "[nn.Linear(width, width) for _ in range(depth)]"
    assert old in text
    return text.replace(old, '[nn.Linear(width, width, device="meta") for _ in range(depth)]')


def test_a_device_mismatch_from_unregistered_layers_is_blamed_on_the_registration(tmp_path):
    """On a GPU, layers kept in a plain list stay on the CPU and the forward raises a device mismatch: the
    mismatch is the symptom, the unregistered layers the cause (device-mismatch ranked first on an H200)."""
    from tests.conftest import EXAMPLES
    from nnwizard.report import build
    from nnwizard.session import Options, diagnose

    path = tmp_path / "unregistered_elsewhere.py"
    path.write_text(_unregistered_elsewhere())
    report = build(diagnose(Options(module=str(path), symptoms=["crash"], device="cpu")))
    ranked = [(h.id, h.confidence) for h in report.hypotheses]
    assert ranked[0][0] == "unregistered-parameters" and ranked[0][1] >= 0.9, ranked
    assert dict(ranked).get("device-mismatch", 0) < 0.5, ranked
    # a device mismatch with every layer registered stays a device mismatch
    plain = build(diagnose(Options(module=str(EXAMPLES / "broken_device_mismatch.py"), symptoms=["crash"], device="cpu")))
    assert plain.hypotheses[0].id == "device-mismatch"
