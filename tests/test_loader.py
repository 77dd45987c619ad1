"""The target loader: dotted paths, file paths, :attr, and clear errors for bad modules."""

from __future__ import annotations

import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from nnwizard.errors import ExitCode, TargetError, UsageError
from nnwizard.loader import split_spec
from nnwizard.target import load_target, resolve_device
from tests.conftest import EXAMPLES

GOOD = """
import torch
from torch import nn
from torch.utils.data import TensorDataset

def build_model():
    return nn.Linear(4, 3)

def build_data():
    x = torch.randn(64, 4)
    y = torch.randint(0, 3, (64,))
    return TensorDataset(x[:48], y[:48]), TensorDataset(x[48:], y[48:])

loss_fn = nn.CrossEntropyLoss()
"""


@pytest.fixture
def make_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    created = []

    def make(name: str, source: str):
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        created.append(name)
        return path

    yield make
    for name in created:
        sys.modules.pop(name, None)


def test_split_spec():
    assert split_spec("pkg.mod:make") == ("pkg.mod", "make")
    assert split_spec("pkg.mod") == ("pkg.mod", None)
    assert split_spec("C:\\x\\train.py") == ("C:\\x\\train.py", None)


def test_dotted_path_from_cwd_wraps_datasets(make_module):
    make_module("good_mod", GOOD)
    target = load_target("good_mod", "cpu")
    assert target.task == "classification" and target.num_classes == 3
    assert target.train_loader.batch_size == 32 and target.val_loader is not None
    x, y = target.batch()
    assert x.shape == (32, 4) and y.dtype == torch.long
    assert target.fresh_model() is not target.fresh_model()


def test_file_path_and_attr(make_module):
    path = make_module("holder_mod", GOOD + "\nimport types\ndef make():\n    return types.SimpleNamespace(build_model=build_model, build_data=build_data, loss_fn=loss_fn)\n")
    target = load_target(f"{path}:make", "cpu")
    assert target.task == "classification"


def test_missing_module_is_told_apart(make_module):
    with pytest.raises(TargetError, match="no module named 'no_such_mod'"):
        load_target("no_such_mod", "cpu")


def test_import_error_inside_user_module_names_the_line(make_module):
    make_module("broken_import", "import math\nimport not_installed_pkg_xyz\n")
    with pytest.raises(TargetError, match=r"was found but importing it failed at .*broken_import.py:2"):
        load_target("broken_import", "cpu")


def test_syntax_error_names_the_users_line_not_the_loader(make_module):
    make_module("bad_syntax_mod", "import torch\ndef make_model(:\n    pass\n")
    with pytest.raises(TargetError, match=r"raised while being imported at .*bad_syntax_mod.py:2: SyntaxError"):
        load_target("bad_syntax_mod", "cpu")


def test_exception_at_import_time(make_module):
    make_module("raises_mod", "x = 1\nraise RuntimeError('boom at import')\n")
    with pytest.raises(TargetError, match="raised while being imported.*boom at import"):
        load_target("raises_mod", "cpu")


def test_missing_names_are_listed_with_expectations(make_module):
    make_module("partial_mod", "def build_model():\n    pass\n")
    with pytest.raises(TargetError) as info:
        load_target("partial_mod", "cpu")
    message = str(info.value)
    assert "build_data" in message and "loss_fn" in message and "(train, val)" in message
    assert info.value.exit_code == ExitCode.USAGE


def test_builder_that_raises(make_module):
    make_module("bad_builder", GOOD.replace("return nn.Linear(4, 3)", "raise ValueError('no weights file')"))
    with pytest.raises(TargetError, match=r"build_model\(\) raised while being built.*no weights file"):
        load_target("bad_builder", "cpu")


def test_build_model_must_return_module(make_module):
    make_module("not_module", GOOD.replace("return nn.Linear(4, 3)", "return 42"))
    with pytest.raises(TargetError, match="not a torch.nn.Module"):
        load_target("not_module", "cpu")


def test_missing_file():
    with pytest.raises(TargetError, match="there is no file"):
        load_target("does/not/exist.py", "cpu")


def test_task_inference_and_declared_task(make_module):
    make_module("reg_mod", GOOD.replace("nn.Linear(4, 3)", "nn.Linear(4, 1)").replace(
        "torch.randint(0, 3, (64,))", "torch.randn(64, 1)").replace("nn.CrossEntropyLoss()", "nn.MSELoss()"))
    assert load_target("reg_mod", "cpu").task == "regression"
    make_module("declared_mod", GOOD + "\nTASK = 'binary'\n")
    assert load_target("declared_mod", "cpu").task == "binary"
    make_module("bad_task_mod", GOOD + "\nTASK = 'ranking'\n")
    with pytest.raises(TargetError, match="TASK"):
        load_target("bad_task_mod", "cpu")


def test_device_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(UsageError):
        resolve_device("quantum")


def test_loading_restores_global_rng(make_module):
    make_module("rng_mod", GOOD)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_target("rng_mod", "cpu")
    assert torch.equal(torch.rand(3), expected)


def test_cached_fresh_models_are_copies_of_one_build_and_leave_the_generators_as_a_build_does():
    """fresh_model's cache (on by default on CUDA only): the same weights as a build from that seed, a
    copy each call (a probe's training cannot leak into the next one), the RNG where a build leaves it."""
    plain, cached = load_target(str(EXAMPLES / "healthy_cnn.py"), "cpu"), load_target(str(EXAMPLES / "healthy_cnn.py"), "cpu")
    cached.cache_builds = True
    calls = []
    build = cached.namespace.build_model
    cached.namespace = SimpleNamespace(**{k: getattr(cached.namespace, k) for k in dir(cached.namespace) if not k.startswith("__")})
    cached.namespace.build_model = lambda: calls.append(1) or build()
    for _ in range(3):
        a = plain.fresh_model(3)
        after_plain = torch.rand(4)
        b = cached.fresh_model(3)
        after_cached = torch.rand(4)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
        assert torch.equal(after_plain, after_cached)
        with torch.no_grad():
            for p in b.parameters():
                p.add_(1.0)   # trained: the next copy must not see it
    assert len(calls) == 1
    assert not all(torch.equal(p, q) for p, q in zip(cached.fresh_model(4).parameters(), cached.fresh_model(3).parameters()))
    assert len(calls) == 2


def test_a_file_named_like_a_loaded_module_is_the_users_file(tmp_path):
    """`--module path/to/json.py` (or attr.py, once attrs is imported): the user's file, not the module that already
    holds that name in sys.modules; the loaded one stays in place."""
    import json

    path = tmp_path / "json.py"
    path.write_text(textwrap.dedent("""\
        import torch
        from torch import nn

        def build_model():
            return nn.Linear(2, 1)

        def build_data():
            x = torch.randn(16, 2)
            return torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), None

        loss_fn = nn.MSELoss()
    """))
    target = load_target(str(path), "cpu")
    assert isinstance(target.fresh_model(0), torch.nn.Linear)
    assert sys.modules["json"] is json
