"""Command-line conventions: -h/-V, completion, settings from [tool.nnwizard] and NNWIZARD_* (flags > env > file >
defaults), usage errors before torch is imported, script arguments bare or after `--`, CI exit codes (CONTRACT
§5a), no hard wrap off a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from nnwizard.cli import main
from nnwizard.errors import ExitCode
from nnwizard.options import Options, exit_code, failure_reasons


def cli(capsys, *argv):
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return info.value.code, out, err


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["diagnose", "-h"], ["watch", "-h"], ["trees", "-h"]])
def test_help_short_and_long(capsys, argv):
    code, out, _ = cli(capsys, *argv)
    assert code == 0 and "Usage" in out and "-h, --help" in out


def test_version_short(capsys):
    code, out, _ = cli(capsys, "-V")
    assert code == 0 and out.startswith("nnwizard ")


def test_completion_script(capsys, monkeypatch):
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")   # name the shell: no detection from the process tree
    code, out, err = cli(capsys, "--show-completion", "bash")
    assert code == 0 and "_nnwizard_completion" in out, (code, out, err)


def _light(argv, cwd=None, env=None):
    """Run the real command in a fresh interpreter and report whether torch was imported before it exited."""
    code = ("import sys, atexit\n"
            "atexit.register(lambda: print('TORCH' if 'torch' in sys.modules else 'LIGHT', file=sys.stderr))\n"
            "from nnwizard.cli import main\n"
            f"main({argv!r})\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=120)


@pytest.mark.parametrize("argv, message", [
    (["diagnose", "--script", "missing.py"], "missing.py: no such file"),
    (["diagnose", "--script", "ok.py", "--symptom", "bogus"], "--symptom 'bogus'"),
    (["diagnose", "--script", "ok.py", "--max-step", "3"], "did you mean --max-steps?"),
    (["diagnose", "--script", "ok.py", "--device", "tpu"], "--device 'tpu'"),
    (["diagnose", "--bogus"], "No such option: --bogus"),
    (["watch", "--script", "missing.py"], "missing.py: no such file"),
    (["diagnose", "--script", "empty.ipynb"], "empty.ipynb: the notebook file is empty"),
    (["diagnose", "--script", "bad.ipynb"], "bad.ipynb: not a notebook: invalid JSON"),
])
def test_usage_errors_answered_before_torch(tmp_path, argv, message):
    (tmp_path / "ok.py").write_text("print('hi')\n")
    (tmp_path / "empty.ipynb").write_text("")
    (tmp_path / "bad.ipynb").write_text("{\"cells\": [")
    done = _light(argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [l for l in done.stderr.splitlines() if l not in ("LIGHT", "TORCH")]
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "LIGHT" in done.stderr


def _pyproject(folder, text):
    (folder / "pyproject.toml").write_text(textwrap.dedent(text))


def test_unknown_config_key_is_named(tmp_path):
    _pyproject(tmp_path, """\
        [tool.nnwizard]
        fail-on = "high"
        fail-onn = 1
    """)
    done = _light(["diagnose", "--script", "x.py"], cwd=tmp_path)
    assert done.returncode == 2 and "unknown key 'fail-onn' in [tool.nnwizard]" in done.stderr
    _pyproject(tmp_path, """\
        [tool.nnwizard.watch]
        evry = 3
    """)
    done = _light(["watch", "--script", "x.py"], cwd=tmp_path)
    assert done.returncode == 2 and "'evry' in [tool.nnwizard.watch] (did you mean 'every'?)" in done.stderr


def test_settings_precedence(tmp_path, monkeypatch):
    """flags > NNWIZARD_* > [tool.nnwizard] > defaults, seen in the options the diagnose command builds."""
    import nnwizard.options as options_mod

    seen = []

    def stop(opts, load=True):
        seen.append(opts)
        raise SystemExit(0)

    monkeypatch.setattr(options_mod, "check", stop)
    monkeypatch.chdir(tmp_path)
    _pyproject(tmp_path, """\
        [tool.nnwizard]
        fail-on = "high"
        seed = 7
        device = "cpu"
        max_steps = 11
        symptom = ["nan"]
    """)

    def options(*argv, env=None):
        for key in [k for k in os.environ if k.startswith("NNWIZARD_")]:
            monkeypatch.delenv(key)
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        with pytest.raises(SystemExit):
            main(["diagnose", "--script", "x.py", *argv])
        return seen[-1]

    o = options()
    assert (o.fail_on, o.seed, o.device, o.max_steps, o.symptoms) == (0.8, 7, "cpu", 11, ["nan"])
    o = options(env={"NNWIZARD_SEED": "3", "NNWIZARD_FAIL_ON": "low", "NNWIZARD_SYMPTOM": "flat crash"})
    assert (o.fail_on, o.seed, o.device, o.symptoms) == (0.3, 3, "cpu", ["flat", "crash"])
    o = options("--seed", "1", "--fail-on", "0.6", env={"NNWIZARD_SEED": "3", "NNWIZARD_STRICT": "1"})
    assert (o.fail_on, o.seed, o.strict) == (0.6, 1, True)
    (tmp_path / "pyproject.toml").unlink()
    o = options()
    assert (o.fail_on, o.seed, o.device, o.max_steps, o.symptoms, o.strict) == (None, 0, "auto", None, [], False)


def test_script_arguments_bare_or_after_dashes(tmp_path, monkeypatch):
    import nnwizard.options as options_mod

    seen = []
    monkeypatch.setattr(options_mod, "check", lambda opts, load=True: (seen.append(opts), exec("raise SystemExit(0)")))
    for argv in (["--script", "t.py", "--", "--epochs", "1", "-s", "x"], ["--script", "t.py", "--epochs", "1"],
                 ["--epochs", "1", "--script", "t.py"]):
        with pytest.raises(SystemExit):
            main(["diagnose", *argv])
    assert [o.script_args for o in seen] == [["--epochs", "1", "-s", "x"], ["--epochs", "1"], ["--epochs", "1"]]
    assert [o.symptoms for o in seen] == [[], [], []]


# ------------------------------------------------------------------------------------ §5a exit codes
def _report(verdict="healthy", confidences=(), raised=False, interrupted=False):
    hyps = [SimpleNamespace(id=f"h{i}", confidence=c) for i, c in enumerate(confidences)]
    script = {"exit": "raised", "error": {"type": "ValueError", "message": "boom", "where": "t.py:3"}} if raised else {"exit": "finished"}
    return SimpleNamespace(verdict=verdict, hypotheses=hyps, script=script, probes=[], interrupted=interrupted,
                           not_run=[SimpleNamespace(probe="p", reason="errored")] if verdict == "inconclusive" else [])


@pytest.mark.parametrize("report, opts, code", [
    (_report("problems-found", [0.9]), Options(), 0),                       # §5: without the flags, 0
    (_report("inconclusive", raised=True), Options(), 0),
    (_report("problems-found", [0.9]), Options(fail_on=0.8), 1),
    (_report("problems-found", [0.6]), Options(fail_on=0.8), 0),
    (_report("inconclusive", raised=True), Options(fail_on=0.8), 1),         # §5a: a raised program fails
    (_report("problems-found", [0.6], raised=True), Options(fail_on=0.8), 1),
    (_report("inconclusive"), Options(fail_on=0.8), 0),
    (_report("inconclusive"), Options(strict=True), 1),                      # §5a: --strict fails inconclusive
    (_report("problems-found", [0.55]), Options(strict=True), 1),            # --strict implies --fail-on 0.5
    (_report("problems-found", [0.55]), Options(strict=True, fail_on=0.8), 0),
    (_report("healthy"), Options(strict=True), 0),
    (_report("healthy", interrupted=True), Options(strict=True), 130),
])
def test_exit_codes_in_ci(report, opts, code):
    assert int(exit_code(report, opts)) == code
    if code == 1:
        assert failure_reasons(report, opts)


def test_fail_on_a_raising_script_end_to_end(capsys, tmp_path):
    script = tmp_path / "raises.py"
    script.write_text("import torch\nfrom torch import nn\nmodel = nn.Linear(3, 1)\n"
                      "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                      "for step in range(50):\n"
                      "    loss = model(torch.randn(8, 3)).pow(2).mean()\n"
                      "    opt.zero_grad(); loss.backward(); opt.step()\n"
                      "    if step == 5:\n        raise RuntimeError('the data server went away')\n")
    js = tmp_path / "r.json"
    code, _, err = cli(capsys, "diagnose", "--script", str(script), "--non-interactive", "--json", str(js), "-q")
    report = json.loads(js.read_text())
    assert code == 0 and report["verdict"] != "healthy"
    code, _, err = cli(capsys, "diagnose", "--script", str(script), "--non-interactive", "--fail-on", "high", "-q")
    assert code == int(ExitCode.FINDINGS) and "the program raised: RuntimeError at raises.py:9" in err


def test_console_does_not_hard_wrap_off_a_terminal():
    from nnwizard.console import WIDE, make_console

    import io

    stream = io.StringIO()
    console = make_console(file=stream)
    assert console.width == WIDE
    long_path = "/a/very/long/folder/" * 8 + "train_with_a_long_name.py:27"
    console.print(long_path)
    assert long_path in stream.getvalue()
