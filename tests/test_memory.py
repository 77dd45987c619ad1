"""memory-growth: counts the autograd nodes held after each step of the user's loop; fires on a
running loss tensor and on a global list of outputs (naming them), quiet on loops that keep numbers."""

from __future__ import annotations

import textwrap

import pytest

from nnwizard.target import load_target
from tests.conftest import cuda, diagnose_example, load_example, run_probe_on

HEADER = """
import torch
from torch import nn
from examples.datasets import blobs, split
loss_fn = nn.CrossEntropyLoss()
def build_data(): return split(*blobs())
def build_model(): return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
"""


def module_target(tmp_path, name: str, body: str, device: str = "cpu"):
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return load_target(str(path), device)


@pytest.mark.parametrize("name", ["healthy_wine", "healthy_cnn", "healthy_breast_cancer", "broken_train_mode_missing"])
def test_quiet_on_loops_that_keep_numbers(name):
    result = run_probe_on("memory-growth", load_example(name))
    assert result.outcome == "ok", result.summary
    assert "holder" not in result.data


def test_running_total_tensor_is_named():
    result = run_probe_on("memory-growth", load_example("broken_graph_retained"))
    assert result.outcome == "grows"
    assert result.data["holder"] == "total_loss" and "local of train_epoch" in result.data["holder_where"]
    assert result.data["nodes_per_step"] >= 3 and result.data["nodes_last"] > result.data["nodes_first"]
    assert result.data["returned_nodes"] >= result.data["nodes_last"]


def test_global_list_of_outputs_is_named():
    result = run_probe_on("memory-growth", load_example("broken_graph_retained_list"))
    assert result.outcome == "grows" and result.data["holder"] == "history"
    assert "module-level global" in result.data["holder_where"]


def test_model_attribute_and_fixed_loop(tmp_path):
    attr = module_target(tmp_path, "attr", """
        def train_step(model, batch, loss_fn, optimizer):
            x, y = batch
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            optimizer.step()
            model.seen = getattr(model, "seen", []) + [loss]     # kept on the model
            return loss.item()
    """)
    result = run_probe_on("memory-growth", attr)
    assert result.outcome == "grows" and result.data["holder"] == "seen"
    fixed = module_target(tmp_path, "fixed", """
        def train_epoch(model, loader, loss_fn, optimizer, scheduler):
            total = 0.0
            for x, y in loader:
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss.item()
            return total / len(loader)
    """)
    assert run_probe_on("memory-growth", fixed).outcome == "ok"


def test_returned_graph_alone(tmp_path):
    target = module_target(tmp_path, "returns", """
        def train_epoch(model, loader, loss_fn, optimizer, scheduler):
            for x, y in loader:
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
            return loss                      # the last loss, graph attached
    """)
    result = run_probe_on("memory-growth", target)
    assert result.outcome == "returns-graph" and result.data["returned_nodes"] > 0


@cuda
def test_cuda_memory_recorded(tmp_path):
    result = run_probe_on("memory-growth", load_target(str(load_example("broken_graph_retained").source), "cuda"))
    assert result.outcome == "grows" and "cuda_end_mb" in result.data


def test_scripted_diagnosis_ranks_the_fault_first():
    for name in ("broken_graph_retained", "broken_graph_retained_list"):
        _, report = diagnose_example(name, ["crash"])
        top = report.hypotheses[0]
        assert top.id == "graph-retained", (name, [h.id for h in report.hypotheses[:3]])
        assert top.confidence >= 0.8


def test_holder_inside_a_user_object_and_unnamed_closure(tmp_path):
    tracker = module_target(tmp_path, "tracker", """
        class Meter:
            def __init__(self):
                self.losses = []
        meter = Meter()
        def train_step(model, batch, loss_fn, optimizer):
            x, y = batch
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            meter.losses.append(loss)               # the tensor, not loss.item()
            return loss.item()
    """)
    result = run_probe_on("memory-growth", tracker)
    assert result.outcome == "grows" and result.data["holder"] == "meter"
    hidden = module_target(tmp_path, "closure", """
        def _recorder():
            kept = []
            return kept.append
        remember = _recorder()                       # a bound method over a list in a closure
        def train_step(model, batch, loss_fn, optimizer):
            x, y = batch
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            remember(loss)
            return loss.item()
    """)
    result = run_probe_on("memory-growth", hidden)
    assert result.outcome == "grows", result.summary
    assert result.data["steps_with_live_graph"] == result.data["steps"]
