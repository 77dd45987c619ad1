"""Framework-aware fixes: where Lightning or transformers owns the optimizer, its rate or the loop, the fix names that
framework's knob at the user's line; the integrations log through the trainer's logger too."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from nnwizard.frameworks import detect, eval_mode_fix, rate_fix

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ROOT / "examples" / "frameworks"

HF = textwrap.dedent("""\
    import argparse
    from transformers import Trainer, TrainingArguments

    def main(lr):
        training = TrainingArguments(
            output_dir="out",
            learning_rate=lr,
        )
        trainer = Trainer(model=None, args=training)
        trainer.train()
""")


def _rec(where=None, module=None):
    opt = SimpleNamespace(where=where, groups=[{"lr": 10.0}], name="AdamW")
    model = SimpleNamespace(owner=None, module=module or SimpleNamespace())
    return SimpleNamespace(optimizers=[opt], models=[model])


def test_transformers_owns_the_optimizer(tmp_path):
    script = tmp_path / "hf.py"
    script.write_text(HF)
    fw = detect(_rec("hf.py:10 in main"), [script])
    assert fw is not None and fw.name == "transformers" and fw.rate.where == "hf.py:5" and fw.rate_expr == "lr"
    text = rate_fix(fw, 10.0, 1.0, None)
    assert "TrainingArguments(learning_rate=...)` at hf.py:5" in text and "`learning_rate=1`" in text
    # an optimizer the script built itself (and handed to the Trainer): no framework sentence
    own = HF.replace("trainer = Trainer(model=None, args=training)", "trainer = Trainer(model=None, args=training, optimizers=(o, None))")
    script.write_text(own)
    assert detect(_rec("hf.py:10 in main"), [script]) is None
    script.write_text("import torch\nopt = torch.optim.SGD([], lr=1)\n")
    assert detect(_rec("hf.py:2 in <module>"), [script]) is None


def test_lightning_names_configure_optimizers_and_what_flipped_the_mode(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    script = tmp_path / "pl.py"
    script.write_text(textwrap.dedent("""\
        import torch
        import lightning.pytorch as pl

        class M(pl.LightningModule):
            def validation_step(self, batch, i):
                self.train()
                return None

            def configure_optimizers(self):
                return torch.optim.Adam(self.parameters(), lr=self.lr)
    """))

    class M(pl.LightningModule):
        pass

    fw = detect(_rec("pl.py:10 in configure_optimizers", M()), [script])
    assert fw.name == "lightning" and fw.rate.where == "pl.py:10" and fw.rate_expr == "self.lr"
    assert "configure_optimizers" in rate_fix(fw, 10.0, 1.0, None) and "`lr=1`" in rate_fix(fw, 10.0, 1.0, None)
    text = eval_mode_fix(fw, "pl.py:7 in validation_step")
    assert "`self.train()` at pl.py:6 in `validation_step`" in text and "remove that call" in text
    assert "call `model.eval()`" not in text


def test_lightning_callback_logs_through_the_trainers_logger(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from nnwizard.integrations.lightning import WatchCallback

    class Reg(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 1)

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = pl.Trainer(max_steps=12, accelerator="cpu", logger=CSVLogger(str(tmp_path / "logs")), enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         callbacks=[WatchCallback(out=tmp_path / "w", every=5, tensorboard=False)])
    trainer.fit(Reg(), DataLoader(data, batch_size=8))
    metrics = next((tmp_path / "logs").rglob("metrics.csv")).read_text()
    assert "nnwizard/loss" in metrics and "nnwizard/grad_norm" in metrics
    assert (tmp_path / "w" / "watch.jsonl").read_text().count("\n") >= 3


@pytest.mark.slow
@pytest.mark.parametrize("script, args, hypothesis, words", [
    ("hf_trainer.py", ["--lr", "10"], "lr-too-high", ["TrainingArguments(learning_rate=...)` at hf_trainer.py:", "`learning_rate="]),
    ("lightning_module.py", ["--lr", "10"], "lr-too-high", ["configure_optimizers", "lightning_module.py:49"]),
    ("lightning_module.py", ["--train-in-validation"], "eval-mode-missing", ["`self.train()` at lightning_module.py:"]),
    ("lightning_module.py", ["--shift-labels"], "labels-misaligned", []),
])
def test_framework_examples_get_the_frameworks_fix(script, args, hypothesis, words, tmp_path, monkeypatch):
    pytest.importorskip("lightning" if script.startswith("lightning") else "transformers")
    import nnwizard

    monkeypatch.chdir(tmp_path)
    report = nnwizard.diagnose(script=FRAMEWORKS / script, args=args, json=tmp_path / "r.json")
    found = [h for h in report.findings if h.id == hypothesis]
    assert found, [(h.id, h.confidence) for h in report.hypotheses[:4]]
    for word in words:
        assert word in found[0].fix_here, found[0].fix_here
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "problems-found"
