"""batch-independence: fires on models that mix samples across the batch (sequence layers without
batch_first, softmax over dim 0, a normalisation over dim 0), names the module / op / dim, and stays
quiet on per-sample models, including BatchNorm (checked in eval mode) and batch_first layers."""

from __future__ import annotations

import textwrap

import pytest

from nnwizard.target import load_target
from tests.conftest import diagnose_example, load_example, run_probe_on

HEADER = """
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from examples.datasets import blobs, split
from examples._realdata import loaders, sequences
loss_fn = nn.CrossEntropyLoss()
"""


def module_target(tmp_path, name: str, body: str):
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return load_target(str(path), "cpu")


@pytest.mark.parametrize("name", ["healthy_mlp", "healthy_cnn", "healthy_transformer", "healthy_modulelist", "healthy_wine"])
def test_quiet_on_per_sample_models(name):
    result = run_probe_on("batch-independence", load_example(name))
    assert result.outcome == "ok", result.summary
    assert result.data["mixing_ratio"] == 0.0


def test_lstm_without_batch_first_names_layer_and_dims():
    result = run_probe_on("batch-independence", load_example("broken_axes_swapped"))
    assert result.outcome == "sequence-axis"
    assert result.data["module"] == "rnn" and result.data["module_type"] == "LSTM"
    assert result.data["seq_batch_first"] is False and result.data["op"] == "lstm"
    assert result.data["dim"] == 0 and result.data["depends_on"]
    assert "broken_axes_swapped.py" in result.data["op_where"]
    assert "(time=8, batch=12, features=4)" in result.summary


def test_log_softmax_over_batch_names_op_and_line():
    result = run_probe_on("batch-independence", load_example("broken_softmax_wrong_dim"))
    assert result.outcome == "batch-softmax"
    assert result.data["op"] == "log_softmax" and result.data["op_dim"] == 0
    assert result.data["op_where"].startswith("broken_softmax_wrong_dim.py:")
    assert result.data["sums_to_one"] == "log-probabilities" and result.data["batch_sum_error"] < 1e-4


def test_transformer_without_batch_first_and_method_softmax(tmp_path):
    seq = module_target(tmp_path, "seqfirst", """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Linear(4, 16)
                layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)   # batch_first=False
                self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
                self.head = nn.Linear(16, 4)
            def forward(self, x):
                return self.head(self.encoder(self.embed(x)).mean(1))
        def build_model(): return Net()
        def build_data(): return loaders(*sequences(n=256), standardise=False)
    """)
    result = run_probe_on("batch-independence", seq)
    assert result.outcome == "sequence-axis", result.summary
    assert result.data["module"].startswith("encoder.layers.0")
    assert result.data["seq_batch_first"] is False

    soft = module_target(tmp_path, "methodsoftmax", """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 4)
            def forward(self, x):
                return self.fc(x).softmax(0)
        def build_model(): return Net()
        def build_data(): return split(*blobs())
        loss_fn = nn.NLLLoss()
    """)
    result = run_probe_on("batch-independence", soft)
    assert result.outcome == "batch-softmax" and result.data["op"] == "softmax" and result.data["op_dim"] == 0
    assert result.data["sums_to_one"] == "probabilities"


def test_normalising_over_the_batch_mixes_but_batchnorm_does_not(tmp_path):
    norm = module_target(tmp_path, "batchnorm_by_hand", """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 32)
                self.out = nn.Linear(32, 4)
            def forward(self, x):
                h = self.fc(x)
                h = (h - h.mean(0)) / (h.std(0) + 1e-5)   # hand-rolled 'normalisation' over the batch
                return self.out(h.relu())
        def build_model(): return Net()
        def build_data(): return split(*blobs())
    """)
    result = run_probe_on("batch-independence", norm)
    assert result.outcome == "mixes" and result.data["op"] == "mean", result.summary
    assert result.data["module"] == "(model)"

    bn = module_target(tmp_path, "with_bn", """
        def build_model():
            return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
        def build_data(): return split(*blobs())
    """)
    assert run_probe_on("batch-independence", bn).outcome == "ok"


def test_token_inputs_measured_at_the_embedding(tmp_path):
    tokens = """
        g = torch.Generator().manual_seed(0)
        X = torch.randint(0, 50, (320, 10), generator=g)
        Y = (X[:, 0] % 4)
        def build_data():
            return DataLoader(TensorDataset(X[:256], Y[:256]), batch_size=32), DataLoader(TensorDataset(X[256:], Y[256:]), batch_size=32)
        class Net(nn.Module):
            def __init__(self, batch_first):
                super().__init__()
                self.emb = nn.Embedding(50, 8)
                self.gru = nn.GRU(8, 16, batch_first=batch_first)
                self.head = nn.Linear(16, 4)
            def forward(self, x):
                return self.head(self.gru(self.emb(x))[0][:, -1])
    """
    tokens = textwrap.dedent(tokens)
    good = module_target(tmp_path, "tok_good", tokens + "\ndef build_model(): return Net(True)\n")
    bad = module_target(tmp_path, "tok_bad", tokens + "\ndef build_model(): return Net(False)\n")
    assert run_probe_on("batch-independence", good).outcome == "ok"
    result = run_probe_on("batch-independence", bad)
    assert result.outcome == "sequence-axis" and result.data["module"] == "gru"


@pytest.mark.parametrize("name, hypothesis", [
    ("broken_axes_swapped", "axes-swapped"),
    ("broken_softmax_wrong_dim", "softmax-wrong-dim"),
])
def test_scripted_diagnosis_ranks_the_fault_first(name, hypothesis):
    module = __import__(f"examples.{name}", fromlist=["EXPECTED"])
    _, report = diagnose_example(name, module.EXPECTED["symptoms"])
    assert report.hypotheses[0].id == hypothesis, [h.id for h in report.hypotheses[:3]]
    top = report.hypotheses[0]
    assert top.confidence >= 0.8
    assert any("batch-independence" in e for e in top.evidence)
