"""label-audit, input-stats and sample-dump: each fires on the fault and stays quiet on healthy data."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import diagnose_example, load_example, run_probe_on


def module(tmp_path, name: str, body: str):
    """A throwaway training module written to disk and loaded as a Target."""
    from nnwizard.target import load_target

    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return load_target(str(path), "cpu")


BINARY_INT = """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    x = torch.randn(200, 5)
    y = (x[:, 0] > 0).long().unsqueeze(1)          # int labels for BCEWithLogitsLoss
    def build_model(): return nn.Linear(5, 1)
    def build_data(): return TensorDataset(x[:150], y[:150]), TensorDataset(x[150:], y[150:])
    loss_fn = nn.BCEWithLogitsLoss()
"""

ONE_HOT = """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    g = torch.Generator().manual_seed(0)
    cat = torch.randint(0, 4, (400,), generator=g)
    x = torch.cat([nn.functional.one_hot(cat, 4).float(), torch.randint(0, 2, (400, 3), generator=g).float()], 1)
    y = (cat % 2)
    def build_model(): return nn.Sequential(nn.Linear(7, 8), nn.ReLU(), nn.Linear(8, 2))
    def build_data(): return TensorDataset(x[:300], y[:300]), TensorDataset(x[300:], y[300:])
    loss_fn = nn.CrossEntropyLoss()
"""

PIXELS_255 = """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    x = torch.randint(0, 256, (200, 1, 8, 8)).float()
    y = torch.randint(0, 3, (200,))
    def build_model(): return nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    def build_data(): return TensorDataset(x[:150], y[:150]), TensorDataset(x[150:], y[150:])
    loss_fn = nn.CrossEntropyLoss()
"""


# ----------------------------------------------------------------------------------- label-audit
def test_label_audit_float_class_ids():
    r = run_probe_on("label-audit", load_example("broken_label_dtype"))
    assert (r.status, r.outcome) == ("failed", "wrong-dtype")
    assert r.data["integral"] is True and r.data["dtype"] == "float32"


@pytest.mark.parametrize("name,classes", [("broken_labels_out_of_range", 4), ("broken_labels_out_of_range_digits", 10)])
def test_label_audit_one_based_labels(name, classes):
    r = run_probe_on("label-audit", load_example(name))
    assert (r.status, r.outcome) == ("failed", "out-of-range")
    assert r.data["one_based"] is True and r.data["max"] == classes and r.data["out_of_range"] > 0
    assert "device-side assert" in r.summary          # explains what CUDA would show


def test_label_audit_binary_int_targets(tmp_path):
    r = run_probe_on("label-audit", module(tmp_path, "bin_int", BINARY_INT))
    assert (r.status, r.outcome) == ("failed", "wrong-dtype")


@pytest.mark.parametrize("name", ["healthy_mlp", "healthy_digits", "healthy_breast_cancer", "healthy_diabetes"])
def test_label_audit_quiet_on_healthy(name):
    r = run_probe_on("label-audit", load_example(name))
    assert r.status == "passed", r.summary


def test_label_audit_class_balance():
    r = run_probe_on("label-audit", load_example("healthy_mlp"))
    assert len(r.data["class_counts"]) == 4 and sum(r.data["class_counts"]) == r.data["n"]
    assert r.data["imbalance"] < 2


# ----------------------------------------------------------------------------------- input-stats
def test_input_stats_flags_raw_units():
    r = run_probe_on("input-stats", load_example("broken_inputs_not_normalized"))
    assert (r.status, r.outcome) == ("failed", "unnormalized")
    assert r.data["max_rms"] > 100


def test_input_stats_flags_raw_pixels(tmp_path):
    r = run_probe_on("input-stats", module(tmp_path, "pix255", PIXELS_255))
    assert r.outcome == "unnormalized" and r.data["kind"] == "channel"


@pytest.mark.parametrize("name", ["healthy_mlp", "healthy_cnn", "healthy_digits", "healthy_wine", "healthy_transformer"])
def test_input_stats_quiet_on_healthy(name):
    r = run_probe_on("input-stats", load_example(name))
    assert r.status == "passed", r.summary


def test_input_stats_quiet_on_one_hot_and_binary(tmp_path):
    r = run_probe_on("input-stats", module(tmp_path, "onehot", ONE_HOT))
    assert r.status == "passed", r.summary


def test_collect_says_when_it_sampled():
    from nnwizard.probes.data import collect

    target = load_example("healthy_mlp")
    part = collect(target, "train", max_samples=100)
    whole = collect(target, "train", max_samples=10_000)
    assert part.sampled and part.n == 100 and "random sample of 100 of 512" in part.describe()
    assert not whole.sampled and whole.n == 512
    r = run_probe_on("input-stats", target, max_samples=64)
    assert r.data["sampled"] is True and "random sample" in r.summary


# ----------------------------------------------------------------------------------- sample-dump
def test_sample_dump_layouts():
    from nnwizard.probes.api import ImageGrid, Table

    img = run_probe_on("sample-dump", load_example("healthy_cnn"))
    assert img.data["layout"] == "image" and isinstance(img.artifacts[0], ImageGrid)
    grid = img.artifacts[0]
    assert len(grid.images) == 5 and len(grid.images[0]) == 12 and all("label" in c for c in grid.captions)
    tab = run_probe_on("sample-dump", load_example("healthy_mlp"))
    assert tab.data["layout"] == "tabular" and isinstance(tab.artifacts[0], Table) and len(tab.artifacts[0].rows) == 5
    seq = run_probe_on("sample-dump", load_example("healthy_transformer"))
    assert seq.data["layout"] == "sequence" and seq.artifacts[0].columns == ["index", "label", "shape", "head"]


def test_image_report_shows_sample_grid(tmp_path):
    from nnwizard.markdown import render_markdown

    diagnosis, report = diagnose_example("healthy_cnn")
    out = render_markdown(report, tmp_path / "report.md")
    text = out.read_text()
    assert "sample-dump-samples.png" in text
    assert (tmp_path / "report_files" / "sample-dump-samples.png").stat().st_size > 1000


# ----------------------------------------------------------------------------------- diagnoses
@pytest.mark.parametrize("name,hypothesis", [
    ("broken_label_dtype", "labels-wrong-dtype"),
    ("broken_labels_out_of_range", "labels-out-of-range"),
    ("broken_labels_out_of_range_digits", "labels-out-of-range"),
    ("broken_inputs_not_normalized", "inputs-not-normalized"),
])
def test_diagnosis_top1(name, hypothesis):
    import importlib

    symptoms = importlib.import_module(f"examples.{name}").EXPECTED["symptoms"]
    _, report = diagnose_example(name, symptoms)
    assert report.hypotheses and report.hypotheses[0].id == hypothesis and report.hypotheses[0].confidence >= 0.5
    if hypothesis == "labels-out-of-range":
        assert any("label-audit" in e for e in report.hypotheses[0].evidence)


@pytest.mark.parametrize("indexable", [True, False])
def test_samples_of_different_shapes_are_ragged_not_an_error(indexable):
    """Sentences of different lengths do not stack into one tensor of samples: collect() says so
    (RaggedSamples) and the probes that read samples that way skip with the shapes, instead of raising
    torch.stack's error (an errored probe leaves the verdict inconclusive)."""
    from types import SimpleNamespace

    import torch
    from torch.utils.data import DataLoader

    from nnwizard.probes.data import RaggedSamples, collect, ragged

    items = [(torch.arange(5), 1), (torch.arange(4), 0), (torch.arange(5), 2)]
    loader = DataLoader(items, batch_size=None) if indexable else [(x.unsqueeze(0), torch.tensor([y])) for x, y in items]
    with pytest.raises(RaggedSamples) as info:
        collect(SimpleNamespace(train_loader=loader, val_loader=None))
    result = ragged(info.value)
    assert result.status == "skipped" and ("[4] and [5]" in result.summary or "[1, 4] and [1, 5]" in result.summary)
    same = [(torch.arange(5), 1), (torch.arange(5) + 1, 0)]
    assert collect(SimpleNamespace(train_loader=DataLoader(same, batch_size=None), val_loader=None)).x.shape == (2, 5)


@pytest.mark.parametrize("probe_id", ["input-stats", "label-audit"])
def test_probes_that_read_samples_skip_ragged_ones_naming_the_shapes(probe_id):
    from types import SimpleNamespace

    import torch
    from torch.utils.data import DataLoader

    from nnwizard.probes.api import ProbeContext, get

    items = [(torch.arange(5).float(), 1), (torch.arange(4).float(), 0), (torch.arange(5).float(), 2)]
    target = SimpleNamespace(train_loader=DataLoader(items, batch_size=None), val_loader=None)
    result = get(probe_id)(ProbeContext(target))
    assert result.status == "skipped" and "[4] and [5]" in result.summary, result.summary
