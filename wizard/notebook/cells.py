"""A Jupyter notebook as a program: its code cells, in order, each turned into plain Python by IPython's own input
transformation (``%magics``, ``!shell``, ``x = !cmd``, ``%%cell`` magics) and written to a file of its own named
``cell N`` (N its 1-based position among all the notebook's cells, markdown included), so that everything that
reads a location (frames, tracebacks, the static reads of the source) finds the cell and its line.

Usage::

    nb = load_notebook(Path("train.ipynb"))      # UsageError (exit 2, one line): unreadable, malformed, empty, syntax
    nb.files                                       # [.../cell 2, .../cell 4, ...]: the code cells' Python
    nb.run(init_globals={...}, notes=[...])        # runs the cells as a kernel started in the notebook's folder would

A cell magic whose body is Python (``%%time``, ``%%capture``, ``%%nnwizard_watch`` ...) keeps its body as code on
its own lines (the magic line becomes a comment), so its lines and locations stay those of the cell; other cell
magics (``%%writefile``, ``%%bash``, ``%%html``) become one call padded to the cell's length.
"""

from __future__ import annotations

import atexit
import builtins
import json
import os
import shutil
import sys
import tempfile
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

from nnwizard.errors import UsageError

# cell magics whose body is Python that runs: kept as code, the magic line a comment
BODY_MAGICS = {"time", "timeit", "capture", "prun", "nnwizard_watch", "debug", "memit", "mprun", "px", "pypy"}
ACTIVE: "Notebook | None" = None   # the notebook whose cells are running (a watch bundle keeps their sources)
CELL_PREFIX = "cell "     # the materialized file of cell N is named "cell N": locations read "cell N:M", shown "cell N, line M"


@dataclass
class Cell:
    index: int       # 1-based position among all the notebook's cells
    source: str      # as written in the notebook
    python: str      # after IPython's input transformation, with the same number of lines where it can
    file: Path       # where ``python`` is written; code objects carry this file name
    code: types.CodeType | None = None


class Notebook:
    """The code cells of one notebook, materialized as files, and how to run them."""

    def __init__(self, path: Path, cells: list[Cell], folder: Path, total_cells: int):
        self.path, self.cells, self.folder, self.total_cells = path, cells, folder, total_cells
        self.sources_dir = cells[0].file.parent if cells else None

    @property
    def files(self) -> list[Path]:
        return [c.file for c in self.cells]

    def cell_of(self, filename: str) -> Cell | None:
        for c in self.cells:
            if filename == str(c.file):
                return c
        return None

    def sources(self) -> list[dict]:
        """The code cells as a bundle keeps them (so that replay rebuilds the classes defined in cells)."""
        return [{"cell": c.index, "source": c.source, "python": c.python} for c in self.cells]

    def run(self, init_globals: dict | None = None, notes: list | None = None, shell: bool = False) -> dict:
        """Run every code cell in order in one ``__main__`` namespace, with ``get_ipython()`` and ``display()``
        available and the working directory set to the notebook's folder (as a kernel started there has it); the
        working directory, ``__main__`` and the environment are put back afterwards. An exception leaves the cell
        that raised it (as "Run All" in Jupyter stops there). ``shell``: run ``!cmd`` lines and shell magics as a
        kernel would (watch: the user's real run); otherwise they are skipped with a note (a diagnosis). Returns the
        namespace."""
        from nnwizard.notebook.shell import NotebookShell, display

        main = types.ModuleType("__main__")
        ns = main.__dict__
        ns.update({"__builtins__": builtins, "__name__": "__main__", "display": display})
        ns.update(init_globals or {})
        ipython = NotebookShell(self, ns, notes if notes is not None else [], run_shell=shell)
        ns["get_ipython"] = ipython.get_ipython
        ns["In"], ns["Out"] = [""], {}
        global ACTIVE
        saved_main, saved_cwd, saved_env = sys.modules.get("__main__"), os.getcwd(), dict(os.environ)
        sys.modules["__main__"] = main
        os.chdir(self.folder)
        added = str(self.folder) not in sys.path
        if added:   # a kernel has its working folder on sys.path ('')
            sys.path.insert(0, str(self.folder))
        ACTIVE = self
        try:
            for cell in self.cells:
                ipython.current = cell
                ns["In"].append(cell.source)
                exec(cell.code, ns)  # noqa: S102 - the user's own notebook, run as their kernel would run it
        finally:
            ACTIVE = None
            ipython.current = None
            if added and str(self.folder) in sys.path:
                sys.path.remove(str(self.folder))
            os.chdir(saved_cwd)
            if saved_main is not None:
                sys.modules["__main__"] = saved_main
            for key in set(os.environ) - set(saved_env):
                os.environ.pop(key, None)
            os.environ.update(saved_env)
        return ns


def _transformer():
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        raise UsageError("reading a notebook needs IPython and nbformat: pip install 'nnwizard[notebook]'") from None
    return TransformerManager()


def python_source(source: str, transformer=None) -> str:
    """A cell's Python, line for line where IPython's transformation allows (see the module docstring)."""
    tm = transformer or _transformer()
    if not source.strip():
        return source
    lines = source.splitlines(keepends=True)
    first = lines[0].strip()
    if first.startswith("%%"):
        name = first[2:].split(None, 1)[0] if first[2:].strip() else ""
        if name in BODY_MAGICS:
            body = "".join(lines[1:])
            head = "# " + lines[0].rstrip("\r\n")
            names = [w for w in first.split()[1:] if not w.startswith("-")]
            if name == "capture" and names and names[0].isidentifier():   # `%%capture out`: `out` exists afterwards
                head = f"{names[0]} = get_ipython().captured()  " + head
            return head + "\n" + (_transform(tm, body) if body.strip() else body)
        out = _transform(tm, source)
        return out + "\n" * max(0, len(lines) - out.count("\n"))
    return _transform(tm, source)


def _transform(tm, source: str) -> str:
    try:
        return tm.transform_cell(source)
    except Exception:  # noqa: BLE001 - IPython could not read it: the plain text (compile() then says where)
        return source


def read_cells(path: Path, spec: str) -> tuple[list[tuple[int, str]], int, dict]:
    """``[(position, source)]`` of the code cells, the number of all cells and the notebook's ``nnwizard`` metadata;
    UsageError when the file is not a notebook nbformat can read."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--script {spec}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--script {spec}: not a notebook (not UTF-8 text)") from None
    if not text.strip():
        raise UsageError(f"--script {spec}: the notebook file is empty")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--script {spec}: not a notebook: invalid JSON at line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg}") from None
    if not isinstance(raw, dict) or ("cells" not in raw and "worksheets" not in raw):
        raise UsageError(f"--script {spec}: not a notebook: the JSON has no 'cells'")
    try:
        import nbformat
    except ImportError:
        raise UsageError("reading a notebook needs IPython and nbformat: pip install 'nnwizard[notebook]'") from None
    try:
        with warnings.catch_warnings():   # (an older notebook's missing cell ids: nbformat's warning, not the user's)
            warnings.simplefilter("ignore")
            nb = nbformat.reads(text, as_version=4)
    except Exception as exc:  # noqa: BLE001 - nbformat's many reader errors: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--script {spec}: not a notebook nbformat can read: {first}") from None
    cells = nb.get("cells") or []
    code = []
    for i, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        code.append((i, "".join(source) if isinstance(source, list) else str(source)))
    meta = (nb.get("metadata") or {}).get("nnwizard") or {}
    return code, len(cells), dict(meta) if isinstance(meta, dict) else {}


def load_notebook(path: Path, spec: str | None = None) -> Notebook:
    spec = spec or str(path)
    if not path.is_file():
        raise UsageError(f"--script {spec}: no such file")
    code, total, meta = read_cells(path, spec)
    # a notebook that %nnwizard_diagnose wrote from a live kernel's history: its cells are In[k], and it runs in the
    # kernel's working folder (metadata "nnwizard": {"cells": "In", "cwd": ...})
    kernel = meta.get("cells") == "In"
    workdir = Path(meta["cwd"]) if isinstance(meta.get("cwd"), str) and Path(meta["cwd"]).is_dir() else path.resolve().parent
    if not any(src.strip() for _, src in code):
        raise UsageError(f"--script {spec}: the notebook has no code to run ({total} cell{'s' if total != 1 else ''}, "
                         f"no code cell with code)")
    tm = _transformer()
    folder = Path(tempfile.mkdtemp(prefix="nnwizard-notebook-"))
    atexit.register(shutil.rmtree, folder, True)
    cells = []
    for index, source in code:
        python = python_source(source, tm)
        file = folder / (f"In[{index}]" if kernel else f"{CELL_PREFIX}{index}")
        file.write_text(python, encoding="utf-8")
        cell = Cell(index, source, python, file)
        try:
            cell.code = compile(python, str(file), "exec")
        except SyntaxError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise UsageError(f"--script {spec}: syntax error in cell {'In[%d]' % index if kernel else index}, line "
                             f"{exc.lineno}: {exc.msg}") from None
        except ValueError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise UsageError(f"--script {spec}: cell {index} cannot be compiled: {exc}") from None
        cells.append(cell)
    return Notebook(path.resolve(), cells, workdir, total)
