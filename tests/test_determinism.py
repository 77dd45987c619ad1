"""determinism: bitwise comparison of two seeded runs, and locating the source of a mismatch."""

from __future__ import annotations

import textwrap

import pytest
import torch

from nnwizard.target import load_target
from tests.conftest import diagnose_example, load_example, run_probe_on


def _module(tmp_path, body: str):
    path = tmp_path / f"det_{tmp_path.name.replace('-', '_')}.py"  # a fresh module name per test
    path.write_text(textwrap.dedent(body))
    return load_target(str(path), "cpu")


def test_reproducible_example_is_quiet():
    result = run_probe_on("determinism", load_example("healthy_mlp"))
    assert result.outcome == "ok" and result.status == "passed"


def test_private_unseeded_generator_in_dataset():
    result = run_probe_on("determinism", load_example("broken_nondeterminism"))
    assert result.outcome == "data"
    assert "dataset.rng" in result.data["where"] and "default_rng()" in result.data["where"]
    assert result.data["batch_step"] == 0


def test_global_random_with_only_torch_seeded():
    result = run_probe_on("determinism", load_example("broken_nondeterminism_global"))
    assert result.outcome == "global-rng"
    assert "random.random()" in result.data["where"]


def test_global_numpy_is_fine_when_the_module_seeds_it(tmp_path):
    target = _module(tmp_path, """
        import numpy as np
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset
        from examples.datasets import blobs
        np.random.seed(0)

        class Jitter(TensorDataset):
            def __getitem__(self, i):
                x, y = super().__getitem__(i)
                return x + torch.from_numpy(np.random.normal(0, 0.1, x.shape).astype("float32")), y

        def build_model():
            return nn.Linear(16, 4)

        def build_data():
            x, y = blobs()
            return Jitter(x, y), None

        loss_fn = nn.CrossEntropyLoss()
    """)
    assert run_probe_on("determinism", target).outcome == "ok"


def test_diverged_runs_can_still_be_reproducible(tmp_path):
    target = _module(tmp_path, """
        import torch
        from torch import nn
        from examples.datasets import blobs, split

        def build_model():
            return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

        def build_data():
            return split(*blobs())

        def build_optimizer(model):
            return torch.optim.SGD(model.parameters(), lr=1e6)

        loss_fn = nn.CrossEntropyLoss()
    """)
    result = run_probe_on("determinism", target, steps=6)
    assert result.outcome == "ok", result.summary  # NaN == NaN here: the runs agree


def test_model_forward_drawing_from_a_private_generator(tmp_path):
    target = _module(tmp_path, """
        import random
        import torch
        from torch import nn
        from examples.datasets import blobs, split

        class Noisy(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 4)
                self.rng = random.Random()

            def forward(self, x):
                return self.fc(x) + torch.tensor([self.rng.gauss(0, 0.1) for _ in range(4)])  # per-logit noise

        def build_model():
            return Noisy()

        def build_data():
            return split(*blobs())

        loss_fn = nn.CrossEntropyLoss()
    """)
    result = run_probe_on("determinism", target)
    assert result.outcome == "model" and "random.Random" in result.data["where"]


def test_diagnosis_of_nondeterminism_examples():
    for name in ("broken_nondeterminism", "broken_nondeterminism_global"):
        _, report = diagnose_example(name, ("not-reproducible",))
        assert report.hypotheses[0].id == "nondeterminism" and report.hypotheses[0].confidence >= 0.5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_lists_nondeterministic_ops(tmp_path):
    path = tmp_path / "det_cuda_pool.py"
    path.write_text(textwrap.dedent("""
        import torch
        import torch.nn.functional as F
        from torch import nn
        from examples.datasets import images, split

        class Up(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(1, 4, 3, padding=1)
                self.pool = nn.AdaptiveAvgPool2d((5, 5))   # its CUDA backward has no deterministic kernel (atomic adds)
                self.head = nn.Linear(4 * 5 * 5, 4)

            def forward(self, x):
                return self.head(self.pool(self.conv(x)).flatten(1))

        torch.backends.cudnn.benchmark = True

        def build_model():
            return Up()

        def build_data():
            return split(*images())

        loss_fn = nn.CrossEntropyLoss()
    """))
    try:
        target = load_target(str(path), "cuda")
        result = run_probe_on("determinism", target)
    finally:
        torch.backends.cudnn.benchmark = False  # the module set it at import
    assert result.data["cudnn_benchmark"] is True
    # (bilinear interpolation's backward, the op this test used first, has had a deterministic kernel since torch 2.x)
    assert any("adaptive_avg_pool" in op for op in result.data["nondeterministic_ops"]), result.data
    assert not torch.are_deterministic_algorithms_enabled()  # the probe put the global flag back


def test_the_deterministic_pair_starts_from_a_kept_model_without_building_again(monkeypatch):
    # on a GPU the pair with deterministic kernels follows two real builds that agreed: it copies the first
    # run's initial model instead of building an 85M-parameter model twice more on the CPU
    from nnwizard.probes import determinism

    target = load_example("healthy_mlp")
    first = determinism.one_run(target, 0, 2, True, keep=True)
    assert first["start"] is not None
    builds = []
    build = target.namespace.build_model
    monkeypatch.setattr(target.namespace, "build_model", lambda: builds.append(1) or build())
    same, left = determinism._deterministic_pair(target, 0, 2, first["start"])
    assert same and left == [] and builds == []
    again = determinism.one_run(target, 0, 2, True, first["start"])
    assert again["init"] == first["init"] and again["losses"] == first["losses"]  # the same start, the same run
    assert determinism.one_run(target, 1, 2, True)["init"] != first["init"]  # another seed's build: other weights
