"""The Python API's assertions through pytest itself (pytester): they pass on a healthy script and fail, reading like
pytest's own failures, with the finding, its evidence and its fix on a broken one; the plugin adds nothing unasked."""

import textwrap

import pytest

pytest_plugins = ["pytester"]

SCRIPT = textwrap.dedent("""\
    import torch
    from torch import nn

    torch.manual_seed(0)
    X = torch.randn(256, 8)
    y = (X[:, :2].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(30):
        for i in range(0, 256, 32):
            xb, yb = X[i:i + 32], y[i:i + 32]
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            {step}
    print("final loss", loss.item())
""")
HEALTHY = SCRIPT.format(step="opt.step()")
NO_ZERO_GRAD = HEALTHY.replace("        opt.zero_grad()\n", "")
NO_STEP = SCRIPT.format(step="pass")


@pytest.fixture
def project(pytester):
    pytester.makefile(".py", healthy=HEALTHY, no_zero_grad=NO_ZERO_GRAD, no_step=NO_STEP)
    return pytester


def test_no_training_bugs_passes_healthy_and_fails_broken(project):
    project.makepyfile(test_training=textwrap.dedent("""\
        from nnwizard.testing import assert_no_training_bugs

        def test_healthy():
            report = assert_no_training_bugs("healthy.py", budget=6)
            assert report.verdict == "healthy"

        def test_broken(nnwizard):
            nnwizard.assert_no_training_bugs("no_zero_grad.py", budget=6)
    """))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "test_broken" in out and "TrainingBugsFound" in out
    result.stdout.fnmatch_lines(["*missing-zero-grad (confidence 0.*): *",
                                 "*measured: *", "*fix: *zero_grad*", "*report: *nnwizard-1.json*"])
    # the failure points at the user's test line, not into nnwizard (the helpers hide their own frames)
    assert "nnwizard/testing.py" not in out and "wizard/testing.py" not in out


@pytest.mark.slow
def test_overfits_one_batch_passes_healthy_and_fails_without_step(project):
    project.makepyfile(test_overfit=textwrap.dedent("""\
        from nnwizard.testing import assert_overfits_one_batch

        def test_healthy():
            result = assert_overfits_one_batch("healthy.py")
            assert result.data["final_loss"] < result.data["first_loss"]

        def test_no_step(nnwizard):
            nnwizard.assert_overfits_one_batch("no_step.py")
    """))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*DoesNotOverfit: nnwizard: no_step.py *"])


def test_plugin_adds_nothing_unasked(pytester):
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=", "--fixtures")
    out = result.stdout.str()
    assert "nnwizard" in out and "torch" not in out.split("nnwizard", 1)[0][-200:]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=", "--help")
    assert "nnwizard" not in result.stdout.str()   # no option, no ini key
    # the plugin's import imports no torch
    pytester.makepyfile(test_light=textwrap.dedent("""\
        import sys

        def test_light():
            assert "torch" not in sys.modules
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "addopts=", "test_light.py")
    result.assert_outcomes(passed=1)
