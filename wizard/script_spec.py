"""Which program ``--script`` names, checked without importing torch: a file (``train.py``), a dotted module
(run like ``python -m``), or a Jupyter notebook (``train.ipynb``, run cell by cell as a kernel would).

``load_script`` raises :class:`~nnwizard.errors.UsageError` (exit 2, one line) for what cannot run at all: no such
file, a syntax error, an empty or malformed notebook. It imports nothing heavy, so that ``nnwizard diagnose
--script missing.py`` answers at once.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nnwizard.errors import UsageError


@dataclass
class Script:
    spec: str            # as given
    path: Path | None    # the file that runs (a notebook: the .ipynb)
    module: str | None   # a dotted name run like `python -m`
    folder: Path
    notebook: Any = field(default=None, repr=False)   # nnwizard.notebook.Notebook for an .ipynb

    @property
    def files(self) -> list[Path]:
        """The Python sources the program runs from: the script, or a notebook's code cells (one file each, so that
        every location reads ``cell N, line M``)."""
        if self.notebook is not None:
            return list(self.notebook.files)
        return [self.path] if self.path else []


def load_script(spec: str, import_names: bool = True) -> Script | None:
    """Find and syntax-check the script; UsageError (exit 2, one line) when it cannot run at all. A dotted name is
    looked up as Python would find it (``import_names``: which imports its parent packages, running their code),
    else only as a file below the working folder (None when it is not one: the worker looks it up)."""
    path = Path(spec)
    if path.suffix.lower() == ".ipynb":
        from nnwizard.notebook.cells import load_notebook

        notebook = load_notebook(path, spec)
        return Script(spec, path.resolve(), None, notebook.folder, notebook)
    if path.suffix == ".py" or os.sep in spec or path.exists():
        if not path.is_file():
            raise UsageError(f"--script {spec}: no such file")
        _syntax_check(path, spec)
        return Script(spec, path.resolve(), None, path.resolve().parent)
    if not import_names:
        base = Path.cwd().joinpath(*spec.split("."))
        for candidate in (base.with_suffix(".py"), base / "__main__.py"):
            if candidate.is_file():
                _syntax_check(candidate, spec)
        return None
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        found = None
    finally:
        if added:
            sys.path.remove(cwd)
    if found is None or not found.origin or not found.origin.endswith(".py"):
        raise UsageError(f"--script {spec}: no such file, and no module of that name importable from {cwd}")
    origin = Path(found.origin)
    if origin.name == "__init__.py":
        main = origin.parent / "__main__.py"
        if not main.is_file():
            raise UsageError(f"--script {spec}: a package without __main__.py cannot be run")
        origin = main
    _syntax_check(origin, spec)
    return Script(spec, origin.resolve(), spec, Path.cwd())


def _syntax_check(path: Path, spec: str) -> None:
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--script {spec}: cannot read: {exc.strerror}") from None
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise UsageError(f"--script {spec}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:
        raise UsageError(f"--script {spec}: cannot be compiled: {exc}") from None
