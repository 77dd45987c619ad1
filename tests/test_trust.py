"""Trust on real programs: what reaches the loss, the metrics evaluate reports, degenerate targets,
informational checks, categorical leakage, user functions handed real DataLoaders, and sentences
that agree with their numbers. Each check fires on its fault and stays quiet on a healthy case."""

from __future__ import annotations

import textwrap

import pytest

from nnwizard.target import load_target
from tests.conftest import load_example, run_probe_on


def module(tmp_path, name: str, body: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return load_target(str(path), "cpu")


# -------------------------------------------------------------------------- what reaches the loss
@pytest.mark.parametrize("name, outcome, words", [
    ("broken_softmax_in_step", "double-softmax", "after the model, in the loop"),
    ("broken_sigmoid_before_logits_loss", "double-sigmoid", "sigmoid()"),
    ("broken_softmax_size1", "softmax-size1", "size 1"),
    ("broken_logprobs_bce", "logits-to-bce", "log-probabilities"),
])
def test_loss_input_audit_reads_what_reaches_the_loss(name, outcome, words):
    r = run_probe_on("loss-output-audit", load_example(name))
    assert (r.status, r.outcome) == ("failed", outcome), r.summary
    assert words in r.summary


def test_loss_input_audit_quiet_on_functional_and_module_losses():
    for name in ("healthy_eval_percent", "healthy_mlp", "healthy_binary_onecycle"):
        r = run_probe_on("loss-output-audit", load_example(name))
        assert r.status == "passed", (name, r.summary)


# ------------------------------------------------------------------------------------ metrics
@pytest.mark.parametrize("name, outcome, words", [
    ("broken_metric_over_batches", "above-one", "/ 8 (batches)"),
    ("broken_metric_not_reset", "not-reset", "never reset"),
    ("broken_metric_argmax_single", "argmax-single", "size 1"),
])
def test_metric_audit_fires_with_the_arithmetic(name, outcome, words):
    r = run_probe_on("metric-audit", load_example(name))
    assert (r.status, r.outcome) == ("failed", outcome), r.summary
    assert words in r.summary


def test_metric_audit_reads_percent_and_stays_quiet():
    r = run_probe_on("metric-audit", load_example("healthy_eval_percent"))
    assert r.outcome == "percent" and r.data["percent"] and "read as" in r.summary
    for name in ("healthy_cnn", "healthy_regression", "healthy_wine"):
        r = run_probe_on("metric-audit", load_example(name))
        assert (r.status, r.outcome) == ("passed", "ok"), (name, r.summary)
    assert run_probe_on("metric-audit", load_example("healthy_mlp")).status == "skipped"  # no evaluate: does not apply


# --------------------------------------------------------------------------------- degenerate
def test_degenerate_targets_are_a_finding_and_label_audits_stay_quiet():
    target = load_example("broken_degenerate_targets")
    r = run_probe_on("label-audit", target)
    assert r.outcome == "degenerate" and "1.000" in r.summary
    for probe_id in ("label-leak-audit", "label-signal-audit"):
        quiet = run_probe_on(probe_id, target)
        assert (quiet.status, quiet.outcome) == ("skipped", "no-targets"), quiet.summary
    assert run_probe_on("label-audit", load_example("healthy_mlp")).outcome == "ok"


# ------------------------------------------------------------------------- informational checks
SHUFFLED = """
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from examples.datasets import blobs

    def build_model():
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def build_data():
        x, y = blobs()
        return (DataLoader(TensorDataset(x[:-256], y[:-256]), batch_size=32, shuffle=True),
                DataLoader(TensorDataset(x[-256:], y[-256:]), batch_size=32, shuffle=True))

    loss_fn = nn.CrossEntropyLoss()
"""


def test_val_shuffled_is_informational_without_an_effect(tmp_path):
    target = module(tmp_path, "shuffled_only", SHUFFLED)
    r = run_probe_on("pipeline-audit", target)
    assert r.data["val_shuffled"] and r.data["val_shuffle_effect"] == 0.0 and "unaffected" in r.summary
    effect = run_probe_on("pipeline-audit", load_example("broken_val_shuffled"))
    assert effect.data["val_shuffle_effect"] > 0 and "depends on the order" in effect.summary


@pytest.mark.slow
def test_val_shuffled_without_effect_is_no_finding(tmp_path):
    (tmp_path / "shuffled_diag.py").write_text(textwrap.dedent(SHUFFLED))
    from nnwizard.report import build
    from nnwizard.session import Options, diagnose

    report = build(diagnose(Options(module=str(tmp_path / "shuffled_diag.py"), symptoms=["val-suspicious"], device="cpu")))
    shuffled = next(h for h in report.hypotheses if h.id == "val-shuffled")
    assert shuffled.confidence < 0.5 and report.verdict == "healthy"


# ------------------------------------------------------------------------ categorical leakage
TOKENS = """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    X = torch.randint(0, 12, (600, 24), generator=g)
    Y = torch.randint(0, 12, (600,), generator=g)
    COPIES = {copies}

    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(12, 16)
            self.out = nn.Linear(16, 12)
        def forward(self, x):
            return self.out(self.emb(x).mean(1))

    def build_model():
        return Bag()

    def build_data():
        val_x = X[500:].clone()
        val_x[:COPIES] = X[:COPIES]          # validation rows copied from training
        return TensorDataset(X[:500], Y[:500]), TensorDataset(val_x, Y[500:])

    loss_fn = nn.CrossEntropyLoss()
"""


def test_leakage_on_token_ids_counts_exact_copies_only(tmp_path):
    quiet = run_probe_on("leakage-audit", module(tmp_path, "tokens_clean", TOKENS.format(copies=0)))
    assert quiet.outcome == "ok" and quiet.data["categorical"] and quiet.data["near"] == 0, quiet.summary
    assert "near duplicates" not in quiet.summary
    leak = run_probe_on("leakage-audit", module(tmp_path, "tokens_leak", TOKENS.format(copies=30)))
    assert leak.outcome == "leak" and leak.data["exact"] >= 30, leak.summary


# ------------------------------------------------------------- user functions get real loaders
EPOCH = """
    import torch
    from torch import nn
    from examples.datasets import blobs, split

    SEEN = []

    def build_model():
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def build_data():
        return split(*blobs())

    loss_fn = nn.CrossEntropyLoss()

    def train_epoch(model, loader, loss_fn, optimizer, scheduler):
        model.train()
        total = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
        SEEN.append(len(loader.dataset))
        return total / len(loader.dataset)
"""


def test_ladder_hands_train_epoch_a_dataloader(tmp_path):
    r = run_probe_on("simplify-ladder", module(tmp_path, "epoch_reads_dataset", EPOCH))
    assert "raised" not in r.data.get("rungs", {}).values(), r.summary


# ----------------------------------------------------------------- sentences agree with numbers
def test_loss_scale_neither_mean_nor_sum_says_so(tmp_path):
    t = module(tmp_path, "squared_sum", """
        import torch.nn.functional as F
        from torch import nn
        from examples.datasets import blobs, split
        def build_model():
            return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        def build_data():
            return split(*blobs())
        loss_fn = lambda out, y: 1e-4 * F.cross_entropy(out, y, reduction="sum") ** 2
    """)
    r = run_probe_on("loss-scale-audit", t)
    assert abs(r.data["duplication_ratio"] - 4.0) < 0.05 and "neither" in r.summary and "is a mean" not in r.summary


def test_flat_curve_sentence_quotes_where_it_stays():
    from nnwizard.curves import Curves, classify

    shape = classify(Curves(train=[49.17] * 60), 0.6931)
    assert shape.shape == "flat" and "start 49.17" in shape.evidence and "within 0.0% of 0.6931" not in shape.evidence
