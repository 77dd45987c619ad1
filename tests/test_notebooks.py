"""Notebooks (CONTRACT §9): ``--script nb.ipynb`` runs the code cells in order as a kernel would (IPython's input
transformation, get_ipython(), display(), the notebook's folder as working directory), locations read ``cell N, line
M``; bad notebooks are exit 2 in one line; ``%load_ext nnwizard`` works in a real kernel (nbclient)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nnwizard.errors import UsageError
from nnwizard.notebook.cells import load_notebook, python_source
from nnwizard.script_run import RunOptions, load_script, run_script

nbformat = pytest.importorskip("nbformat")
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def write(folder: Path, *cells, name="nb.ipynb") -> Path:
    nb = new_notebook(cells=[new_markdown_cell(c[3:]) if c.startswith("md:") else new_code_cell(c) for c in cells])
    path = folder / name
    nbformat.write(nb, str(path))
    return path


def test_ipython_syntax_keeps_lines():
    src = "%matplotlib inline\nimport os\n!pip install x\nfiles = !ls\n%time y = 1 + 1\nprint(y)\n"
    out = python_source(src)
    assert out.count("\n") == src.count("\n") and "get_ipython().run_line_magic('matplotlib', 'inline')" in out
    cell = "%%time\nfor i in range(3):\n    pass\n"
    out = python_source(cell)
    assert out.splitlines()[0] == "# %%time" and out.splitlines()[1:] == cell.splitlines()[1:]
    out = python_source("%%writefile notes.txt\nhello\nworld\n")
    assert out.count("\n") == 3 and "run_cell_magic('writefile'" in out


def test_cells_run_in_order_with_magics_display_and_the_notebooks_folder(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "numbers.txt").write_text("3\n4\n")
    nb = write(folder,
               "%matplotlib inline\n%load_ext autoreload\n!pip install -q something\nlisting = !ls\n%env NNW_TEST_ENV=on",
               "md:Some prose between the code.",
               "import os\nvalues = [int(v) for v in open('data/numbers.txt')]\n%time total = sum(values)\n"
               "display(total)\nhere = os.getcwd()\nenv = os.environ.get('NNW_TEST_ENV')",
               "%%capture captured\nprint('hidden')",
               "%%writefile out.txt\nwritten by a cell\n",
               "shell = get_ipython()\nprint('listing', listing, 'total', total, 'env', env, 'here', here)")
    monkeypatch.chdir(tmp_path)   # the notebook's folder is not the current one: relative paths are the kernel's
    notebook = load_notebook(nb)
    notes: list = []
    ns = notebook.run(notes=notes)
    assert ns["total"] == 7 and ns["here"] == str(folder) and ns["env"] == "on" and ns["listing"] == []
    assert "captured" in ns and (folder / "out.txt").read_text() == "written by a cell\n"
    assert Path.cwd() == tmp_path and "NNW_TEST_ENV" not in __import__("os").environ
    assert any("!pip install -q something" in n and "cell 1, line 3" in n for n in notes), notes
    assert [c.index for c in notebook.cells] == [1, 3, 4, 5, 6]   # positions among all cells


def test_a_cell_that_raises_is_located_by_cell_and_line(tmp_path):
    nb = write(tmp_path,
               "import torch\nfrom torch import nn\nmodel = nn.Linear(4, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)",
               "md:the loop",
               "for step in range(3):\n    x = torch.randn(8, 4)\n    loss = model(x).sum()\n    opt.zero_grad()\n"
               "    loss.backward()\n    opt.step()\n    if step == 1:\n        raise ValueError('a bad batch')")
    result = run_script(load_script(str(nb)), [], RunOptions(max_steps=20))
    assert result.exit == "raised"
    assert result.recording.error.where == "cell 3:8 in <module>"   # rendered "cell 3, line 8" in every report
    from nnwizard.locations import render

    assert render(result.recording.error.where) == "cell 3, line 8 in <module>"
    assert 'File "nb.ipynb", cell 3, line 8' in render(result.recording.error.traceback, "nb.ipynb")


def test_diagnosis_of_a_raising_notebook_names_the_cell(tmp_path):
    import nnwizard

    nb = write(tmp_path,
               "import torch\nfrom torch import nn\nmodel = nn.Linear(4, 2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)",
               "for step in range(3):\n    logits = model(torch.randn(8, 4))\n"
               "    loss = nn.functional.cross_entropy(logits, torch.randint(0, 2, (8, 1)))\n"
               "    opt.zero_grad()\n    loss.backward()\n    opt.step()")
    report = nnwizard.diagnose(script=nb, budget=5)
    assert report.verdict != "healthy"
    assert report.script["error"]["where"] == "cell 2, line 3 in <module>"
    text = json.dumps(report.to_dict())
    assert "cell 2, line 3" in text and "cell 2:3" not in text


@pytest.mark.parametrize("content, message", [
    ("", "the notebook file is empty"),
    ("{not json", "not a notebook: invalid JSON"),
    ('{"metadata": {}}', "the JSON has no 'cells'"),
    ('{"cells": [{"cell_type": "markdown", "source": "x", "metadata": {}}], "metadata": {}, "nbformat": 4, '
     '"nbformat_minor": 5}', "the notebook has no code to run"),
    ('{"cells": [{"cell_type": "code", "source": "def f(:\\n", "metadata": {}, "outputs": [], '
     '"execution_count": null}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}', "syntax error in cell 1, line 1"),
])
def test_bad_notebooks_are_usage_errors(tmp_path, content, message):
    path = tmp_path / "bad.ipynb"
    path.write_text(content)
    with pytest.raises(UsageError) as info:
        load_script(str(path))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_watch_bundle_of_a_notebook_keeps_its_cells_for_replay(tmp_path, monkeypatch):
    """`nnwizard watch --script nb.ipynb`: the model class lives only in a cell; replay rebuilds it."""
    from nnwizard.bundle import load_bundle
    from nnwizard.watch_cmd import run

    nb = write(tmp_path,
               "import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n"
               "        super().__init__()\n        self.fc = nn.Linear(4, 1)\n\n    def forward(self, x):\n"
               "        return self.fc(x)",
               "torch.manual_seed(0)\nX = torch.randn(64, 4)\ny = X.sum(1, keepdim=True)\nmodel = Net()\n"
               "opt = torch.optim.SGD(model.parameters(), lr=5.0)\nfor step in range(25):\n    opt.zero_grad()\n"
               "    loss = nn.functional.mse_loss(model(X), y)\n    loss.backward()\n    opt.step()")
    monkeypatch.chdir(tmp_path)
    run(str(nb), [], tmp_path / "w", "continue", 1, tensorboard=False)
    bundles = sorted((tmp_path / "w").glob("anomaly-step*"))
    assert bundles
    meta = json.loads((bundles[0] / "meta.json").read_text())
    assert [c["cell"] for c in meta["cells"]] == ["cell 1", "cell 2"]
    models = load_bundle(bundles[0]).models()
    assert type(next(iter(models.values()))).__name__ == "Net"


def test_magics_in_a_real_kernel(tmp_path):
    """nbclient runs a notebook that loads the extension, watches a cell and diagnoses the cells run so far."""
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = new_notebook(cells=[
        new_code_cell("%load_ext nnwizard"),
        new_code_cell("import torch\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n"
                      "        super().__init__()\n        self.fc = nn.Linear(4, 1)\n\n    def forward(self, x):\n"
                      "        return self.fc(x)\n\ntorch.manual_seed(0)\nX = torch.randn(64, 4)\n"
                      "y = X.sum(1, keepdim=True)\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=5.0)"),
        new_code_cell("%%nnwizard_watch --out w --every 1 --no-tensorboard\nfor step in range(25):\n    opt.zero_grad()\n"
                      "    loss = nn.functional.mse_loss(model(X), y)\n    loss.backward()\n    opt.step()"),
        new_code_cell("%nnwizard_diagnose -q --max-steps 20 --budget 5"),
        new_code_cell("print('VERDICT', nnwizard_report['verdict'], [h['id'] for h in nnwizard_report['hypotheses'] "
                      "if h['confidence'] >= 0.5])"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    texts = ["".join(o.get("text", "")) for c in nb.cells for o in c.get("outputs", [])]
    markdown = [o["data"]["text/markdown"] for c in nb.cells for o in c.get("outputs", []) if "text/markdown" in o.get("data", {})]
    joined = "\n".join(texts)
    assert "replay bundle: w/anomaly-step" in joined and "optimizer steps watched" in joined
    assert "VERDICT problems-found ['lr-too-high']" in joined, joined[-3000:]
    assert markdown and "lr-too-high" in markdown[0] and "\x1b[" not in joined
    bundle = sorted((tmp_path / "w").glob("anomaly-step*"))[0]
    meta = json.loads((bundle / "meta.json").read_text())
    assert "class Net" in "".join(c["python"] for c in meta["cells"])
    done = subprocess.run([sys.executable, "-m", "nnwizard", "replay", str(bundle), "-q"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0 and "lr-too-high" in done.stdout + done.stderr, done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("twin", sorted((ROOT / "examples" / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_twins_read_as_their_scripts(twin):
    """Each notebook in examples/notebooks gives the verdict and findings that its script twin gives."""
    import nnwizard

    meta = nbformat.read(str(twin), 4).metadata["nnwizard"]
    expected = [e.strip() for e in meta.get("nnwizard-expect", "").split(",") if e.strip()]
    report = nnwizard.diagnose(script=twin, symptoms=[meta.get("nnwizard-symptom", "auto")])
    found = [h.id for h in report.findings]
    if expected:
        assert report.verdict == "problems-found" and found and found[0] in expected, found
    else:
        assert report.verdict == "healthy", (found, report.not_run)
    text = json.dumps(report.to_dict())
    assert "cell " in text or not expected or report.script["error"] is None


def test_shell_lines_run_in_watch_mode_only(tmp_path):
    nb = write(tmp_path, "said = !echo hello\n!touch made.txt")
    notes: list = []
    ns = load_notebook(nb).run(notes=notes)             # a diagnosis: skipped, with notes
    assert ns["said"] == [] and not (tmp_path / "made.txt").exists() and len(notes) == 2
    ns = load_notebook(nb).run(notes=[], shell=True)     # watch: the user's real run
    assert ns["said"] == ["hello"] and (tmp_path / "made.txt").exists()
